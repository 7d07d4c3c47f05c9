"""Logging set-up for the CLI and ``kubedevice.main()``: text or JSON lines on stderr.

Never runs on import.

Library modules only call ``logging.getLogger(__name__)`` and pass context through
``extra=`` (keys such as ``resource``, ``socket``, ``device_id``); the JSON formatter
emits every such key as a field.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

__all__ = ["JsonFormatter", "configure_logging"]

_STANDARD_ATTRS = frozenset(
    logging.LogRecord("", 0, "", 0, "", None, None).__dict__.keys() | {"message", "asctime"}
)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, plus every ``extra`` field."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD_ATTRS and not key.startswith("_"):
                out[key] = (
                    value if isinstance(value, str | int | float | bool | None) else str(value)
                )
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


class _TextFormatter(logging.Formatter):
    """``time level logger: message key=value ...`` with the ``extra`` fields appended."""

    def format(self, record: logging.LogRecord) -> str:
        base = super().format(record)
        extras = [
            f"{k}={v}"
            for k, v in record.__dict__.items()
            if k not in _STANDARD_ATTRS and not k.startswith("_")
        ]
        return f"{base} {' '.join(extras)}" if extras else base


def configure_logging(
    fmt: str = "text", level: str = "info", *, whole_process: bool = False
) -> None:
    """Send logs to stderr in ``fmt`` ("text" or "json") at ``level``.

    Args:
        fmt: ``text`` or ``json``.
        level: ``debug``, ``info``, ``warning`` or ``error``.
        whole_process: Configure the root logger, so every logger of the process (a
            plugin author's own included) is shown; otherwise only ``kubedevice.*``.
    """
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(_TextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    ours = logging.getLogger("kubedevice")
    if whole_process:
        root = logging.getLogger()
        root.handlers[:] = [handler]
        root.setLevel(level.upper())
        ours.handlers[:] = []
        ours.setLevel(logging.NOTSET)
        ours.propagate = True
        return
    ours.handlers[:] = [handler]
    ours.setLevel(level.upper())
    ours.propagate = False

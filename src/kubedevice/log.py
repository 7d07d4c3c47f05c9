"""Logging set-up for the CLI and ``kubedevice.main()``: text or JSON lines on stderr.

Never runs on import.

Library modules only call ``logging.getLogger(__name__)`` and pass context through
``extra=`` (keys such as ``resource``, ``socket``, ``device_id``); the JSON formatter
emits every such key as a field.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import argparse

__all__ = [
    "ENV_LOG_FORMAT",
    "ENV_LOG_LEVEL",
    "JsonFormatter",
    "add_log_arguments",
    "configure_logging",
    "configure_logging_from_args",
]

#: Environment variables the standard flags default to.
ENV_LOG_LEVEL = "KUBEDEVICE_LOG_LEVEL"
ENV_LOG_FORMAT = "KUBEDEVICE_LOG_FORMAT"
_LEVELS = ("debug", "info", "warning", "error")
_FORMATS = ("text", "json")


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


def add_log_arguments(parser: argparse.ArgumentParser) -> None:
    """``--log-level`` and ``--log-format``, defaulting to ``$KUBEDEVICE_LOG_LEVEL`` and
    ``$KUBEDEVICE_LOG_FORMAT``: every daemon's parser has them (the SDK's and the DRA kit's);
    :func:`configure_logging_from_args` applies them.
    """
    parser.add_argument(
        "--log-level",
        default=os.environ.get(ENV_LOG_LEVEL) or "info",
        choices=_LEVELS,
        help=f"Minimum level of log lines.  [env var: {ENV_LOG_LEVEL}; default: info]",
    )
    parser.add_argument(
        "--log-format",
        default=os.environ.get(ENV_LOG_FORMAT) or "text",
        choices=_FORMATS,
        help=f"Log line format.  [env var: {ENV_LOG_FORMAT}; default: text]",
    )


def configure_logging_from_args(args: argparse.Namespace) -> bool:
    """Set up logging from :func:`add_log_arguments`' flags; ``False`` (one line said on
    stderr) when a value from the environment is not one of the choices."""
    for value, allowed, env in (
        (args.log_level, _LEVELS, ENV_LOG_LEVEL),
        (args.log_format, _FORMATS, ENV_LOG_FORMAT),
    ):
        if value not in allowed:  # a default from the environment is not checked by argparse
            print(f"error: {env}={value!r} is not one of {', '.join(allowed)}", file=sys.stderr)
            return False
    configure_logging(fmt=args.log_format, level=args.log_level, whole_process=True)
    return True

"""Control messages of the fake NVML: their checks, the datagram socket, and sending one.

A message is checked completely (op, uuid, xid, every sample value's type) before it acts:
a malformed one is refused with one log line and never reaches the event thread or the
metrics.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import socket
import stat
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from kubedevice.errors import ConfigError
from kubedevice.nvidia.backend import GpuSample, ProcessSample
from kubedevice.nvidia.fake.machine import FakeMachine

__all__ = ["CONTROL_ENV", "bind_control_socket", "drain_control", "send_control"]

log = logging.getLogger("kubedevice.nvidia.fake")

CONTROL_ENV = "KUBEDEVICE_FAKE_NVML_CONTROL"
_CONTROL_OPS = ("xid", "ecc", "lost", "recover", "sample")
_SAMPLE_FIELDS = frozenset(f.name for f in dataclasses.fields(GpuSample))


def _validate_message(machine: FakeMachine, message: Mapping[str, Any]) -> None:
    """Check a control message; ConfigError (one line) when it is malformed."""
    if not isinstance(message, Mapping):
        raise ConfigError("control message: not a JSON object")
    op = message.get("op")
    if not isinstance(op, str) or op not in _CONTROL_OPS:
        raise ConfigError(
            f"control message: op: {_short(op)} is not one of {', '.join(_CONTROL_OPS)}"
        )
    uuid = message.get("uuid")
    known = {g.info.uuid for g in machine.gpus} | {m.uuid for g in machine.gpus for m in g.mig}
    if not isinstance(uuid, str) or uuid not in known:
        raise ConfigError(f"control message: uuid: {_short(uuid)} is not a GPU or MIG device here")
    xid = message.get("xid")
    if op == "xid" and (isinstance(xid, bool) or not isinstance(xid, int)):
        raise ConfigError("control message: xid: an integer is required for op 'xid'")
    if op in ("lost", "recover", "sample") and not any(g.info.uuid == uuid for g in machine.gpus):
        raise ConfigError(f"control message: uuid: op {op!r} needs a GPU UUID, not a MIG device")
    if op == "sample":
        values = message.get("values")
        if not isinstance(values, Mapping):
            raise ConfigError("control message: values: an object is required for op 'sample'")
        try:
            _check_sample_values(values)
        except ConfigError as exc:
            raise ConfigError(f"control message: values: {exc}") from None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _is_int(value: Any, *, low: int | None = 0) -> bool:
    return (
        isinstance(value, int)
        and not isinstance(value, bool)
        and (low is None or value >= low)
        and value < 2**63
    )


def _check_sample_values(values: Mapping[str, Any]) -> None:
    """Check ``set_sample`` values: GpuSample fields with the types a reading has.

    Raises:
        ConfigError: an unknown field or a value of the wrong type, named (one line).
    """
    for name, value in values.items():
        if not isinstance(name, str) or name not in _SAMPLE_FIELDS:
            raise ConfigError(f"unknown field {_short(name)}")
        if value is None:
            continue
        if name in ("remapped_rows_pending", "remapped_rows_failure"):
            ok = isinstance(value, bool)
        elif name == "processes":
            ok = isinstance(value, list | tuple) and all(
                isinstance(p, ProcessSample)
                or (
                    isinstance(p, Mapping)
                    and set(p) <= {"pid", "used_memory"}
                    and _is_int(p.get("pid"))
                    and (p.get("used_memory") is None or _is_int(p.get("used_memory")))
                )
                for p in value
            )
        elif name == "temperature_c":
            ok = _is_int(value, low=None) and abs(value) < 10_000
        else:
            ok = _is_int(value)
        if not ok:
            want = {
                "processes": "a list of {pid, used_memory} objects",
                "remapped_rows_pending": "true, false or null",
                "remapped_rows_failure": "true, false or null",
            }.get(name, "a non-negative integer or null")
            raise ConfigError(f"{name}: expected {want} (got {_short(value)})")


def send_control(path: str | Path, message: Mapping[str, Any]) -> None:
    """Send one control message to a running fake (e.g. ``{"op": "xid", "uuid": U, "xid": 79}``).

    Raises:
        OSError: nothing listens on ``path``.
    """
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.sendto(json.dumps(dict(message)).encode(), str(path))


def bind_control_socket(path: Path) -> socket.socket:
    """Bind the control datagram socket at ``path`` (mode 0600), replacing a stale socket.

    Raises:
        ConfigError: it cannot be bound.
    """
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISSOCK(path.lstat().st_mode):
            path.unlink()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
    old = os.umask(0o177)
    try:
        sock.bind(str(path))
    except OSError as e:
        sock.close()
        raise ConfigError(f"fake NVML control socket {path}: cannot bind: {e.strerror}") from e
    finally:
        os.umask(old)
    os.chmod(path, 0o600)
    sock.setblocking(False)
    return sock


def drain_control(ctl: socket.socket, apply: Callable[[Any], None]) -> None:
    """Read every waiting datagram and ``apply`` each; a bad one is one log line."""
    while True:
        try:
            data = ctl.recv(65536)
        except (BlockingIOError, OSError):
            return
        try:
            message = json.loads(data)
            apply(message)
        except Exception as e:  # a bad message never ends the event thread
            log.warning(
                "fake NVML: control message ignored: %s",
                str(e).splitlines()[0][:200] if str(e) else type(e).__name__,
                extra={"socket": str(ctl)},
            )

"""One instance of a DRA driver per node: a lock file held (``flock(2)``) for the process life.

Two instances of one driver on a node (two Helm releases, or a DaemonSet rolling over)
would take each other's sockets and overwrite each other's checkpoint. The first takes an
exclusive lock on ``<plugin dir>/driver.lock`` and writes who it is into the file; a
second one finds it held and refuses to start, naming the file and the holder. The lock
goes with the process (exit, crash, SIGKILL: the kernel releases it; the file stays,
harmless), and is not inherited by an ``exec``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from pathlib import Path
from typing import Any, Final

from kubedevice.errors import InstanceLockError

__all__ = ["LOCK_FILE", "InstanceLock"]

#: The lock file's name in the driver's plugin dir (``<kubelet dir>/plugins/<driver>/``).
LOCK_FILE: Final = "driver.lock"


class InstanceLock:
    """An exclusive ``flock`` on ``path``; :meth:`acquire` takes it or says who holds it.

    Args:
        path: The lock file (created if missing, mode 0600).
        what: What the lock guards, for the error ("DRA driver gpu.example.com").
    """

    def __init__(self, path: Path, what: str) -> None:
        self.path = path
        self.what = what
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        """Whether this process holds the lock."""
        return self._fd is not None

    def acquire(self) -> None:
        """Take the lock and write the holder's identity into the file.

        Raises:
            InstanceLockError: Another process holds it (the error names the file and the
                holder), or the file cannot be opened.
        """
        if self._fd is not None:
            return
        try:
            self.path.parent.mkdir(mode=0o750, parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise InstanceLockError(f"cannot open the lock file {self.path}: {exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _describe(_read(fd))
            os.close(fd)
            raise InstanceLockError(
                f"another instance of {self.what} is running on this node: it holds "
                f"{self.path} ({holder}); refusing to start"
            ) from None
        except OSError as exc:
            os.close(fd)
            raise InstanceLockError(f"cannot lock {self.path}: {exc}") from None
        self._fd = fd
        record = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        with contextlib.suppress(OSError):  # who holds it is for the message only
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)

    def release(self) -> None:
        """Release the lock (the file stays). Idempotent."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


def _read(fd: int) -> dict[str, Any]:
    try:
        data = os.pread(fd, 4096, 0)
        record = json.loads(data)
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def _describe(record: dict[str, Any]) -> str:
    if not record:
        return "holder unknown"
    parts = [f"pid {record.get('pid', '?')}", f"host/pod {record.get('host', '?')}"]
    if record.get("started"):
        parts.append(f"since {record['started']}")
    return ", ".join(parts)

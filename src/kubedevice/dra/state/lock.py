"""The node's locks of a DRA driver (``flock(2)`` on files in its plugin dir).

:class:`InstanceLock` (``driver.lock``, for the process life): a driver run without a pod
UID serves fixed socket names, so two such instances on a node would take each other's
sockets. The first takes an exclusive lock and writes who it is into the file; a second
finds it held and refuses to start, naming the file and the holder. Instances run with a pod
UID hold it shared: any number of them side by side, none beside one without a pod UID.

:class:`ClaimsLock` (``claims.lock``, around each batch of claim work): instances run with a
pod UID (a DaemonSet rolling with ``maxSurge``) serve sockets of their own and run side by
side; the kubelet may call either. Every ``NodePrepareResources`` and
``NodeUnprepareResources`` call, and the start-up restore, holds this lock from before it
reads the checkpoint until its last checkpoint write is done (the prepare and unprepare
hooks included). So nothing is ever half-prepared by a live instance while another holds
the lock: a claim the checkpoint says is "preparing" when an instance takes the lock was
cut short by an instance that died (or was stopped) in its hook, and is undone; MIG devices
or time slices no checkpointed claim owns are orphans. Calls of one process share the lock
(the first takes it, the last lets it go), so one instance keeps its own concurrency.

:class:`PodLock` (``driver-<pod UID>.lock``, for the process life, beside the shared
``driver.lock``): two instances run with the same pod UID would serve the same socket names,
the second replacing the first's live sockets. The first takes it exclusive; a second finds
it held and refuses to start, naming the file and the holder. The file goes when its holder
lets go (one per pod UID would otherwise stay behind each rolling upgrade).

The locks go with the process (exit, crash, SIGKILL: the kernel releases them; the files
stay, harmless), and neither is inherited by an ``exec``. Both files are opened only when
they are regular files (never through a symlink, never a FIFO or device node put in their
place): a driver run as root writes who holds them into them.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, Final

from kubedevice._regular_file import NotRegularFileError, open_regular
from kubedevice.dra.state.threads import in_thread
from kubedevice.errors import InstanceLockError

__all__ = [
    "CLAIMS_LOCK_FILE",
    "LOCK_FILE",
    "ClaimsLock",
    "InstanceLock",
    "PodLock",
    "pod_lock_file",
    "refusal",
]

log = logging.getLogger(__name__)

#: The lock file's name in the driver's plugin dir (``<kubelet dir>/plugins/<driver>/``).
LOCK_FILE: Final = "driver.lock"
#: The claims lock's file in the plugin dir, taken around each batch of claim work.
CLAIMS_LOCK_FILE: Final = "claims.lock"


def pod_lock_file(pod_uid: str) -> str:
    """The name of the lock file an instance run with ``pod_uid`` holds (in the plugin dir)."""
    return f"driver-{pod_uid}.lock"


class InstanceLock:
    """A ``flock`` on ``path`` for the process life; :meth:`acquire` takes it or says why not.

    Exclusive for a driver run without a pod UID (one instance per node), shared for the
    instances of a rolling upgrade (run with pod UIDs): they run side by side, but never
    beside an instance without a pod UID, which does not take the claims lock (an older
    version, or one run by hand), in either order.

    Args:
        path: The lock file (created if missing, mode 0600).
        what: What the lock guards, for the error ("DRA driver gpu.example.com").
        shared: Take it shared (an instance with a pod UID).
    """

    def __init__(self, path: Path, what: str, *, shared: bool = False) -> None:
        self.path = path
        self.what = what
        self.shared = shared
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
        fd = _open_lock(self.path)
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if self.shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _describe(_read(fd))
            by_upgrade = not self.shared and _can_share(fd)
            os.close(fd)
            if by_upgrade:
                raise InstanceLockError(
                    f"instances of {self.what} with pod UIDs (a DaemonSet rolling with "
                    f"maxSurge) are running on this node: they hold {self.path}; refusing to "
                    "start beside them without a pod UID (set POD_UID or --pod-uid)"
                ) from None
            if self.shared:
                raise InstanceLockError(
                    f"an instance of {self.what} without a pod UID (an older version, or one "
                    f"run by hand) is running on this node: it holds {self.path} ({holder}); "
                    "refusing to start beside it, as it does not take the claims lock (roll "
                    "from it with maxSurge: 0)"
                ) from None
            raise InstanceLockError(
                f"another instance of {self.what} is running on this node: it holds "
                f"{self.path} ({holder}); refusing to start"
            ) from None
        except OSError as exc:
            os.close(fd)
            raise InstanceLockError(f"cannot lock {self.path}: {exc}") from None
        self._fd = fd
        if not self.shared:  # several hold it shared: an exclusive holder alone says who
            _write_holder(fd)

    def release(self) -> None:
        """Release the lock (the file stays). Idempotent."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


class PodLock:
    """An exclusive ``flock`` on ``path`` for the process life, for one pod UID's instance:
    a second instance run with the same pod UID is refused (see the module's doc).

    Args:
        path: The lock file (``plugins/<driver>/driver-<pod UID>.lock``; created if missing,
            removed by :meth:`release`).
        what: What the lock guards, for the error ("DRA driver gpu.example.com").
        pod_uid: The pod UID, for the error.
    """

    def __init__(self, path: Path, what: str, pod_uid: str) -> None:
        self.path = path
        self.what = what
        self.pod_uid = pod_uid
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
        for _ in range(8):  # again only when a holder letting go removed the file meanwhile
            fd = _open_lock(self.path)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _describe(_read(fd))
                os.close(fd)
                raise InstanceLockError(
                    f"another instance of {self.what} with pod UID {self.pod_uid} is running "
                    f"on this node: it holds {self.path} ({holder}); refusing to start, as "
                    "it would take that instance's sockets"
                ) from None
            except OSError as exc:
                os.close(fd)
                raise InstanceLockError(f"cannot lock {self.path}: {exc}") from None
            if _is_at(fd, self.path):
                self._fd = fd
                _write_holder(fd)
                return
            os.close(fd)
        raise InstanceLockError(f"cannot lock {self.path}: it keeps being replaced")

    def release(self) -> None:
        """Release the lock and remove its file (only while it is still ours). Idempotent."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        with contextlib.suppress(OSError):
            if _is_at(fd, self.path):  # removed while held: a taker then opens a new file
                self.path.unlink()
        os.close(fd)


class ClaimsLock:
    """The node's claims lock, shared by the calls of this process (see the module's doc).

    Args:
        path: The lock file (created if missing, mode 0600).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None
        self._holders = 0
        self._made = False  # the plugin dir exists
        self._gate = asyncio.Lock()
        self._kept = False
        #: Times the lock was found held by another process (it waited).
        self.waits = 0

    def keep(self) -> None:
        """Never let the lock go while this process lives (once held, it stays held): for
        a hook still running in a thread past the stop grace, which no other instance may
        meet. The kernel releases it with the process."""
        self._kept = True

    @contextlib.asynccontextmanager
    async def hold(
        self, on_taken: Callable[[], Awaitable[None]] | None = None
    ) -> AsyncIterator[None]:
        """Hold the lock for the block; ``on_taken`` runs each time this process takes it
        from the kernel (not when a call of this process already holds it).

        Raises:
            OSError: The lock file cannot be opened or locked.
        """
        async with self._gate:
            if self._holders == 0:
                self._fd = await self._take()
                if on_taken is not None:
                    try:
                        await on_taken()
                    except BaseException:
                        self._let_go()
                        raise
            self._holders += 1
        try:
            yield
        finally:
            self._holders -= 1
            if self._holders == 0:
                self._let_go()

    async def _take(self) -> int:
        if not self._made:
            self.path.parent.mkdir(mode=0o750, parents=True, exist_ok=True)
            self._made = True
        fd = _open(self.path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.waits += 1
            log.debug("waiting for %s (%s)", self.path, _describe(_read(fd)))
            # a daemon thread: one still waiting at exit does not hold the process
            taking = asyncio.ensure_future(in_thread(fcntl.flock, fd, fcntl.LOCK_EX))
            try:
                await asyncio.shield(taking)
            except asyncio.CancelledError:
                # the thread still waits: closing the fd once it is done lets the lock go
                taking.add_done_callback(lambda _f: os.close(fd))
                raise
            except OSError:
                os.close(fd)
                raise
        except OSError:
            os.close(fd)
            raise
        with contextlib.suppress(OSError):  # who holds it, for the messages (fixed width)
            os.pwrite(fd, f'{{"pid": {os.getpid():>10}}}\n'.encode(), 0)
        return fd

    def _let_go(self) -> None:
        if self._kept:
            return
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


def refusal(path: Path, exc: NotRegularFileError) -> str:
    """The one line that says a lock file was refused (a symlink, a FIFO...)."""
    return f"the lock file {path} {exc.strerror}; refusing to use it (remove it)"


def _open(path: Path) -> int:
    """The lock file, created if missing (mode 0600); refused unless a regular file.

    Raises:
        NotRegularFileError: A symlink (never followed), FIFO, socket, device or directory.
        OSError: It cannot be opened.
    """
    return open_regular(path, os.O_RDWR | os.O_CREAT, 0o600)


def _open_lock(path: Path) -> int:
    """:func:`_open` for a lock held for the process life, its directory made first.

    Raises:
        InstanceLockError: It is not a regular file, or cannot be opened (one line).
    """
    try:
        path.parent.mkdir(mode=0o750, parents=True, exist_ok=True)
        return _open(path)
    except NotRegularFileError as exc:
        raise InstanceLockError(refusal(path, exc)) from None
    except OSError as exc:
        raise InstanceLockError(f"cannot open the lock file {path}: {exc}") from None


def _write_holder(fd: int) -> None:
    """Write who holds the lock into its file (for the messages only)."""
    record = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)


def _is_at(fd: int, path: Path) -> bool:
    """Whether the open file ``fd`` is still the file at ``path`` (not removed, not replaced)."""
    try:
        st, at = os.fstat(fd), os.lstat(path)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == (at.st_dev, at.st_ino)


def _can_share(fd: int) -> bool:
    """Whether the lock's holders hold it shared (taking it shared succeeds; let go)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return False
    fcntl.flock(fd, fcntl.LOCK_UN)
    return True


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

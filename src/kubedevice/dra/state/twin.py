"""Replacing a small file by swapping in its twin: no inode made or freed per write.

A file replaced by ``rename`` over it costs the filesystem a new inode and the old one's
release on every write (0.5-2 ms on ext4 under load, most of a claim call's time). A
:class:`TwinFile` keeps a second file beside it (``.<name>.twin``, the previous content):
a write goes into the twin (``pwrite`` over its own blocks, padded to whole 4 KiB blocks so
that its size rarely changes), optionally ``fdatasync`` (data only: no journal commit while
the size stays the same), then the two names are exchanged atomically
(``renameat2(RENAME_EXCHANGE)``: tens of microseconds). A reader of ``path`` sees the old
file or the new one, whole, as with a rename.

Crash safety: a process killed mid-write leaves ``path`` as it was (only the twin is being
written). A power loss may keep the exchange but not the twin's unsynced data: ``path``
then reads as a broken file (the twin holds the content before it, whole: it was the file
under ``path`` until this write, and the loader starts from it) or, where none of the new
blocks reached the disk, as the whole version two writes back, the twin then being the
newer: a save that must survive a power loss is synced before the exchange, and the
checkpoint numbers its versions so that its loader takes a newer twin
(:mod:`kubedevice.dra.state.checkpoint`).
Where the exchange is not supported (no ``renameat2``, a filesystem without it), a write
is a plain rename over ``path`` (the twin is made again next time).

Padding is spaces before the final newline: a JSON reader takes the file as before.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import stat
from pathlib import Path
from typing import Final

__all__ = ["BLOCK", "TwinFile"]

#: Writes are padded to a whole number of these.
BLOCK: Final = 4096
_AT_FDCWD: Final = -100
_RENAME_EXCHANGE: Final = 2
_OPEN_FLAGS: Final = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def _renameat2() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):  # not glibc >= 2.28: plain renames
        return None
    fn.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint)
    fn.restype = ctypes.c_int
    return fn


_RENAMEAT2 = _renameat2()


class TwinFile:
    """``path`` written through its twin (see the module); ``mode`` for both files."""

    def __init__(self, path: Path, mode: int) -> None:
        self.path = path
        self.twin = path.with_name(f".{path.name}.twin")
        self.mode = mode
        self._exchange = _RENAMEAT2 is not None

    def write(self, data: bytes, *, sync: bool) -> None:
        """Put ``data`` (padded) under ``path``; with ``sync`` its data is on disk first.

        Raises:
            OSError: It cannot be written.
        """
        if data.endswith(b"\n"):
            data = data[:-1] + b" " * (-len(data) % BLOCK) + b"\n"
        fd = self._open_twin()
        try:
            os.pwrite(fd, data, 0)
            if os.fstat(fd).st_size != len(data):
                os.ftruncate(fd, len(data))
            if sync:
                os.fdatasync(fd)
        finally:
            os.close(fd)
        if self._exchange and self._swap():
            return
        os.replace(self.twin, self.path)

    def _swap(self) -> bool:
        """Exchange the two names (``False``: it cannot be done here; rename instead)."""
        assert _RENAMEAT2 is not None
        twin, path = os.fsencode(self.twin), os.fsencode(self.path)
        if _RENAMEAT2(_AT_FDCWD, twin, _AT_FDCWD, path, _RENAME_EXCHANGE) == 0:
            return True
        error = ctypes.get_errno()
        if error == errno.ENOENT:  # no file at path yet: the twin becomes it
            return False
        if error in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EXDEV):
            self._exchange = False  # not on this filesystem: renames from now on
            return False
        raise OSError(error, os.strerror(error), str(self.path))

    def _open_twin(self) -> int:
        """The twin opened for writing: made when missing; anything there that is not a
        plain file of ours (a symlink, a FIFO, a hard link) removed and made again."""
        try:
            fd = os.open(self.twin, _OPEN_FLAGS, self.mode)
        except OSError as exc:
            if exc.errno not in (errno.ELOOP, errno.ENXIO, errno.EISDIR, errno.EACCES):
                raise
            fd = -1
        if fd >= 0:
            st = os.fstat(fd)
            if stat.S_ISREG(st.st_mode) and st.st_nlink == 1:
                if stat.S_IMODE(st.st_mode) != self.mode:
                    os.fchmod(fd, self.mode)
                return fd
            os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.twin)
        fd = os.open(self.twin, _OPEN_FLAGS | os.O_EXCL, self.mode)
        os.fchmod(fd, self.mode)  # whatever the umask
        return fd

"""Open state files only when they are regular files: never block on a planted FIFO.

A FIFO, socket or device node put where a daemon reads or writes a file (a checkpoint, a
journal) must not hang it: opening a FIFO blocks until its other end opens, and a device
node can do anything on open. The path is ``lstat``-ed first (nothing but a regular file is
ever opened), then opened with ``O_NONBLOCK | O_NOFOLLOW`` and ``fstat``-ed again, so that a
file swapped in between is caught too. What is refused raises :class:`NotRegularFileError`,
an :class:`OSError` like the others a read can raise, so callers that handle ``OSError``
already handle it; its ``strerror`` says what the path is.

Shared by the kubelet side and ``inspect`` (it imports neither).
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

__all__ = ["NotRegularFileError", "file_kind", "open_regular", "read_regular"]


class NotRegularFileError(OSError):
    """The path is a FIFO, socket, device node, directory or symlink, not a regular file."""


def file_kind(mode: int) -> str:
    """What an ``st_mode`` is, in words ("a FIFO", "a socket", ...)."""
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device node"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    return "not a regular file"


def _refuse(path: Path, mode: int) -> NotRegularFileError:
    kind = file_kind(mode)
    what = kind if kind.startswith("not ") else f"{kind}, not a regular file"
    return NotRegularFileError(errno.EINVAL, what, str(path))


def open_regular(path: Path, flags: int, mode: int = 0o600) -> int:
    """``os.open`` for a regular file only (``O_CREAT`` in ``flags`` may create one).

    Raises:
        NotRegularFileError: ``path`` exists and is not a regular file (nothing was opened).
        OSError: Any other reason it cannot be opened.
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        if not flags & os.O_CREAT:
            raise
    else:
        if not stat.S_ISREG(st.st_mode):
            raise _refuse(path, st.st_mode)
    fd = os.open(path, flags | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _refuse(path, st.st_mode)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular(path: Path, limit: int) -> bytes:
    """The first ``limit + 1`` bytes at most of the regular file ``path`` (callers compare).

    Raises:
        NotRegularFileError: ``path`` is not a regular file.
        OSError: It cannot be read (missing, permission denied, a symlink: ``ELOOP``).
    """
    fd = open_regular(path, os.O_RDONLY)
    try:
        chunks: list[bytes] = []
        left = limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)

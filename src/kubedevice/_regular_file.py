"""Open and read files only when they are regular files: never block on a planted FIFO.

A FIFO, socket or device node put where a daemon reads or writes a file (a checkpoint, a
journal, a config, a sysfs attribute, a CDI spec) must not hang it: opening a FIFO blocks
until its other end opens, and a device node can do anything on open or read. The path is
``lstat``-ed first (``stat``-ed when symlinks are followed: nothing but a regular file is
ever opened), then opened with ``O_NONBLOCK`` (and ``O_NOFOLLOW`` unless symlinks are
followed) and ``fstat``-ed again, so that a file swapped in between is caught too.

What is refused raises :class:`NotRegularFileError`, an :class:`OSError` like the others a
read can raise, so callers that handle ``OSError`` already handle it. Its ``strerror`` says
what the path is (``"is a FIFO, not a regular file"``: "PATH " before it makes the one-line
message), its ``kind`` the same in two words (``"a FIFO"``); its ``errno`` is ``EISDIR`` for a
directory, ``ELOOP`` for a symlink not followed and ``EINVAL`` otherwise.

A leaf module (standard library only): the plugin side, the kubelet side and ``inspect`` all
read files through it.
"""

from __future__ import annotations

import errno
import os
import stat

__all__ = ["NotRegularFileError", "file_kind", "open_regular", "read_regular"]

_KINDS = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISLNK, "a symbolic link"),
)


class NotRegularFileError(OSError):
    """The path is a FIFO, socket, device node, directory or symlink, not a regular file.

    Attributes:
        kind: What it is, in words (``"a FIFO"``).
    """

    kind: str


def file_kind(mode: int) -> str:
    """What an ``st_mode`` is, in words ("a FIFO", "a socket", ...)."""
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _refuse(path: str | os.PathLike[str], mode: int) -> NotRegularFileError:
    kind = file_kind(mode)
    what = f"is {kind}" if kind.startswith("not ") else f"is {kind}, not a regular file"
    code = errno.EISDIR if stat.S_ISDIR(mode) else errno.ELOOP if stat.S_ISLNK(mode) else 0
    exc = NotRegularFileError(code or errno.EINVAL, what, str(path))
    exc.kind = kind
    return exc


def open_regular(
    path: str | os.PathLike[str], flags: int, mode: int = 0o600, *, follow_symlinks: bool = False
) -> int:
    """``os.open`` for a regular file only (``O_CREAT`` in ``flags`` may create one).

    Args:
        path: The file.
        flags: ``os.O_*`` flags; ``O_NONBLOCK`` is added for the open and taken off after.
        mode: The mode of a file ``O_CREAT`` creates.
        follow_symlinks: Open what a symlink at ``path`` points to (else it is refused).

    Returns:
        The open descriptor, blocking, close-on-exec.

    Raises:
        NotRegularFileError: ``path`` exists and is not a regular file (nothing was opened).
        OSError: Any other reason it cannot be opened.
    """
    try:
        st = os.stat(path) if follow_symlinks else os.lstat(path)
    except FileNotFoundError:
        if not flags & os.O_CREAT:
            raise
    else:
        if not stat.S_ISREG(st.st_mode):
            raise _refuse(path, st.st_mode)
    nofollow = 0 if follow_symlinks else os.O_NOFOLLOW
    try:
        fd = os.open(path, flags | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC | nofollow, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow_symlinks:  # swapped for a symlink
            raise _refuse(path, stat.S_IFLNK) from None
        if exc.errno == errno.ENXIO:  # swapped for a socket
            raise _refuse(path, stat.S_IFSOCK) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _refuse(path, st.st_mode)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular(
    path: str | os.PathLike[str], limit: int | None = None, *, follow_symlinks: bool = False
) -> bytes:
    """The content of the regular file ``path``: all of it, or its first ``limit + 1`` bytes
    at most (so that a caller tells a file over its ``limit`` by the length).

    Raises:
        NotRegularFileError: ``path`` is not a regular file (or a symlink not followed).
        OSError: It cannot be read (missing, permission denied).
    """
    fd = open_regular(path, os.O_RDONLY, follow_symlinks=follow_symlinks)
    try:
        chunks: list[bytes] = []
        left = None if limit is None else limit + 1
        while left is None or left > 0:
            chunk = os.read(fd, 1 << 20 if left is None else min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            if left is not None:
                left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)

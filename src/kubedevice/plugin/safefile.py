"""Read a file that someone else may have replaced with a FIFO, a socket or a device node.

Opening a FIFO for reading blocks until a writer comes (forever, if none does), and reading
a character device may never end. :func:`read_regular` opens without blocking, checks on
the open descriptor that it is a regular file, and only then reads it; anything else is an
:class:`OSError` whose ``strerror`` says what was found there, so callers that already
report "cannot read: ..." in one line need no new case.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path, PurePosixPath

from kubedevice.errors import ConfigError

__all__ = ["inside", "read_regular"]

_KINDS = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISDIR, "a directory"),
)


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def read_regular(path: str | os.PathLike[str]) -> bytes:
    """The content of the regular file at ``path`` (symlinks are followed).

    Args:
        path: The file.

    Returns:
        Its bytes.

    Raises:
        OSError: It cannot be opened or read, or it is not a regular file (``EINVAL``,
            with ``strerror`` such as ``"is a FIFO, not a regular file"``); a FIFO
            without a writer never blocks this.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # a socket (or a FIFO opened for writing)
            raise OSError(errno.EINVAL, "is a socket, not a regular file", str(path)) from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise OSError(errno.EINVAL, f"is {_kind(mode)}, not a regular file", str(path))
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def inside(root: Path, relative: str, what: str = "path") -> Path:
    """``root / relative``, refused when ``relative`` could leave ``root``.

    A lexical check, for paths that come from data (a fake machine's device nodes, a PCI
    bus ID): no ``..`` component, not absolute, not empty.

    Args:
        root: The directory everything must stay under.
        relative: The path below it.
        what: What the path is, for the message.

    Returns:
        The joined path.

    Raises:
        ConfigError: ``relative`` is empty, absolute or has a ``..`` component.
    """
    parts = PurePosixPath(relative).parts
    if not parts or relative.startswith("/") or ".." in parts or "\0" in relative:
        raise ConfigError(f"{what} {relative!r} would leave {root}; refused")
    return root.joinpath(*parts)

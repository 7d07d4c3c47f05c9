"""Publishing a file a plugin owns (a CDI spec, the NFD feature file): atomic, no-follow.

:func:`replace_if_changed` writes a hidden temporary file in the target's directory and
renames it over the target, so a reader (the container runtime, ``nfd-worker``) never sees
a partial file, and a symlink at the target is replaced, never followed. It writes nothing
when the target already holds the text. A FIFO, socket or device node planted at the target
never blocks it: files are opened ``O_NONBLOCK | O_NOFOLLOW`` and must be regular.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
import tempfile
from pathlib import Path

__all__ = ["NotARegularFileError", "read_small_file", "replace_if_changed"]

log = logging.getLogger(__name__)


class NotARegularFileError(OSError):
    """A FIFO, socket, device node or directory where a regular file was expected."""


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISLNK, "a symlink"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def read_small_file(path: Path, limit: int) -> bytes:
    """Up to ``limit`` bytes of the regular file at ``path``, never blocking nor following.

    Opened with ``O_NONBLOCK | O_NOFOLLOW``, so a FIFO planted there cannot block us and a
    symlink is not followed; anything but a regular file is refused.

    Raises:
        FileNotFoundError: Nothing is there.
        NotARegularFileError: A FIFO, socket, device node, directory or symlink is there.
        OSError: It cannot be read.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # O_NOFOLLOW met a symlink
            raise NotARegularFileError(errno.ELOOP, "a symlink", str(path)) from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotARegularFileError(errno.EINVAL, _kind(mode), str(path))
    except BaseException:
        os.close(fd)
        raise
    with os.fdopen(fd, "rb") as f:
        return f.read(limit)


def replace_if_changed(directory: Path, name: str, text: str) -> bool:
    """Make ``directory/name`` hold ``text`` (mode 0644); ``False`` when it already did.

    The directory is created (0755) if missing. Whatever is at the target and is not a
    regular file (a symlink, a FIFO, a socket, a device node) is replaced, with one
    warning line, never opened: only the directory entry goes.

    Raises:
        OSError: The directory cannot be created or written, or a directory is at the
            target.
    """
    data = text.encode()
    target = directory / name
    directory.mkdir(mode=0o755, parents=True, exist_ok=True)
    try:
        if read_small_file(target, len(data) + 1) == data:
            return False
    except NotARegularFileError as exc:
        if exc.strerror == "a directory":
            raise IsADirectoryError(
                errno.EISDIR, "a directory is in the way", str(target)
            ) from None
        log.warning("%s is %s, not a file this plugin wrote; replacing it", target, exc.strerror)
    except OSError:
        pass  # missing or unreadable: written below
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
    try:
        os.fchmod(fd, 0o644)  # world-readable whatever the umask
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return True

"""Publishing a file a plugin owns (a CDI spec, the NFD feature file, a DRA checkpoint):
atomic, no-follow.

:func:`write_atomically` writes a hidden temporary file in the target's directory and
renames it over the target, so a reader (the container runtime, ``nfd-worker``) never sees
a partial file, and a symlink at the target is replaced, never followed.
:func:`replace_if_changed` writes nothing when the target already holds the text; a FIFO,
socket or device node planted at the target never blocks it (what is there is read through
``kubedevice._regular_file``).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import tempfile
from pathlib import Path

from kubedevice._regular_file import NotRegularFileError, read_regular

__all__ = ["replace_if_changed", "sync_file", "write_atomically"]

log = logging.getLogger(__name__)


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
        if read_regular(target, len(data)) == data:
            return False
    except NotRegularFileError as exc:
        if exc.errno == errno.EISDIR:
            raise IsADirectoryError(
                errno.EISDIR, "a directory is in the way", str(target)
            ) from None
        log.warning("%s is %s, not a file this plugin wrote; replacing it", target, exc.kind)
    except OSError:
        pass  # missing or unreadable: written below
    write_atomically(target, data, mode=0o644)  # world-readable whatever the umask
    return True


def write_atomically(path: Path, data: bytes | str, *, mode: int, sync: bool = True) -> None:
    """Write ``data`` to a temporary file beside ``path`` (``mode``), fsync, rename into place.

    A reader never sees a partial file; a symlink at ``path`` is replaced, never followed.
    With ``sync=False`` the fsync is left to the caller (:func:`sync_file`): every process
    sees the new file at once, a power loss before that fsync may keep the old one.

    Raises:
        OSError: The directory cannot be written.
    """
    raw = data.encode() if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            if sync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def sync_file(path: Path) -> None:
    """fsync ``path`` (its data on disk) and then its directory (its name on disk).

    Raises:
        OSError: It cannot be opened or synced.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

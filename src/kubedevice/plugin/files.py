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
import tempfile
from pathlib import Path

from kubedevice._regular_file import NotRegularFileError, read_regular

__all__ = ["replace_if_changed"]

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

"""Publishing a file a plugin owns (a CDI spec, the NFD feature file): atomic, no-follow.

:func:`replace_if_changed` writes a hidden temporary file in the target's directory and
renames it over the target, so a reader (the container runtime, ``nfd-worker``) never sees
a partial file, and a symlink at the target is replaced, never followed. It writes nothing
when the target already holds the text.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

__all__ = ["replace_if_changed"]


def replace_if_changed(directory: Path, name: str, text: str) -> bool:
    """Make ``directory/name`` hold ``text`` (mode 0644); ``False`` when it already did.

    The directory is created (0755) if missing.

    Raises:
        OSError: The directory cannot be created or written.
    """
    data = text.encode()
    target = directory / name
    directory.mkdir(mode=0o755, parents=True, exist_ok=True)
    if _read_nofollow(target, len(data) + 1) == data:
        return False
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


def _read_nofollow(path: Path, limit: int) -> bytes | None:
    """Up to ``limit`` bytes of ``path``; ``None`` when it is missing, unreadable or a symlink."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        return f.read(limit)

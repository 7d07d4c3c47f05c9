"""Atomic file replacement for the kit's files (CDI specs, the checkpoint).

A reader never sees a partial file, and a symlink at the target is replaced, never followed.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

__all__ = ["write_atomically"]


def write_atomically(path: Path, text: str, *, mode: int) -> None:
    """Write ``text`` to a temp file beside ``path`` (``mode``), fsync, rename into place.

    Raises:
        OSError: The directory cannot be written.
    """
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise

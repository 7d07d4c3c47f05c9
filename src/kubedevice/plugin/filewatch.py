"""inotify watches (``asyncinotify``) over a changing set of directories; no polling.

:class:`DirWatcher` wakes its owner when an entry of a watched directory is created,
removed, renamed or rewritten, coalescing whatever events are already queued.
"""

from __future__ import annotations

import contextlib
import logging
import os
import zlib
from pathlib import Path

from asyncinotify import Event, Inotify, Mask, Watch

from kubedevice._regular_file import read_regular

__all__ = ["CONFIG_MASK", "DEVICE_MASK", "DirWatcher", "FileChanges", "file_digest"]

log = logging.getLogger(__name__)

#: Entries appearing/disappearing, and the directory itself going away.
DEVICE_MASK = (
    Mask.CREATE
    | Mask.DELETE
    | Mask.MOVED_FROM
    | Mask.MOVED_TO
    | Mask.DELETE_SELF
    | Mask.MOVE_SELF
    | Mask.ONLYDIR
    | Mask.DONT_FOLLOW
)
#: A config file rewritten in place, replaced by rename, or swapped via symlinks.
CONFIG_MASK = DEVICE_MASK | Mask.CLOSE_WRITE


class DirWatcher:
    """A set of inotify directory watches that can be changed at run time."""

    def __init__(self, mask: Mask = DEVICE_MASK) -> None:
        self._mask = mask
        self._inotify = Inotify(sync_timeout=0)
        self._watches: dict[str, Watch] = {}

    @property
    def dirs(self) -> frozenset[str]:
        """The directories currently watched."""
        return frozenset(self._watches)

    def watch_exactly(self, dirs: set[str]) -> None:
        """Watch ``dirs`` and nothing else (missing directories are skipped)."""
        for path in set(self._watches) - dirs:
            watch = self._watches.pop(path)
            with contextlib.suppress(OSError):
                self._inotify.rm_watch(watch)
        for path in dirs - set(self._watches):
            try:
                self._watches[path] = self._inotify.add_watch(path, self._mask)
            except OSError as exc:
                log.debug("cannot watch %s: %s", path, exc)

    async def changed(self) -> list[Event]:
        """Wait for at least one event; return it with every event already queued."""
        batch = [await self._inotify.get()]
        while (event := self._inotify.sync_get()) is not None:
            batch.append(event)
        for event in batch:
            if Mask.IGNORED in event.mask or Mask.DELETE_SELF in event.mask:
                # the kernel dropped the watch; forget it so the next sync re-adds it
                for path, watch in list(self._watches.items()):
                    if event.watch is watch:
                        del self._watches[path]
        return batch

    def close(self) -> None:
        """Release the inotify descriptor."""
        self._inotify.close()


def file_digest(path: Path) -> str | None:
    """A fingerprint of a file's content (length, CRC-32, Adler-32); ``None`` if unreadable.

    Only ever compared with another fingerprint of the same file, to tell an edit from an
    event that left the content as it was. zlib is loaded by every daemon already; hashlib
    would add OpenSSL's digest tables (0.6 MB) for this one comparison.
    """
    try:
        data = read_regular(path, follow_symlinks=True)
    except OSError:
        return None
    return f"{len(data)}:{zlib.crc32(data):08x}:{zlib.adler32(data):08x}"


def _file_dirs(path: Path) -> set[str]:
    """Directories to watch for changes of the file ``path``.

    Real paths (inotify does not follow a symlinked directory): the directory holding the
    file, and the one holding its target when the file is a symlink elsewhere.
    """
    return {
        os.path.realpath(path.parent),
        os.path.dirname(os.path.realpath(path)),
    }


class FileChanges:
    """Wakes its owner when one file's content changes (a config file, a ConfigMap).

    Rewritten in place, replaced by rename or swapped through symlinks (a ConfigMap
    volume): all are seen through inotify on the directories involved; events that leave
    the content as it was are ignored.

    Args:
        path: The file.
        digest: The content in force (:func:`file_digest` taken *before* it was loaded);
            read now when ``None``. A change made between that moment and this watch
            being set up is reported by the first :meth:`changed`.
    """

    def __init__(self, path: Path, digest: str | None = None) -> None:
        self.path = path
        self._watcher = DirWatcher(CONFIG_MASK)
        self._watcher.watch_exactly(_file_dirs(path))
        now = file_digest(path)  # after the watch: later edits raise events
        self.digest = digest if digest is not None else now
        self._missed = now is not None and now != self.digest

    async def changed(self) -> None:
        """Return once the file's content differs from the last one seen."""
        if self._missed:
            self._missed = False
            self.digest = file_digest(self.path)
            return
        while True:
            await self._watcher.changed()
            self._watcher.watch_exactly(_file_dirs(self.path))
            digest = file_digest(self.path)
            if digest is not None and digest != self.digest:
                self.digest = digest
                return

    def close(self) -> None:
        """Release the inotify descriptor."""
        self._watcher.close()

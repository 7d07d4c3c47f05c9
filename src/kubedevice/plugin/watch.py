"""Event-driven watch of the device plugin directory (inotify, no polling).

Reports the name of every entry created, deleted or moved in the directory; the server
decides what a change means (kubelet restarted, our socket removed). When the directory
itself is deleted or moved away, or does not exist yet, the watcher follows its nearest
existing ancestor until the directory exists, then watches it and reports :data:`OVERFLOW`
(re-check everything). It never creates the directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
from collections.abc import Callable
from pathlib import Path

from asyncinotify import Inotify, Mask, Watch

__all__ = ["OVERFLOW", "DirWatcher"]

log = logging.getLogger(__name__)

#: Name passed to the callback when events were lost or the directory came back:
#: re-check everything.
OVERFLOW = ""

_MASK = (
    Mask.CREATE
    | Mask.DELETE
    | Mask.MOVED_FROM
    | Mask.MOVED_TO
    | Mask.DELETE_SELF
    | Mask.MOVE_SELF
    | Mask.ONLYDIR
)
#: On an ancestor while the directory is missing: anything that may bring it back.
_ANCESTOR_MASK = Mask.CREATE | Mask.MOVED_TO | Mask.DELETE_SELF | Mask.MOVE_SELF | Mask.ONLYDIR
_GONE = Mask.DELETE_SELF | Mask.MOVE_SELF | Mask.IGNORED
_MISSING = (errno.ENOENT, errno.ENOTDIR)


class DirWatcher:
    """Calls ``on_change(name)`` for every entry that appears or disappears in ``directory``.

    Args:
        directory: The directory to watch (waited for if it does not exist yet).
        on_change: Called on the event loop with the entry's base name, or
            :data:`OVERFLOW` when the kernel dropped events or the directory was
            re-created.
    """

    def __init__(self, directory: Path, on_change: Callable[[str], None]) -> None:
        self.directory = directory
        self._on_change = on_change
        self._inotify: Inotify | None = None
        self._watch: Watch | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Start watching; events that happen after this returns are reported.

        A directory that does not exist yet is waited for (its nearest existing ancestor
        is watched); :data:`OVERFLOW` is reported when it appears.
        """
        self._inotify = Inotify()
        try:
            self._watch = self._inotify.add_watch(self.directory, _MASK)
        except OSError as exc:
            if exc.errno not in _MISSING:
                self._inotify.close()
                self._inotify = None
                raise
            self._watch = None
        self._task = asyncio.create_task(self._run(), name=f"watch {self.directory}")

    async def stop(self) -> None:
        """Stop watching (idempotent)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.wait((task,))
        inotify, self._inotify = self._inotify, None
        if inotify is not None:
            inotify.close()

    def _notify(self, name: str) -> None:
        try:
            self._on_change(name)
        except Exception:
            log.exception("error handling a change of %r in %s", name, self.directory)

    async def _run(self) -> None:
        seen = self._watch is not None
        while True:
            if self._watch is None:
                if not await self._wait_for_directory():
                    return
                if seen:
                    log.warning(
                        "device plugin directory %s is back; watching it again", self.directory
                    )
                else:
                    log.info("device plugin directory %s appeared; watching it", self.directory)
                seen = True
                self._notify(OVERFLOW)
            await self._follow()
            log.error(
                "device plugin directory %s was removed; waiting for it to be re-created",
                self.directory,
            )
            self._notify(OVERFLOW)

    async def _follow(self) -> None:
        """Report the directory's events until the directory is deleted or moved away."""
        assert self._inotify is not None
        watch = self._watch
        while True:
            event = await self._inotify.get()
            if event.mask & Mask.Q_OVERFLOW:
                log.warning("inotify queue overflowed on %s; re-checking", self.directory)
                self._notify(OVERFLOW)
                continue
            if event.watch is not watch:
                continue  # a stale ancestor watch from an earlier wait
            if event.mask & _GONE:
                if watch is not None and not event.mask & Mask.IGNORED:
                    with contextlib.suppress(OSError):
                        self._inotify.rm_watch(watch)
                self._watch = None
                return
            if event.name is not None:
                self._notify(str(event.name))

    async def _wait_for_directory(self) -> bool:
        """Wait until the directory exists again and watch it; False if that is impossible."""
        assert self._inotify is not None
        while True:
            try:
                self._watch = self._inotify.add_watch(self.directory, _MASK)
                return True
            except OSError as exc:
                if exc.errno not in _MISSING:
                    log.error("cannot watch %s any more: %s", self.directory, exc)
                    return False
            ancestor = self.directory.parent
            while not ancestor.is_dir() and ancestor != ancestor.parent:
                ancestor = ancestor.parent
            try:
                guard = self._inotify.add_watch(ancestor, _ANCESTOR_MASK)
            except OSError as exc:
                if exc.errno in _MISSING:
                    continue  # the ancestor went away too: look again
                log.error("cannot watch %s for %s any more: %s", ancestor, self.directory, exc)
                return False
            try:
                # Armed now; the directory may have appeared just before.
                if not self.directory.is_dir():
                    while True:
                        event = await self._inotify.get()
                        if event.mask & Mask.Q_OVERFLOW or event.watch is guard:
                            break
            finally:
                with contextlib.suppress(OSError):
                    self._inotify.rm_watch(guard)

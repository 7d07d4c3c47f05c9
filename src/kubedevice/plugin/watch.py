"""Event-driven watch of the device plugin directory (inotify, no polling).

Reports the name of every entry created, deleted or moved in the directory; the server
decides what a change means (kubelet restarted, our socket removed).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

from asyncinotify import Inotify, Mask

__all__ = ["OVERFLOW", "DirWatcher"]

log = logging.getLogger(__name__)

#: Name passed to the callback when events were lost: re-check everything.
OVERFLOW = ""

_MASK = Mask.CREATE | Mask.DELETE | Mask.MOVED_FROM | Mask.MOVED_TO


class DirWatcher:
    """Calls ``on_change(name)`` for every entry that appears or disappears in ``directory``.

    Args:
        directory: The directory to watch (must exist).
        on_change: Called on the event loop with the entry's base name, or
            :data:`OVERFLOW` when the kernel dropped events.
    """

    def __init__(self, directory: Path, on_change: Callable[[str], None]) -> None:
        self.directory = directory
        self._on_change = on_change
        self._inotify: Inotify | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Start watching; events that happen after this returns are reported."""
        self._inotify = Inotify()
        self._inotify.add_watch(self.directory, _MASK)
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

    async def _run(self) -> None:
        assert self._inotify is not None
        async for event in self._inotify:
            if event.mask & Mask.Q_OVERFLOW:
                log.warning("inotify queue overflowed on %s; re-checking", self.directory)
                self._on_change(OVERFLOW)
            elif event.mask & Mask.IGNORED:
                log.error(
                    "device plugin directory %s was removed; no longer watching it", self.directory
                )
                return
            elif event.name is not None:
                try:
                    self._on_change(str(event.name))
                except Exception:
                    log.exception("error handling a change of %s", event.name)

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
import functools
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from kubedevice.errors import PluginServerError

if TYPE_CHECKING:
    from asyncinotify import Inotify, Watch

__all__ = ["OVERFLOW", "DirWatcher"]

log = logging.getLogger(__name__)

#: Name passed to the callback when events were lost or the directory came back:
#: re-check everything.
OVERFLOW = ""

_MISSING = (errno.ENOENT, errno.ENOTDIR)


@functools.cache
def _inotify() -> Any:
    """``asyncinotify`` and our masks, imported on first use: inotify exists only on Linux.

    Importing :mod:`kubedevice` (and so the emulator and the conformance kit) must work
    elsewhere; only a running plugin daemon needs inotify.

    Raises:
        PluginServerError: Not Linux, or asyncinotify is not installed.
    """
    if not sys.platform.startswith("linux"):
        raise PluginServerError(
            f"device plugin daemons run on Linux only (they need inotify); this is {sys.platform}"
        )
    try:
        import asyncinotify
    except ImportError as exc:
        raise PluginServerError(f"device plugin daemons need asyncinotify: {exc}") from None
    mask = asyncinotify.Mask
    return SimpleNamespace(
        Inotify=asyncinotify.Inotify,
        Mask=mask,
        WATCH=mask.CREATE
        | mask.DELETE
        | mask.MOVED_FROM
        | mask.MOVED_TO
        | mask.DELETE_SELF
        | mask.MOVE_SELF
        | mask.ONLYDIR,
        # On an ancestor while the directory is missing: anything that may bring it back.
        ANCESTOR=mask.CREATE | mask.MOVED_TO | mask.DELETE_SELF | mask.MOVE_SELF | mask.ONLYDIR,
        GONE=mask.DELETE_SELF | mask.MOVE_SELF | mask.IGNORED,
    )


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
        ino = _inotify()
        self._inotify = ino.Inotify()
        try:
            self._watch = self._inotify.add_watch(self.directory, ino.WATCH)
        except OSError as exc:
            if exc.errno not in _MISSING:
                self._inotify.close()
                self._inotify = None
                raise
            self._watch = None
        self._task = asyncio.create_task(self._run(), name=f"watch {self.directory}")

    async def stop(self) -> None:
        """Stop watching (idempotent).

        The inotify descriptor is closed in a thread: the kernel takes 8 to 20 ms to
        close one (it waits for a grace period), and several watchers stopped together
        then overlap that wait, with each other and with the caller's other work.
        """
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.wait((task,))
        inotify, self._inotify = self._inotify, None
        if inotify is not None:
            await asyncio.to_thread(inotify.close)

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
        ino = _inotify()
        watch = self._watch
        while True:
            event = await self._inotify.get()
            if event.mask & ino.Mask.Q_OVERFLOW:
                log.warning("inotify queue overflowed on %s; re-checking", self.directory)
                self._notify(OVERFLOW)
                continue
            if event.watch is not watch:
                continue  # a stale ancestor watch from an earlier wait
            if event.mask & ino.GONE:
                if watch is not None and not event.mask & ino.Mask.IGNORED:
                    with contextlib.suppress(OSError):
                        self._inotify.rm_watch(watch)
                self._watch = None
                return
            if event.name is not None:
                self._notify(str(event.name))

    async def _wait_for_directory(self) -> bool:
        """Wait until the directory exists again and watch it; False if that is impossible."""
        assert self._inotify is not None
        ino = _inotify()
        while True:
            try:
                self._watch = self._inotify.add_watch(self.directory, ino.WATCH)
                return True
            except OSError as exc:
                if exc.errno not in _MISSING:
                    log.error("cannot watch %s any more: %s", self.directory, exc)
                    return False
            ancestor = self.directory.parent
            while not ancestor.is_dir() and ancestor != ancestor.parent:
                ancestor = ancestor.parent
            try:
                guard = self._inotify.add_watch(ancestor, ino.ANCESTOR)
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
                        if event.mask & ino.Mask.Q_OVERFLOW or event.watch is guard:
                            break
            finally:
                with contextlib.suppress(OSError):
                    self._inotify.rm_watch(guard)

"""Saving the prepared-claim checkpoint from the claim calls: batched, and synced on demand.

:class:`CheckpointSaver` serves every ``save`` made while an earlier write ran with one
write (the claims of one call are saved together). A save with ``sync=False`` (an
unprepare's) returns once the file every process reads has the change (written on the
event loop while the file is small: a thread hop there and back costs more than the
write), and the fsync (file, then directory) follows right after in a task of its own, off
the call's path, beside the next writes (a save never waits for an fsync in progress); a
synced save (a prepare's) syncs what an unsynced save wrote. A save with ``follow=False``
(a prepare's "preparing" record, made durable by that prepare's own synced save right
after its hook) is written as an unsynced one is, and no fsync follows it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Final

from kubedevice.dra.state.checkpoint import Checkpoint

__all__ = ["ON_LOOP_BYTES", "CheckpointSaver"]

#: An unsynced save of a checkpoint last written at most this big is written on the event
#: loop (no fsync: a write into the page cache and a rename, well under a millisecond);
#: a bigger one, or a synced one, in a thread, so the loop never waits on the disk.
ON_LOOP_BYTES: Final = 64 * 1024

log = logging.getLogger(__name__)


class CheckpointSaver:
    """Saves ``checkpoint`` for the claim calls (see the module)."""

    def __init__(self, checkpoint: Checkpoint) -> None:
        self.checkpoint = checkpoint
        self._lock = asyncio.Lock()
        self._changes = 0  # checkpoint changes made
        self._saved = 0  # of which saved (every process sees them)
        self._synced = 0  # of which fsynced (a power loss keeps them)
        #: The fsync that follows an unsynced save, while it is pending.
        self.syncing: asyncio.Task[None] | None = None

    async def save(self, *, sync: bool = True, follow: bool = True) -> None:
        """Save the checkpoint with the change just made.

        Args:
            sync: Return once the change is on disk (fsynced); else once every process
                sees it.
            follow: With ``sync=False``, fsync right after, off the caller's path; with
                ``False`` the caller's next synced save does it.

        Raises:
            OSError: It cannot be written (or, with ``sync``, synced).
        """
        self._changes += 1
        mine = self._changes
        if not self._lock.locked():
            # let the other claims of the call make their changes first: one write for all
            await asyncio.sleep(0)
        async with self._lock:  # one write at a time; an fsync in progress never holds it
            if self._saved < mine:
                upto = self._changes
                if sync or self.checkpoint.written_bytes > ON_LOOP_BYTES:
                    await asyncio.to_thread(self.checkpoint.save, sync=sync)
                else:  # a small file into the page cache: cheaper than two thread hops
                    self.checkpoint.save(sync=False)
                self._saved = upto
                if sync:
                    self._synced = max(self._synced, upto)
        if sync and self._synced < mine:  # written by an unsynced save: sync it now
            upto = self._saved
            await asyncio.to_thread(self.checkpoint.sync)
            self._synced = max(self._synced, upto)
        if follow and self._synced < mine and self.syncing is None:
            self.syncing = asyncio.create_task(self._sync_soon(), name="sync the checkpoint")

    async def _sync_soon(self) -> None:
        """fsync what unsynced saves wrote (the file, then its directory), until all is.

        It runs beside the writes: a save made meanwhile is written at once (the fsync
        then covers the file it finds, old or new, and what it did not cover is synced on
        the next turn), so an unprepare's answer never waits for the fsync of the one before.
        """
        try:
            while self._synced < self._saved:
                upto = self._saved
                await asyncio.to_thread(self.checkpoint.sync)
                self._synced = max(self._synced, upto)
        except OSError as exc:  # the next synced save writes (and syncs) it all again
            log.error("cannot fsync the checkpoint: %s", exc)
        finally:
            self.syncing = None

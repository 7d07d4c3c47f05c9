"""Claim work shared by the instances of one driver on a node (a rolling upgrade).

:class:`SharedClaims` wraps each ``NodePrepareResources``/``NodeUnprepareResources`` call
and the start-up restore in the node's claims lock (:class:`kubedevice.dra.state.lock.ClaimsLock`).
Each time this process takes the lock from another, the checkpoint is read again if that
other instance changed it (one ``stat`` when it did not), and the driver's ``restore`` hook
gets the whole new set of prepared claims, so the driver's own state (time slices, MIG
devices) follows what the other instance prepared and unprepared. Without a lock (a driver
run without a pod UID: one instance per node) it does nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

from kubedevice._regular_file import NotRegularFileError
from kubedevice.dra.model.types import PreparedClaim
from kubedevice.dra.state.checkpoint import Checkpoint
from kubedevice.dra.state.lock import ClaimsLock, refusal
from kubedevice.errors import ClaimError

__all__ = ["SharedClaims"]

log = logging.getLogger(__name__)


class SharedClaims:
    """Serialises this instance's claim work with the other instances' (see the module).

    Args:
        lock: The node's claims lock (``None``: alone on the node, nothing to serialise).
        checkpoint: This instance's view of the checkpoint.
        restore: The driver's ``restore`` hook.
    """

    def __init__(
        self,
        lock: ClaimsLock | None,
        checkpoint: Checkpoint,
        restore: Callable[[Sequence[PreparedClaim]], Awaitable[object]],
    ) -> None:
        self.lock = lock
        self.checkpoint = checkpoint
        self.restore = restore
        #: Set once the start-up restore is done (before it, nothing is caught up).
        self.started = False
        #: Times the checkpoint was read again because another instance changed it.
        self.catch_ups = 0

    @contextlib.asynccontextmanager
    async def hold(self) -> AsyncIterator[None]:
        """The node's claims lock for the block (nothing without one).

        Raises:
            OSError: The lock file cannot be opened or locked.
        """
        if self.lock is None:
            yield
            return
        async with self.lock.hold(self._catch_up):
            yield

    @contextlib.asynccontextmanager
    async def hold_for_call(self) -> AsyncIterator[None]:
        """:meth:`hold` for a kubelet call: a claims lock that cannot be taken (its file
        replaced by a FIFO, a directory or a symlink) is one line for each claim's answer.

        Raises:
            ClaimError: The lock file cannot be opened or locked (logged once, no traceback).
        """
        async with contextlib.AsyncExitStack() as stack:
            try:
                await stack.enter_async_context(self.hold())
            except OSError as exc:
                path = self.lock.path if self.lock is not None else "the claims lock"
                why = (
                    refusal(self.lock.path, exc)
                    if isinstance(exc, NotRegularFileError) and self.lock is not None
                    else f"cannot take the node's claims lock {path}: {exc.strerror or exc}"
                )
                log.error("%s", why)
                raise ClaimError(why) from None
            yield

    async def _catch_up(self) -> None:
        # a stat on the loop; the file is read (in a thread) only when another instance
        # replaced it
        if not self.started or not self.checkpoint.changed():
            return
        await asyncio.to_thread(self.checkpoint.load)
        self.catch_ups += 1
        claims = list(self.checkpoint.claims.values())
        log.info(
            "checkpoint changed by another instance of the driver: %d prepared claims, "
            "%d being prepared",
            len(claims),
            len(self.checkpoint.preparing),
        )
        try:
            await self.restore(claims)
        except Exception:  # the calls still go on: each claim is checked on its own
            log.exception("the driver's restore hook failed on the changed checkpoint")

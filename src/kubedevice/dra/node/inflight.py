"""The claim work of the kubelet's calls, run to its end even when the call is cut off.

A ``NodePrepareResources`` or ``NodeUnprepareResources`` call is cancelled when its deadline
passes (the kubelet's is 45 s) or when the server stops; a plain-``def`` hook goes on in its
thread all the same, and an ``async def`` one may be in the middle of its work. So each
call's work (under the node's claims lock and its claims' locks) runs as a task of its own:
the call stops waiting for it, the work runs on to its end, records (or undoes) what the
hook made, and only then lets the locks go. A retry of the same claim waits at its claim's
lock and answers from the record; :meth:`InFlight.drain` waits for the rest on stop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["InFlight"]

log = logging.getLogger(__name__)

_T = TypeVar("_T")


class InFlight:
    """The calls' work in flight (:attr:`tasks`)."""

    def __init__(self) -> None:
        #: One task per call whose work has not ended.
        self.tasks: set[asyncio.Task[None]] = set()

    async def run(self, work: Coroutine[Any, Any, _T], what: str) -> _T:
        """Await ``work`` (a call's, ``what`` names it) run as a task of its own: cancelling
        the caller stops the waiting, never the work."""
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[_T] = loop.create_future()
        task = loop.create_task(_settle(work, answer, what))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        try:
            return await answer
        except asyncio.CancelledError:
            if not task.done():
                log.warning(
                    "a %s call was cut off (its deadline passed or the driver is stopping); "
                    "its claims' work runs on to its end and is recorded before their next call",
                    what,
                )
            raise

    async def drain(self, grace: float) -> int:
        """Wait up to ``grace`` seconds for the work in flight; how many are left."""
        if not self.tasks:
            return 0
        log.info("waiting up to %.1f s for %d calls in flight", grace, len(self.tasks))
        _done, left = await asyncio.wait(set(self.tasks), timeout=max(grace, 0))
        return len(left)


async def _settle(work: Coroutine[Any, Any, _T], answer: asyncio.Future[_T], what: str) -> None:
    """Run ``work`` to its end; its outcome goes to ``answer`` while the call still waits."""
    try:
        result = await work
    except asyncio.CancelledError:
        answer.cancel()
        raise
    except Exception as exc:
        if answer.cancelled():  # nobody waits for it any more: it is only logged
            log.error("the %s call cut off earlier failed: %s", what, exc, exc_info=exc)
        else:
            answer.set_exception(exc)
        return
    if answer.cancelled():
        log.info("the %s call cut off earlier has finished; its result is recorded", what)
    else:
        answer.set_result(result)

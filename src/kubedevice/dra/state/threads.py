"""Threads for work that may never return: a driver's plain-``def`` hooks, a wait for a lock.

``asyncio.to_thread`` runs its work in the loop's default executor, whose threads the
process joins when it ends (``asyncio.run`` waits for them, then the interpreter does): a
hook stuck in its thread past the stop grace would keep the driver from ever exiting after
a SIGTERM, and six of them (the executor's size on two cores) would hold every other
``to_thread`` of the process (the checkpoint's writes among them) in its queue.
:func:`in_thread` runs the work in daemon threads of a pool of its own instead (at most
:data:`MAX_THREADS`, each gone after :data:`IDLE_S` idle): the process ends without them,
and the kit's own short work never waits behind them.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import queue
import threading
from collections.abc import Callable
from typing import Any, Final, TypeVar

__all__ = ["IDLE_S", "MAX_THREADS", "in_thread", "threads_alive"]

_T = TypeVar("_T")

#: At most this many threads at once; more work waits for one to be free.
MAX_THREADS: Final = 64
#: A thread with no work for this long ends.
IDLE_S: Final = 30.0

_Job = tuple[Callable[[], Any], asyncio.AbstractEventLoop, "asyncio.Future[Any]"]


class _Pool:
    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        self._waiting = 0  # threads waiting for a job
        self._queued = 0  # jobs not taken yet
        self._named = 0

    @property
    def alive(self) -> int:
        with self._lock:
            return self._threads

    def submit(self, job: _Job) -> None:
        with self._lock:
            self._queued += 1
            spawn = self._waiting < self._queued and self._threads < MAX_THREADS
            if spawn:
                self._threads += 1
                self._named += 1
        self._jobs.put(job)
        if spawn:
            name = f"kubedevice-dra-{self._named}"
            threading.Thread(target=self._work, name=name, daemon=True).start()

    def _work(self) -> None:
        while True:
            with self._lock:
                self._waiting += 1
            try:
                fn, loop, future = self._jobs.get(timeout=IDLE_S)
            except queue.Empty:
                with self._lock:
                    self._waiting -= 1
                    if self._queued == 0:
                        self._threads -= 1
                        return
                continue  # a job came meanwhile: take it
            with self._lock:
                self._waiting -= 1
                self._queued -= 1
            try:
                outcome: tuple[Any, BaseException | None] = (fn(), None)
            except BaseException as exc:  # handed to the caller, as to_thread does
                outcome = (None, exc)
            _settle(loop, future, *outcome)
            del fn, loop, future, outcome  # nothing of the job kept while idle


def _settle(
    loop: asyncio.AbstractEventLoop,
    future: asyncio.Future[Any],
    result: Any,
    error: BaseException | None,
) -> None:
    def done() -> None:
        if future.done():  # the caller stopped waiting (cancelled)
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
        loop.call_soon_threadsafe(done)


_POOL = _Pool()


async def in_thread(func: Callable[..., _T], /, *args: Any) -> _T:
    """``await asyncio.to_thread(func, *args)``, in a daemon thread of this module's pool
    (see the module): cancelling the caller stops the waiting, never ``func``."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[_T] = loop.create_future()
    call = functools.partial(contextvars.copy_context().run, func, *args)
    _POOL.submit((call, loop, future))
    return await future


def threads_alive() -> int:
    """How many threads the pool has now (busy or idle)."""
    return _POOL.alive

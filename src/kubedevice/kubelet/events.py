"""The emulator's append-only event log and its change notifier (waits, never polls).

Every state change (registration, ListAndWatch message, stream end, RPC, pod admission)
appends a typed record to ``EventLog`` and wakes every ``Notifier.wait_until`` waiter.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar, overload

from kubedevice.kubelet.types import EmulatorEvent

__all__ = ["EventLog", "Notifier"]

E = TypeVar("E", bound=EmulatorEvent)


class Notifier:
    """Wakes waiters on every state change; ``wait_until`` re-checks its predicate each time.

    Works like an ``asyncio.Condition`` whose ``notify_all`` may be called from synchronous
    code: each change sets the current ``asyncio.Event`` and installs a fresh one.
    """

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def notify(self) -> None:
        """Wake every waiter (they re-check their predicates)."""
        self._event.set()
        self._event = asyncio.Event()

    async def wait_until(self, predicate: Callable[[], bool], timeout: float) -> None:  # noqa: ASYNC109
        """Return once ``predicate()`` is true; raise ``TimeoutError`` after ``timeout`` s."""
        try:
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for may swallow a cancel.
            async with asyncio.timeout(timeout):
                while not predicate():
                    await self._event.wait()
        except TimeoutError:
            if predicate():
                return
            raise TimeoutError(f"condition not met within {timeout} s") from None


class EventLog(Sequence[EmulatorEvent]):
    """Append-only list of event records with monotonic timestamps."""

    def __init__(self, notifier: Notifier) -> None:
        self._items: list[EmulatorEvent] = []
        self._notifier = notifier

    def append(self, event: EmulatorEvent) -> None:
        """Record ``event`` and wake waiters."""
        self._items.append(event)
        self._notifier.notify()

    @staticmethod
    def now() -> float:
        """The clock the records use (``time.monotonic``)."""
        return time.monotonic()

    def of_type(self, cls: type[E], since: float | None = None) -> list[E]:
        """All records of type ``cls`` (optionally with ``t >= since``), in order."""
        return [e for e in self._items if isinstance(e, cls) and (since is None or e.t >= since)]

    @overload
    def __getitem__(self, index: int) -> EmulatorEvent: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[EmulatorEvent]: ...
    def __getitem__(self, index: int | slice) -> EmulatorEvent | Sequence[EmulatorEvent]:
        return self._items[index]

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[EmulatorEvent]:
        return iter(list(self._items))

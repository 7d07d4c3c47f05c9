"""What the API server holds of a driver's ResourceSlices, kept current by a watch.

One LIST, then a watch (in a thread) of every ResourceSlice: the kit sees a driver's
slices for its node and any slice the driver writes elsewhere, and records every change
(time, type, slice, driver, node) so that the quiet-period case can say what was written.
:meth:`SliceView.devices` is the published devices the allocation writer chooses from.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kubedevice.conformance.dra.kube import RESOURCE, KubeClient, Watch

__all__ = ["Change", "PublishedDevice", "SliceView"]


@dataclass(frozen=True)
class Change:
    """One watch event of a ResourceSlice."""

    t: float
    type: str
    name: str
    driver: str
    node: str


@dataclass(frozen=True)
class PublishedDevice:
    """A device as the scheduler sees it: (driver, pool, name) and its slice's node."""

    driver: str
    pool: str
    name: str
    node: str
    multiple: bool = False


class SliceView:
    """Every ResourceSlice, by name, with the log of changes since the kit started."""

    def __init__(self, kube: KubeClient, on_change: Callable[[], None]) -> None:
        self.kube = kube
        self.slices: dict[str, dict[str, Any]] = {}
        self.changes: list[Change] = []
        self._on_change = on_change
        self._watch: Watch | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopped = False
        self.error = ""

    async def start(self) -> None:
        """LIST, then watch from there in a thread."""
        self._loop = asyncio.get_running_loop()
        listing = await asyncio.to_thread(self.kube.call, "GET", f"{RESOURCE}/resourceslices")
        self.slices = {s["metadata"]["name"]: s for s in listing.get("items") or []}
        self._thread = threading.Thread(
            target=self._follow, args=(listing["metadata"]["resourceVersion"],), daemon=True
        )
        self._thread.start()

    def _follow(self, version: str) -> None:
        while not self._stopped:
            self._watch = self.kube.watch(f"{RESOURCE}/resourceslices", version)
            try:
                for event in self._watch:
                    obj = event.get("object") or {}
                    meta = obj.get("metadata") or {}
                    version = meta.get("resourceVersion", version)
                    if event.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                        assert self._loop is not None
                        self._loop.call_soon_threadsafe(self._apply, event["type"], obj)
            except Exception as exc:  # the watch failed: say so, the cases will see no change
                self.error = str(exc)
                return

    def _apply(self, kind: str, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        spec = obj.get("spec") or {}
        if kind == "DELETED":
            self.slices.pop(name, None)
        else:
            self.slices[name] = obj
        self.changes.append(
            Change(time.monotonic(), kind, name, spec.get("driver", ""), spec.get("nodeName", ""))
        )
        self._on_change()

    async def stop(self) -> None:
        """End the watch."""
        self._stopped = True
        if self._watch is not None:
            self._watch.close()
        if self._thread is not None:
            with contextlib.suppress(RuntimeError):
                await asyncio.to_thread(self._thread.join, 5)

    def of(self, driver: str | None = None, node: str | None = None) -> list[dict[str, Any]]:
        """Slices of ``driver`` (any when None) on ``node`` (any when None)."""
        return [
            s
            for s in self.slices.values()
            if (driver is None or s["spec"].get("driver") == driver)
            and (node is None or s["spec"].get("nodeName") == node)
        ]

    def device_count(self, driver: str, node: str) -> int:
        """Devices in the driver's slices on ``node``."""
        return sum(len(s["spec"].get("devices") or []) for s in self.of(driver, node))

    def devices(self, driver: str, node: str) -> list[PublishedDevice]:
        """The published devices of the driver's complete pools on ``node``, in name order."""
        out = []
        for s in self.of(driver, node):
            pool = s["spec"].get("pool") or {}
            for d in s["spec"].get("devices") or []:
                if d.get("taints"):
                    continue
                out.append(
                    PublishedDevice(
                        driver,
                        str(pool.get("name", "")),
                        str(d.get("name", "")),
                        node,
                        bool(d.get("allowMultipleAllocations")),
                    )
                )
        return sorted(out, key=lambda d: (d.pool, _natural(d.name)))


def _natural(name: str) -> tuple[Any, ...]:
    head, _, tail = name.rpartition("-")
    return (head, int(tail)) if tail.isdigit() else (name, -1)

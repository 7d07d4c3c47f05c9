"""Publishing the driver's devices as the ResourceSlices (resource.k8s.io/v1) of one pool.

One pool per node, named after the node; at most 128 devices per slice; every slice has
``spec.driver``, ``spec.nodeName``, the pool's generation and slice count, and an owner
reference to the Node (so the slices go with it). :meth:`SlicePublisher.reconcile` lists
this driver's slices on this node (field selectors), adopts them, updates them when the
devices differ (the generation grows by one on every change), creates what is missing
and deletes what is stale. Unhealthy devices are left out (nothing new is allocated on
them). A conflict re-lists and tries again; other API errors are retried with backoff by
:meth:`SlicePublisher.run` and logged, never fatal.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import Sequence
from typing import Any, Final

from kubedevice.dra.kube import KubeClient
from kubedevice.dra.types import Device, Health, Version
from kubedevice.errors import KubeApiError
from kubedevice.plugin.registration import Backoff

__all__ = [
    "MAX_DEVICES_PER_SLICE",
    "SlicePublisher",
    "delete_slices",
    "device_object",
    "slice_name",
]

log = logging.getLogger(__name__)

#: resource.k8s.io/v1: at most 128 devices in one ResourceSlice.
MAX_DEVICES_PER_SLICE: Final = 128
_API_VERSION: Final = "resource.k8s.io/v1"
_CONFLICT_RETRIES: Final = 5
#: Seconds between checks that this driver's slices are still there and as published (a
#: LIST with field selectors; nothing is written when they are).
RESYNC_S: Final = 30.0
#: Right after a (re-)registration the slices are checked this often...
SETTLE_S: Final = 2.0
#: ...for this many seconds: a restarting kubelet deletes every ResourceSlice of its node
#: (no delay, retried until it can read its Node), possibly after this driver republished.
SETTLE_FOR_S: Final = 30.0


def device_object(device: Device) -> dict[str, Any]:
    """``device`` as a ResourceSlice device (JSON)."""
    out: dict[str, Any] = {"name": device.name}
    if device.attributes:
        out["attributes"] = {key: _attribute(v) for key, v in device.attributes.items()}
    if device.capacity:
        out["capacity"] = {key: {"value": str(v)} for key, v in device.capacity.items()}
    return out


def _attribute(value: object) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"bool": value}
    if isinstance(value, int):
        return {"int": value}
    if isinstance(value, Version):
        return {"version": value.value}
    return {"string": str(value)}


def slice_name(driver: str, node: str, index: int) -> str:
    """The name of slice ``index`` of this driver's pool on ``node`` (a DNS subdomain)."""
    base = f"{node}-{driver}"
    if len(base) > 230:
        digest = hashlib.sha256(base.encode()).hexdigest()[:10]
        base = f"{base[:219].rstrip('-.')}-{digest}"
    return f"{base}-{index}"


class SlicePublisher:
    """Keeps this node's ResourceSlices of one driver equal to its devices."""

    def __init__(self, kube: KubeClient, driver: str, node: str) -> None:
        self.kube = kube
        self.driver = driver
        self.node = node
        self.generation = 0
        self.writes = 0  # slices created, replaced or deleted (for benchmarks and tests)
        self._devices: tuple[Device, ...] = ()
        self._dirty = asyncio.Event()
        self._published = asyncio.Event()
        self._node_uid: str | None = None
        self.backoff = Backoff(initial=0.5, maximum=30.0)
        #: Seconds between checks that the slices are still as published (anyone may delete
        #: them: a restarting kubelet wipes every slice of its node once it can read its Node,
        #: which can be after this driver has registered again and republished).
        self.resync_s = RESYNC_S
        self._settle_until = 0.0

    def update(self, devices: Sequence[Device]) -> None:
        """New devices: publish them (soon, from :meth:`run`)."""
        self._devices = tuple(devices)
        self._published.clear()
        self._dirty.set()

    def request(self) -> None:
        """Reconcile again (after re-registration: the kubelet may have deleted the slices).

        For :data:`SETTLE_FOR_S` afterwards the slices are checked every :data:`SETTLE_S`
        seconds: the restarted kubelet's wipe of its node's slices may still be on its way.
        """
        self._settle_until = time.monotonic() + SETTLE_FOR_S
        self._published.clear()
        self._dirty.set()

    async def wait_published(self) -> None:
        """Wait until the newest devices are published."""
        await self._published.wait()

    async def run(self) -> None:
        """Reconcile on every :meth:`update`/:meth:`request`; retry failures with backoff."""
        while True:
            wait_s = SETTLE_S if time.monotonic() < self._settle_until else self.resync_s
            with contextlib.suppress(TimeoutError):  # a timeout: the periodic check
                await asyncio.wait_for(self._dirty.wait(), wait_s)
            self._dirty.clear()
            try:
                await self.reconcile(self._devices)
            except Exception as exc:  # never fatal: logged, retried with backoff
                delay = self.backoff.next_delay()
                log.warning(
                    "publishing ResourceSlices failed: %s; again in %.1fs",
                    exc,
                    delay,
                    exc_info=not isinstance(exc, KubeApiError),
                )
                self._dirty.set()
                await asyncio.sleep(delay)
                continue
            self.backoff.reset()
            if not self._dirty.is_set():
                self._published.set()

    async def reconcile(self, devices: Sequence[Device]) -> None:
        """Make the slices match ``devices`` now (one pass; conflicts re-list and retry).

        Raises:
            KubeApiError: The API server refused or could not be reached.
        """
        for attempt in range(_CONFLICT_RETRIES):
            try:
                await self._reconcile_once(devices)
                return
            except KubeApiError as exc:
                if exc.status != 409 or attempt == _CONFLICT_RETRIES - 1:
                    raise
                log.info("ResourceSlice conflict (%s); listing again", exc)

    async def _reconcile_once(self, devices: Sequence[Device]) -> None:
        if self._node_uid is None:
            node = await asyncio.to_thread(self.kube.get_node, self.node)
            self._node_uid = str(node.get("metadata", {}).get("uid", ""))
        existing = {
            s["metadata"]["name"]: s
            for s in await asyncio.to_thread(self.kube.list_slices, self.driver, self.node)
        }
        healthy = [device_object(d) for d in devices if d.health == Health.HEALTHY]
        chunks = [
            healthy[i : i + MAX_DEVICES_PER_SLICE]
            for i in range(0, len(healthy), MAX_DEVICES_PER_SLICE)
        ] or [[]]
        wanted = {slice_name(self.driver, self.node, i): c for i, c in enumerate(chunks)}
        generations = [
            int(s.get("spec", {}).get("pool", {}).get("generation", 0)) for s in existing.values()
        ]
        if self._unchanged(existing, wanted, generations):
            self.generation = generations[0]
            log.debug("ResourceSlices up to date (generation %d)", self.generation)
            return
        self.generation = max([self.generation, *generations]) + 1
        for name, chunk in wanted.items():
            body = self._slice(name, chunk, len(wanted))
            current = existing.get(name)
            if current is None:
                await asyncio.to_thread(self.kube.create_slice, body)
            else:
                body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
                await asyncio.to_thread(self.kube.replace_slice, body)
            self.writes += 1
        for name, stale in existing.items():
            if name not in wanted:
                version = stale["metadata"].get("resourceVersion")
                await asyncio.to_thread(self.kube.delete_slice, name, version)
                self.writes += 1
        log.info(
            "published %d devices in %d ResourceSlices (pool %s, generation %d)",
            len(healthy),
            len(wanted),
            self.node,
            self.generation,
        )

    def _unchanged(
        self,
        existing: dict[str, dict[str, Any]],
        wanted: dict[str, list[dict[str, Any]]],
        generations: list[int],
    ) -> bool:
        if set(existing) != set(wanted) or len(set(generations)) != 1:
            return False
        for name, chunk in wanted.items():
            spec = existing[name].get("spec", {})
            pool = spec.get("pool", {})
            owners = existing[name]["metadata"].get("ownerReferences") or []
            if (
                (spec.get("devices") or []) != chunk
                or pool.get("name") != self.node
                or pool.get("resourceSliceCount") != len(wanted)
                or not any(o.get("uid") == self._node_uid for o in owners)
            ):
                return False
        return True

    def _slice(self, name: str, devices: list[dict[str, Any]], count: int) -> dict[str, Any]:
        return {
            "apiVersion": _API_VERSION,
            "kind": "ResourceSlice",
            "metadata": {
                "name": name,
                "ownerReferences": [
                    {
                        "apiVersion": "v1",
                        "kind": "Node",
                        "name": self.node,
                        "uid": self._node_uid,
                        "controller": True,
                    }
                ],
            },
            "spec": {
                "driver": self.driver,
                "nodeName": self.node,
                "pool": {
                    "name": self.node,
                    "generation": self.generation,
                    "resourceSliceCount": count,
                },
                "devices": devices,
            },
        }


async def delete_slices(kube: KubeClient, driver: str, node: str) -> int:
    """Delete every ResourceSlice of ``driver`` on ``node``; how many.

    Raises:
        KubeApiError: The API server refused or could not be reached.
    """
    slices = await asyncio.to_thread(kube.list_slices, driver, node)
    for item in slices:
        await asyncio.to_thread(kube.delete_slice, item["metadata"]["name"])
    return len(slices)

"""Publishing the driver's devices as the ResourceSlices (resource.k8s.io/v1) of one pool.

One pool per node, named after the node; at most 128 devices per slice (64 in a slice with a
tainted device); every slice has ``spec.driver``, ``spec.nodeName``, the pool's generation
and slice count, and an owner reference to the Node's current UID (so the slices go with
it; the Node is read again before every write, so a Node deleted and created again gets
slices owned by its new UID). Slices are named by the API server (``generateName``
``<node>-<driver>-``): names never collide across drivers and nodes.
:meth:`SlicePublisher.reconcile` lists this driver's slices on this node (field selectors,
never names: slices named by an earlier version are adopted too), updates them when the
devices differ (the generation grows by one on every change; capacities are sent in the
API server's canonical form, so an unchanged pool compares equal and is never rewritten),
creates what is missing and deletes what is stale. A device the API server would refuse
(:mod:`kubedevice.dra.model.validation`: lengths in bytes) is left out and reported; the others
are published. A device that is not healthy is published with a taint keyed by why
(:mod:`kubedevice.dra.model.taints`: ``NoSchedule``, the scheduler allocates it to no new claim
unless one tolerates the taint; it stays visible, and allocated claims keep it, unless the
fault is one to evict on: ``NoExecute``); where the API server drops device taints (its
``DRADeviceTaints`` feature gate off),
such devices are left out of the slices instead, with one warning. A conflict re-lists and
tries again; other API errors are retried with backoff by :meth:`SlicePublisher.run` and
logged, never fatal. While a newer instance of the driver serves beside this one (a rolling
upgrade), :meth:`SlicePublisher.defer` holds this one's writes: only the newest instance
writes, so two versions that publish different devices never undo each other's slices.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final

from kubedevice.dra.api.kube import KubeClient
from kubedevice.dra.model import counters
from kubedevice.dra.model.quantity import canonical_quantity
from kubedevice.dra.model.taints import TaintPolicy
from kubedevice.dra.model.types import CounterSet, Device, Health, Version
from kubedevice.dra.model.validation import device_problems
from kubedevice.errors import KubeApiError
from kubedevice.plugin.registration import Backoff

__all__ = [
    "MAX_DEVICES_PER_SLICE",
    "MAX_TAINTED_DEVICES_PER_SLICE",
    "SlicePublisher",
    "delete_slices",
    "device_object",
    "slice_name",
    "slice_name_prefix",
    "unhealthy_taint_key",
]

log = logging.getLogger(__name__)

#: resource.k8s.io/v1: at most 128 devices in one ResourceSlice.
MAX_DEVICES_PER_SLICE: Final = 128
#: ...and at most 64 in one that has a device with taints.
MAX_TAINTED_DEVICES_PER_SLICE: Final = 64
_API_VERSION: Final = "resource.k8s.io/v1"
_CONFLICT_RETRIES: Final = 5
#: Seconds between checks that this driver's slices are still there and as published (a
#: LIST with field selectors; nothing is written when they are), while no watch of them
#: runs; with the watch, a change by anyone else is reconciled when it happens.
RESYNC_S: Final = 30.0
#: Right after a (re-)registration the slices are checked this often...
SETTLE_S: Final = 2.0
#: ...for this many seconds: a restarting kubelet deletes every ResourceSlice of its node
#: (no delay, retried until it can read its Node), possibly after this driver republished.
SETTLE_FOR_S: Final = 30.0


def device_object(
    device: Device, taints: TaintPolicy | None = None, *, shared: bool = True
) -> dict[str, Any]:
    """``device`` as a ResourceSlice device (JSON); with ``taints``' taints if not healthy;
    ``shared=False``: without ``allowMultipleAllocations`` and request policies."""
    out: dict[str, Any] = {"name": device.name}
    if device.attributes:
        out["attributes"] = {key: _attribute(v) for key, v in device.attributes.items()}
    if device.capacity:
        out["capacity"] = {
            key: {"value": canonical_quantity(str(v))} for key, v in device.capacity.items()
        }
    if device.consumes_counters:
        out["consumesCounters"] = counters.consumption_objects(device)
    if shared and device.allow_multiple_allocations:
        out["allowMultipleAllocations"] = True
        for key, policy in device.request_policies.items():
            out["capacity"][key]["requestPolicy"] = policy.to_json()
    if taints is not None and device.health != Health.HEALTHY:
        out["taints"] = taints.taints(device)
    return out


def _chunks(devices: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """``devices`` in slice-sized runs, in order: at most 128 to a slice, or 64 in a slice
    that has a tainted device or one that consumes counters (the API server's limits)."""
    chunks: list[list[dict[str, Any]]] = []
    current: list[dict[str, Any]] = []
    tainted = False
    for device in devices:
        taints = bool(device.get("taints") or device.get("consumesCounters"))
        limit = MAX_TAINTED_DEVICES_PER_SLICE if tainted or taints else MAX_DEVICES_PER_SLICE
        if len(current) >= limit:
            chunks.append(current)
            current, tainted = [], False
        current.append(device)
        tainted = tainted or taints
    chunks.append(current)
    return chunks


def unhealthy_taint_key(driver: str) -> str:
    """The key of the taint on this driver's devices that are not healthy and give no fault."""
    return f"{driver}/unhealthy"


def _without_times(devices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``devices`` as published, less the ``timeAdded`` the API server puts on each taint."""
    out = []
    for d in devices:
        taints = d.get("taints")
        if taints:
            d = {**d, "taints": [{k: v for k, v in t.items() if k != "timeAdded"} for t in taints]}
        out.append(d)
    return out


def _keep_times(chunk: list[dict[str, Any]], existing: list[dict[str, Any]]) -> None:
    """Give each taint in ``chunk`` the ``timeAdded`` it already has in the ``existing`` slices."""
    added = {
        (d.get("name"), t.get("key"), t.get("effect")): t["timeAdded"]
        for current in existing
        for d in current.get("spec", {}).get("devices") or []
        for t in d.get("taints") or []
        if t.get("timeAdded")
    }
    for d in chunk:
        for t in d.get("taints", ()):
            when = added.get((d["name"], t["key"], t["effect"]))
            if when is not None:
                t["timeAdded"] = when


def _taints_dropped(sent: dict[str, Any], stored: dict[str, Any]) -> bool:
    """Whether the API server stored ``sent`` without the taints it carried."""
    wanted = {d["name"] for d in sent["spec"].get("devices") or [] if d.get("taints")}
    if not wanted:
        return False
    kept = {d.get("name") for d in stored.get("spec", {}).get("devices") or [] if d.get("taints")}
    return not wanted <= kept


def _shares_dropped(sent: dict[str, Any], stored: dict[str, Any]) -> bool:
    """Whether the API server stored ``sent`` without ``allowMultipleAllocations``."""
    wanted = {
        d["name"] for d in sent["spec"].get("devices") or [] if d.get("allowMultipleAllocations")
    }
    kept = {
        d.get("name")
        for d in stored.get("spec", {}).get("devices") or []
        if d.get("allowMultipleAllocations")
    }
    return not wanted <= kept


def _attribute(value: object) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"bool": value}
    if isinstance(value, int):
        return {"int": value}
    if isinstance(value, Version):
        return {"version": value.value}
    return {"string": str(value)}


def slice_name(driver: str, node: str, index: int) -> str:
    """The name an earlier version gave slice ``index`` of the pool (adopted like any other
    of the driver's slices on the node; new slices get :func:`slice_name_prefix`)."""
    return f"{slice_name_prefix(driver, node)}{index}"


def slice_name_prefix(driver: str, node: str) -> str:
    """The ``metadata.generateName`` of this driver's slices on ``node``: the API server adds
    a unique suffix, so two driver/node pairs with the same ``<node>-<driver>`` never collide.
    """
    base = f"{node}-{driver}"
    if len(base) > 230:
        digest = hashlib.sha256(base.encode()).hexdigest()[:10]
        base = f"{base[:219].rstrip('-.')}-{digest}"
    return f"{base}-"


def _key(content: dict[str, Any]) -> str:
    return json.dumps(content, sort_keys=True)


def _content(spec: dict[str, Any]) -> dict[str, Any]:
    """What a stored slice's spec holds, in the shape of a chunk: its counter sets, or its
    devices less the ``timeAdded`` the API server puts on each taint."""
    if spec.get("sharedCounters"):
        return {"sharedCounters": spec["sharedCounters"]}
    return {"devices": _without_times(spec.get("devices") or [])}


class SlicePublisher:
    """Keeps this node's ResourceSlices of one driver equal to its devices."""

    def __init__(
        self, kube: KubeClient, driver: str, node: str, taints: TaintPolicy | None = None
    ) -> None:
        self.kube = kube
        self.driver = driver
        self.node = node
        self.taints = taints or TaintPolicy(driver)
        #: Unhealthy devices are published tainted until the API server is seen dropping
        #: the taints; then they are left out.
        self.taints_supported = True
        #: Counter sets and consumptions are published until the API server is seen
        #: dropping them (see :mod:`kubedevice.dra.model.counters`); then devices go without.
        self.counters_supported = True
        self._counter_sets: tuple[CounterSet, ...] = ()
        #: Devices that allow multiple allocations are published so until the API server is
        #: seen dropping that (DRAConsumableCapacity off); then they are published unshared.
        self.shares_supported = True
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
        self._reported: set[tuple[str, str]] = set()
        self.deferring = False  # a newer instance publishes (see defer())
        #: Asked at every wake (the periodic check included): whether to defer now.
        self.defer_to: Callable[[], Awaitable[bool]] | None = None
        self._flipped = asyncio.Event()  # set (and replaced) on each change of deferring
        self._listed = asyncio.Event()  # a list gave a version to watch from
        self._listed_version = ""
        self._seen_version = ""  # the newest version the watch has seen (events, bookmarks)
        self._own_versions: set[str] = set()  # of slices this publisher wrote
        self._unsure: set[str] | None = None  # while writing: versions seen, ours or not
        #: Whether the watch of the slices runs (then nothing is checked periodically).
        self.watching = False
        #: Whether a reconcile has succeeded (the slices were as published at least once).
        self.reconciled = False
        #: Why the last reconcile failed; ``None`` once one succeeds.
        self.last_error: str | None = None

    def update(self, devices: Sequence[Device], counter_sets: Sequence[CounterSet] = ()) -> None:
        """New devices (and the counter sets they consume from): publish them soon."""
        self._devices = tuple(devices)
        self._counter_sets = tuple(counter_sets)
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

    def defer(self, deferring: bool) -> None:
        """Hold (``True``) or resume the writes: while a newer instance of the driver serves
        beside this one, it alone keeps the slices; resuming reconciles at once."""
        if deferring == self.deferring:
            return
        self.deferring = deferring
        log.info(
            "a newer instance of the driver serves on this node: it publishes the slices"
            if deferring
            else "no newer instance of the driver serves on this node: publishing again"
        )
        if deferring:
            self._dirty.set()  # wakes the loop: nothing is written while deferring
        else:
            self.request()
        flipped, self._flipped = self._flipped, asyncio.Event()
        flipped.set()

    def recheck(self) -> None:
        """Ask :attr:`defer_to` again now (another instance's socket came or went)."""
        self._dirty.set()

    async def wait_deferring(self, deferring: bool) -> None:
        """Wait until :attr:`deferring` is ``deferring``."""
        while self.deferring != deferring:
            await self._flipped.wait()

    async def wait_published(self) -> None:
        """Wait until the newest devices are published."""
        await self._published.wait()

    async def run(self) -> None:
        """Reconcile on every :meth:`update`/:meth:`request` and whenever someone else
        changes the slices (a watch: no periodic check while it runs); retry failures with
        backoff."""
        watcher = asyncio.create_task(self._watch(), name="watch ResourceSlices")
        try:
            await self._reconcile_forever()
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher

    async def _reconcile_forever(self) -> None:
        while True:
            if time.monotonic() < self._settle_until:
                wait_s: float | None = SETTLE_S
            else:
                # the watch wakes it on every change; while deferring, the periodic wake
                # also notices a newer instance that is gone (killed: no socket event)
                wait_s = None if self.watching and not self.deferring else self.resync_s
            with contextlib.suppress(TimeoutError):  # a timeout: the periodic check
                await asyncio.wait_for(self._dirty.wait(), wait_s)
            self._dirty.clear()
            if self.defer_to is not None:
                self.defer(await self.defer_to())
            if self.deferring:  # the newer instance's slices stand
                self._published.set()
                continue
            try:
                await self.reconcile(self._devices)
            except Exception as exc:  # never fatal: logged, retried with backoff
                self.last_error = str(exc) or type(exc).__name__
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
            self.reconciled, self.last_error = True, None
            if not self._dirty.is_set():
                self._published.set()

    async def _watch(self) -> None:
        """Watch the slices from the last list's version. When the API server ends the watch
        (after about :data:`~kubedevice.dra.api.kube.WATCH_TIMEOUT_S`), watch again from
        the newest version seen, without a list; when it fails (410: that version is too
        old), list again (what changed meanwhile is reconciled) and watch from there."""
        backoff = Backoff(initial=1.0, maximum=RESYNC_S)
        version: str | None = None
        while True:
            if version is None:
                await self._listed.wait()
                self._listed.clear()
                version = self._listed_version
            self._seen_version = version
            self.watching = True
            try:
                await self.kube.watch_slices(self.driver, self.node, version, self._on_event)
                failed: KubeApiError | None = None
            except KubeApiError as exc:
                failed = exc
            finally:
                self.watching = False
            if failed is None:
                # the API server ended it (its timeout): watch on from the last version seen
                # (its bookmarks keep that recent), with no list: a quiet node makes none
                version = self._seen_version
                backoff.reset()
                continue
            version = None
            self._dirty.set()  # list again: a version to watch from, and what was missed
            if failed.status == 410:  # too old: list and go on
                backoff.reset()
                continue
            delay = backoff.next_delay()
            log.info(
                "watching ResourceSlices failed: %s; checked every %gs until it works "
                "(again in %.1fs)",
                failed,
                self.resync_s,
                delay,
            )
            await asyncio.sleep(delay)

    def _on_event(self, kind: str, version: str) -> None:
        if version:
            self._seen_version = version
        if kind == "BOOKMARK" or version in self._own_versions:
            return  # the watch's progress, or the echo of a write of ours
        if self._unsure is not None:  # a write's echo may come before its answer: see after
            self._unsure.add(version)
            return
        log.debug("ResourceSlice %s (version %s) by someone else; reconciling", kind, version)
        self._published.clear()
        self._dirty.set()

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
        # This driver's slices of this node's pool, found by their fields, never by name:
        # slices of an earlier version (named <node>-<driver>-<n>) are adopted the same way.
        listed, self._listed_version = await self.kube.list_slices_at(self.driver, self.node)
        self._listed.set()
        self._own_versions.clear()
        existing = sorted(listed, key=lambda s: str(s["metadata"].get("name")))
        shared = self.shares_supported
        if self.taints_supported:
            published = [device_object(d, self.taints, shared=shared) for d in devices]
        else:
            published = [
                device_object(d, shared=shared) for d in devices if d.health == Health.HEALTHY
            ]
        published = self._valid(published)
        sets = [counters.counter_set_object(c) for c in self._counter_sets]
        if not self.counters_supported:
            published, sets = [counters.without_counters(d) for d in published], []
        chunks: list[dict[str, Any]] = [
            {"sharedCounters": c} for c in counters.counter_set_chunks(sets)
        ] + [{"devices": c} for c in _chunks(published)]
        generations = [
            int(s.get("spec", {}).get("pool", {}).get("generation", 0)) for s in existing
        ]
        if self._node_uid is not None and self._unchanged(existing, chunks, generations):
            self.generation = generations[0]
            log.debug("ResourceSlices up to date (generation %d)", self.generation)
            return
        # About to write: the Node's UID now (a Node deleted and created again has a new
        # one; slices owned by the old UID are garbage-collected).
        node = await self.kube.get_node(self.node)
        uid = str(node.get("metadata", {}).get("uid", ""))
        if uid != self._node_uid and self._node_uid is not None:
            log.info("Node %s has a new UID %s (was %s)", self.node, uid, self._node_uid)
        self._node_uid = uid
        if self._unchanged(existing, chunks, generations):
            self.generation = generations[0]
            return
        self.generation = max([self.generation, *generations]) + 1
        dropped = counters_gone = unshared = False
        self._unsure = set()
        try:
            for index, chunk in enumerate(chunks):
                current = existing[index] if index < len(existing) else None
                _keep_times(chunk.get("devices", []), existing)
                body = self._slice(chunk, len(chunks))
                if current is None:
                    stored = await self.kube.create_slice(body)
                else:
                    body["metadata"]["name"] = current["metadata"]["name"]
                    body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
                    stored = await self.kube.replace_slice(body)
                self._own_versions.add(str(stored.get("metadata", {}).get("resourceVersion", "")))
                self.writes += 1
                dropped = dropped or _taints_dropped(body, stored)
                counters_gone = counters_gone or counters.counters_dropped(body, stored)
                unshared = unshared or _shares_dropped(body, stored)
            for stale in existing[len(chunks) :]:
                version = stale["metadata"].get("resourceVersion")
                await self.kube.delete_slice(stale["metadata"]["name"], version)
                self.writes += 1
        finally:
            foreign, self._unsure = (self._unsure or set()) - self._own_versions, None
            if foreign:
                self._on_event("", next(iter(foreign)))
        if unshared:
            self.shares_supported = False
            log.warning(
                "the API server dropped allowMultipleAllocations (its DRAConsumableCapacity "
                "feature gate is off?): shared devices are published unshared, one claim each"
            )
        if counters_gone and self.counters_supported:
            self.counters_supported = False
            log.warning(
                "the API server dropped the counter sets and the devices' consumesCounters "
                "(its DRAPartitionableDevices feature gate is off?): devices are published "
                "without them, so the scheduler no longer keeps partitions that overlap apart"
            )
            await self._reconcile_once(devices)
            return
        if dropped:
            self.taints_supported = False
            log.warning(
                "the API server dropped the device taints (its DRADeviceTaints feature gate "
                "is off?): devices that are not healthy are left out of the ResourceSlices "
                "instead"
            )
        if dropped or unshared:
            await self._reconcile_once(devices)
            return
        tainted = sum(1 for d in published if d.get("taints"))
        log.info(
            "published %d devices (%d tainted) in %d ResourceSlices (pool %s, generation %d)",
            len(published),
            tainted,
            len(chunks),
            self.node,
            self.generation,
        )

    def _valid(self, published: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The devices the API server would take; each other one is left out and reported
        (once per device and problem): one bad device never costs the whole pool."""
        out = []
        reported: set[tuple[str, str]] = set()
        for device in published:
            problems = device_problems(device)
            if not problems:
                out.append(device)
                continue
            for problem in problems:
                key = (str(device.get("name")), problem)
                reported.add(key)
                if key not in self._reported:
                    log.warning("device %s is not published: %s", device.get("name"), problem)
        self._reported = reported
        return out

    def _unchanged(
        self,
        existing: list[dict[str, Any]],
        chunks: list[dict[str, Any]],
        generations: list[int],
    ) -> bool:
        if len(existing) != len(chunks) or len(set(generations)) != 1:
            return False
        for current in existing:
            spec = current.get("spec", {})
            pool = spec.get("pool", {})
            owners = current["metadata"].get("ownerReferences") or []
            if (
                pool.get("name") != self.node or pool.get("resourceSliceCount") != len(chunks)
            ) or not any(o.get("uid") == self._node_uid for o in owners):
                return False
        stored = sorted(_key(_content(s.get("spec", {}))) for s in existing)
        return stored == sorted(_key(c) for c in chunks)

    def _slice(self, content: dict[str, Any], count: int) -> dict[str, Any]:
        return {
            "apiVersion": _API_VERSION,
            "kind": "ResourceSlice",
            "metadata": {
                "generateName": slice_name_prefix(self.driver, self.node),
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
                **content,
            },
        }


async def delete_slices(kube: KubeClient, driver: str, node: str) -> int:
    """Delete every ResourceSlice of ``driver`` on ``node``; how many.

    Raises:
        KubeApiError: The API server refused or could not be reached.
    """
    slices = await kube.list_slices(driver, node)
    for item in slices:
        await kube.delete_slice(item["metadata"]["name"])
    return len(slices)

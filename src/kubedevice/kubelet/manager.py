"""Device sets per resource, capacity/allocatable, endpoints, grace period, pod devices.

Mirrors the kubelet's ``manager.go`` state half (the admission half is ``admission.py``):
every ListAndWatch message replaces a resource's device sets; a stream end marks all its
devices unhealthy (allocatable 0, capacity kept) and starts the grace period; allocations
(pod → container → resource → devices + cached Allocate response) are kept here and in the
checkpoint, which is rewritten after every allocation like the kubelet does and after
device-set changes at most once a second (a flapping plugin would otherwise pin the CPU).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from kubedevice._api import NODE_WITHOUT_TOPOLOGY
from kubedevice.errors import CheckpointError
from kubedevice.kubelet.checkpoint import CheckpointData, CheckpointEntry, CheckpointWriter
from kubedevice.kubelet.endpoint import PluginEndpoint, allocation_decodes
from kubedevice.kubelet.events import EventLog, Notifier
from kubedevice.kubelet.types import (
    DeviceStatus,
    ListAndWatchEvent,
    NodeStatus,
    PluginOptions,
    ResourceRemovedEvent,
    ResourceStatus,
    StreamEndEvent,
)

__all__ = ["CHECKPOINT_BURST_S", "CHECKPOINT_INTERVAL_S", "Allocation", "DeviceManager"]

log = logging.getLogger(__name__)

#: Device-set changes (ListAndWatch messages) reach the checkpoint at most this often: the
#: first at once, later ones within the interval coalesced into one write at its end.
#: Allocations and frees are written at once, always.
CHECKPOINT_INTERVAL_S = 1.0
#: A resource's first device-set change (or its first after an interval) is written within
#: this long, together with every other change made meanwhile.
CHECKPOINT_BURST_S = 0.05


@dataclass(slots=True)
class Allocation:
    """Devices of one (pod, container, resource) and the cached Allocate response bytes."""

    device_ids: tuple[str, ...]
    by_numa: dict[int, list[str]]
    response: bytes | None


@dataclass(slots=True)
class _Resource:
    name: str
    devices: dict[str, DeviceStatus] = field(default_factory=dict)
    healthy: set[str] = field(default_factory=set)
    unhealthy: set[str] = field(default_factory=set)
    endpoint: PluginEndpoint | None = None
    options: PluginOptions = field(default_factory=PluginOptions)
    stop_time: float | None = None
    has_sets: bool = False
    grace: asyncio.TimerHandle | None = None


class DeviceManager:
    """The device manager's state; all methods run on the emulator's event loop."""

    def __init__(
        self,
        device_plugin_dir: Path,
        checkpoint: CheckpointWriter,
        events: EventLog,
        notifier: Notifier,
        *,
        grace_period_s: float,
        per_socket_clients: bool,
        checkpoint_interval_s: float = CHECKPOINT_INTERVAL_S,
    ) -> None:
        self.dir = device_plugin_dir
        self.checkpoint_interval_s = checkpoint_interval_s
        #: when each resource's ListAndWatch messages last caused a checkpoint write
        self._last_write: dict[str, float] = {}
        self._deferred: asyncio.TimerHandle | None = None
        self._deferred_at = 0.0  # when it is due (monotonic)
        self.checkpoint = checkpoint
        self.events = events
        self.notifier = notifier
        self.grace_period_s = grace_period_s
        self.per_socket_clients = per_socket_clients
        self.resources: dict[str, _Resource] = {}
        self.clients: dict[tuple[str, str], PluginEndpoint] = {}
        # Every endpoint whose connection is still open, including ones a newer
        # registration replaced (their streams keep running, contract.md#second-registration).
        self._live: set[PluginEndpoint] = set()
        self.pod_devices: dict[str, dict[str, dict[str, Allocation]]] = {}
        self.allocated: dict[str, set[str]] = {}
        self._closing: set[asyncio.Task[None]] = set()
        # Caches, invalidated by ``_devices_changed`` (device sets change far less often
        # than allocations, which rewrite the checkpoint every time).
        self._registered_dirty = True
        self._numa: tuple[int, ...] | None = None

    def _devices_changed(self) -> None:
        self._registered_dirty = True
        self._numa = None

    # ------------------------------------------------------------------ keys / lookups

    def _client_key(self, resource: str, socket: Path) -> tuple[str, str]:
        return (resource, str(socket) if self.per_socket_clients else "")

    def endpoint(self, resource: str) -> PluginEndpoint | None:
        """The endpoint currently stored for ``resource`` (None if never or no longer)."""
        r = self.resources.get(resource)
        return r.endpoint if r is not None else None

    def _res(self, name: str) -> _Resource:
        r = self.resources.get(name)
        if r is None:
            r = self.resources[name] = _Resource(name)
        return r

    # ------------------------------------------------------------------ plugin lifecycle

    def plugin_connected(self, ep: PluginEndpoint) -> None:
        """Store ``ep`` for its resource (replacing any previous one) and start its reader."""
        self.clients[self._client_key(ep.resource, ep.socket_path)] = ep
        self._live.add(ep)
        r = self._res(ep.resource)
        r.endpoint = ep
        r.options = ep.options
        r.stop_time = None
        if r.grace is not None:
            r.grace.cancel()
            r.grace = None
        ep.start_reader(self._on_message, self._on_stream_end)
        self.notifier.notify()

    def _on_message(self, ep: PluginEndpoint, devices: tuple[DeviceStatus, ...]) -> None:
        r = self._res(ep.resource)
        r.devices = {d.id: d for d in devices}
        r.healthy = {d.id for d in devices if d.healthy}
        r.unhealthy = {d.id for d in devices if not d.healthy}
        r.has_sets = True
        self._devices_changed()
        self._write_soon(ep.resource)
        self.events.append(
            ListAndWatchEvent(
                t=self.events.now(),
                resource=ep.resource,
                socket=str(ep.socket_path),
                devices=len(r.devices),
                healthy=len(r.healthy),
            )
        )

    def _on_stream_end(self, ep: PluginEndpoint, reason: str) -> None:
        t = self.events.now()  # before the grace timer is armed
        key = self._client_key(ep.resource, ep.socket_path)
        current = self.clients.get(key)
        disconnected = False
        if current is not None:
            # Released kubelets (per-name keys) find whatever client is registered under the
            # name now, possibly a newer one, and disconnect it (kubernetes#121994).
            del self.clients[key]
            self._close_later(current)
            r = self.resources.get(ep.resource)
            if r is not None and r.endpoint is current:
                self._plugin_disconnected(r)
                disconnected = True
        if current is not ep:
            self._close_later(ep)
        self.events.append(
            StreamEndEvent(
                t=t,
                resource=ep.resource,
                socket=str(ep.socket_path),
                reason=reason,
                disconnected=disconnected,
            )
        )

    def _close_later(self, ep: PluginEndpoint) -> None:
        ep.mark_stopped()
        self._live.discard(ep)
        task = asyncio.get_running_loop().create_task(ep.close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    @staticmethod
    def _mark_unhealthy(r: _Resource) -> None:
        # the kubelet's markResourceUnhealthy: every device, whatever its last report
        r.unhealthy |= r.healthy
        r.healthy = set()
        r.devices = {
            k: d if not d.healthy else dataclasses.replace(d, health="Unhealthy")
            for k, d in r.devices.items()
        }

    def _plugin_disconnected(self, r: _Resource) -> None:
        self._mark_unhealthy(r)
        r.stop_time = self.events.now()
        self._devices_changed()
        self._arm_grace(r)
        self.write_checkpoint()

    def _arm_grace(self, r: _Resource) -> None:
        if r.grace is not None:
            r.grace.cancel()
        r.grace = asyncio.get_running_loop().call_later(
            self.grace_period_s, self._grace_expired, r.name
        )

    def _grace_expired(self, name: str) -> None:
        r = self.resources.get(name)
        if r is None or r.stop_time is None:
            return
        del self.resources[name]
        self._devices_changed()
        self.events.append(ResourceRemovedEvent(t=self.events.now(), resource=name))
        self.write_checkpoint()

    async def disconnect_all(self) -> None:
        """Kubelet stop: disconnect every client (like plugins dying), close channels."""
        eps = list(self.clients.values())
        self.clients.clear()
        for r in self.resources.values():
            if r.endpoint is not None and r.stop_time is None:
                self._mark_unhealthy(r)
                r.stop_time = self.events.now()
            if r.grace is not None:
                r.grace.cancel()
                r.grace = None
        self._devices_changed()
        # a kubelet that stops drops every connection, replaced ones included
        all_eps = {id(e): e for e in (*eps, *self._live)}
        self._live.clear()
        for r in self.resources.values():
            if r.endpoint is not None:
                all_eps[id(r.endpoint)] = r.endpoint
        await asyncio.gather(*(e.close() for e in all_eps.values()), return_exceptions=True)
        # readers ending now may schedule more closes
        while pending := [t for t in self._closing if not t.done()]:
            await asyncio.gather(*pending, return_exceptions=True)
        self.flush_checkpoint()
        self.notifier.notify()

    def reset(self) -> None:
        """Forget everything (a new kubelet process starts empty)."""
        if self._deferred is not None:
            self._deferred.cancel()
            self._deferred = None
        self._last_write.clear()
        for r in self.resources.values():
            if r.grace is not None:
                r.grace.cancel()
        self.resources.clear()
        self.clients.clear()
        self._live.clear()
        self.pod_devices.clear()
        self.allocated.clear()
        self.checkpoint.clear()
        self.checkpoint.set_registered({})
        self._devices_changed()

    # ------------------------------------------------------------------ checkpoint

    def restore(self, data: CheckpointData) -> None:
        """Load allocations and stopped resources from a checkpoint (kubelet start-up)."""
        for e in data.entries or ():
            if not allocation_decodes(e.alloc_resp):  # the kubelet skips such an entry
                log.error(
                    "checkpoint: cannot decode AllocResp of pod %s container %s resource %s",
                    e.pod_uid,
                    e.container,
                    e.resource,
                )
                continue
            by_numa = {k: list(v or ()) for k, v in (e.device_ids or {}).items()}
            ids: list[str] = []
            for v in by_numa.values():
                ids.extend(x for x in v if x not in ids)
            self._store(
                e.pod_uid, e.container, e.resource, Allocation(tuple(ids), by_numa, e.alloc_resp)
            )
        for name in data.registered or {}:
            r = self._res(name)
            r.has_sets = True
            r.stop_time = self.events.now()
            self._arm_grace(r)
        self._devices_changed()
        self.write_checkpoint()

    def _write_soon(self, resource: str) -> None:
        """A device-set change of ``resource``: write within ``CHECKPOINT_BURST_S`` (every
        change of that window shares the write), unless its previous message caused a write
        less than an interval ago; then once, at the end of that interval.

        The 200 first messages after a restart of a busy node come over about a second: one
        write per message was a fifth of the emulator's CPU. Whoever looks goes through
        :meth:`flush_checkpoint` first (the emulator's ``node``, waits and control ops), so
        what they see is on disk. A plugin flapping device health would otherwise rewrite
        (and re-hash) the whole checkpoint on every message. Each write is still atomic
        (temp file + rename), so a crash loses at most the last interval's health changes,
        never an allocation.
        """
        now = time.monotonic()
        wait = self._last_write.get(resource, -math.inf) + self.checkpoint_interval_s - now
        if wait <= 0:
            self._last_write[resource] = now
            wait = min(CHECKPOINT_BURST_S, self.checkpoint_interval_s)
        else:
            self._last_write[resource] = now + wait
        due = now + wait
        if self._deferred is not None:
            if self._deferred_at <= due:
                return  # a write is due anyway; it will carry this change
            self._deferred.cancel()  # another resource's, later: this one's carries it
        self._deferred_at = due
        self._deferred = asyncio.get_running_loop().call_later(wait, self.write_checkpoint)

    def flush_checkpoint(self) -> None:
        """Write a coalesced device-set change now, if one is pending."""
        if self._deferred is not None:
            self.write_checkpoint()

    def write_checkpoint(self) -> None:
        """Rewrite the checkpoint (healthy IDs per resource + all allocations)."""
        if self._deferred is not None:
            self._deferred.cancel()
            self._deferred = None
        if self._registered_dirty:
            self.checkpoint.set_registered(
                {n: sorted(r.healthy) for n, r in self.resources.items() if r.has_sets}
            )
            self._registered_dirty = False
        try:
            self.checkpoint.write()
        except OSError as exc:  # the kubelet logs and carries on
            log.error("failed to write checkpoint: %s", exc)
        self.notifier.notify()

    @staticmethod
    def read_checkpoint(path: Path) -> CheckpointData | None:
        """The checkpoint at ``path``; None if absent. ``CheckpointError`` if unreadable."""
        from kubedevice._regular_file import NotRegularFileError, read_regular
        from kubedevice.kubelet.checkpoint import MAX_CHECKPOINT_BYTES, loads

        try:
            raw = read_regular(path, MAX_CHECKPOINT_BYTES)
        except FileNotFoundError:
            return None
        except NotRegularFileError as exc:
            raise CheckpointError(f"{path} {exc.strerror}") from None
        except OSError as exc:
            raise CheckpointError(f"cannot read {path}: {exc}") from exc
        if len(raw) > MAX_CHECKPOINT_BYTES:
            raise CheckpointError(f"{path} is larger than {MAX_CHECKPOINT_BYTES} bytes")
        return loads(raw)

    # ------------------------------------------------------------------ allocations

    def _store(self, pod_uid: str, container: str, resource: str, a: Allocation) -> None:
        self.pod_devices.setdefault(pod_uid, {}).setdefault(container, {})[resource] = a
        self.allocated.setdefault(resource, set()).update(a.device_ids)
        self.checkpoint.set_entry(
            CheckpointEntry(pod_uid, container, resource, a.by_numa, a.response)
        )

    def add_allocation(
        self, pod_uid: str, container: str, resource: str, ids: Iterable[str], response: bytes
    ) -> None:
        """Record a successful Allocate and write the checkpoint."""
        ids = tuple(ids)
        r = self.resources.get(resource)
        by_numa: dict[int, list[str]] = {}
        for i in ids:
            d = r.devices.get(i) if r is not None else None
            for n in d.numa if d is not None and d.numa else (NODE_WITHOUT_TOPOLOGY,):
                by_numa.setdefault(n, []).append(i)
        self._store(pod_uid, container, resource, Allocation(ids, by_numa, response))
        self.write_checkpoint()

    def remove_pod(self, pod_uid: str) -> None:
        """Free every device of ``pod_uid`` and write the checkpoint."""
        if self.pod_devices.pop(pod_uid, None) is None:
            return
        self.checkpoint.remove_pod(pod_uid)
        self._recompute_allocated()
        self.write_checkpoint()

    def _recompute_allocated(self) -> None:
        alloc: dict[str, set[str]] = {}
        for containers in self.pod_devices.values():
            for resources in containers.values():
                for res, a in resources.items():
                    alloc.setdefault(res, set()).update(a.device_ids)
        self.allocated = alloc

    def container_devices(self, pod_uid: str, container: str) -> dict[str, Allocation]:
        """Allocations of one container, by resource."""
        return self.pod_devices.get(pod_uid, {}).get(container, {})

    def pending_rpcs(self) -> list[tuple[str, str, Path, float]]:
        """Plugin RPCs in flight: (rpc, resource, socket, monotonic start), oldest first."""
        eps = {id(e): e for e in self._live}
        for r in self.resources.values():
            if r.endpoint is not None:
                eps[id(r.endpoint)] = r.endpoint
        out = [
            (rpc, e.resource, e.socket_path, start)
            for e in eps.values()
            for rpc, start in e.pending.values()
        ]
        return sorted(out, key=lambda x: x[3])

    # ------------------------------------------------------------------ status

    def resource_status(self, name: str) -> ResourceStatus | None:
        """Status of one resource; None if the node does not list it."""
        r = self.resources.get(name)
        if r is None or not r.has_sets:
            return None
        now = self.events.now()
        return ResourceStatus(
            name=name,
            capacity=len(r.healthy) + len(r.unhealthy),
            allocatable=len(r.healthy),
            allocated=len(self.allocated.get(name, ())),
            connected=r.endpoint is not None and r.stop_time is None,
            endpoint=str(r.endpoint.socket_path) if r.endpoint is not None else None,
            devices=tuple(r.devices[k] for k in sorted(r.devices)),
            options=r.options,
            stopped_for_s=None if r.stop_time is None else now - r.stop_time,
        )

    def node(self) -> NodeStatus:
        """Capacity, allocatable and devices of every listed resource."""
        out: dict[str, ResourceStatus] = {}
        for name in sorted(self.resources):
            s = self.resource_status(name)
            if s is not None:
                out[name] = s
        return NodeStatus(resources=out, numa_nodes=self.numa_nodes())

    def numa_nodes(self) -> tuple[int, ...]:
        """The emulated machine's NUMA nodes: every id some device reports."""
        if self._numa is None:
            ids: set[int] = set()
            for r in self.resources.values():
                for d in r.devices.values():
                    ids.update(d.numa)
            self._numa = tuple(sorted(ids))
        return self._numa

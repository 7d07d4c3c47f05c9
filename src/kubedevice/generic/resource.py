"""One generic resource as an SDK plugin: device state, vanished/allocated tracking, allocate.

Scans and health results are fed in by :mod:`kubedevice.generic.runner`; this class turns
them into full snapshots (pushed with :meth:`DevicePlugin.update`) and answers the RPC
hooks. Lifetime rules for devices that disappear are documented in ``docs/generic-config.md``:
a never-allocated device leaves the list at once; an allocated one stays ``Unhealthy``
for ``keepUnhealthySeconds`` (or until it comes back, when it is ``Healthy`` again).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from kubedevice._api import KUBELET_MAX_RECV_MESSAGE_BYTES
from kubedevice.generic.config import GroupSpec, ResourceSpec
from kubedevice.generic.discovery import PhysicalDevice
from kubedevice.generic.health import CheckResult
from kubedevice.generic.ids import replica_id, split_replica
from kubedevice.generic.policy import preferred_allocation
from kubedevice.generic.templates import CDI_VARIABLES, ENV_VARIABLES, Template
from kubedevice.plugin import (
    ContainerAllocation,
    Device,
    DevicePlugin,
    DeviceSpec,
    Health,
    Mount,
)

__all__ = ["GenericResourcePlugin", "Snapshot"]

log = logging.getLogger(__name__)

Snapshot = tuple[Device, ...]

_HEALTH_WIRE = {Health.HEALTHY: "Healthy", Health.UNHEALTHY: "Unhealthy"}


def _varint_len(value: int) -> int:
    return max(1, (value.bit_length() + 6) // 7)


def _entry_len(id_len: int, health_len: int, topology_len: int) -> int:
    """Encoded bytes of one ``Device`` inside a ``ListAndWatchResponse``."""
    inner = 1 + _varint_len(id_len) + id_len + 1 + _varint_len(health_len) + health_len
    inner += topology_len
    return 1 + _varint_len(inner) + inner


@dataclass(slots=True)
class _Entry:
    """What the plugin knows about one physical device."""

    phys: PhysicalDevice
    group: GroupSpec
    present: bool = True
    check: CheckResult | None = None
    expiry: asyncio.TimerHandle | None = None
    cache: tuple[PhysicalDevice, GroupSpec, Health, tuple[Device, ...]] | None = None


class GenericResourcePlugin(DevicePlugin):
    """The SDK plugin for one configured resource."""

    advertise_preferred_allocation = True

    def __init__(self, spec: ResourceSpec, keep_unhealthy_seconds: float) -> None:
        self.resource_name = spec.name
        self.spec = spec
        self.keep_unhealthy_seconds = keep_unhealthy_seconds
        self._entries: dict[str, _Entry] = {}
        self._allocated: set[str] = set()
        self._snapshot: Snapshot | None = None
        self._waiters: list[asyncio.Future[None]] = []
        self._closed = False
        self._scanned = False
        #: The kubelet's message limit; a larger list is never built.
        self.max_message_bytes = KUBELET_MAX_RECV_MESSAGE_BYTES
        self._too_big: tuple[int, int] | None = None

    # ----------------------------------------------------------------- state in

    def reconfigure(self, spec: ResourceSpec, keep_unhealthy_seconds: float) -> None:
        """Adopt a changed spec (same resource name); call :meth:`apply_scan` next."""
        self.spec = spec
        self.keep_unhealthy_seconds = keep_unhealthy_seconds

    def apply_scan(self, devices: Iterable[PhysicalDevice]) -> None:
        """Adopt the devices a scan found; vanished ones follow the lifetime rules."""
        found = {d.id: d for d in devices}
        loop = asyncio.get_running_loop()
        for dev_id, entry in list(self._entries.items()):
            if dev_id in found:
                continue
            if dev_id not in self._allocated:
                self._drop(dev_id, "device disappeared")
            elif entry.present:
                entry.present = False
                entry.check = None  # when it comes back it is checked again before Healthy
                log.warning(
                    "allocated device disappeared; reporting it Unhealthy",
                    extra={"resource": self.resource_name, "device_id": dev_id},
                )
                entry.expiry = loop.call_later(self.keep_unhealthy_seconds, self._expire, dev_id)
        for dev_id, phys in found.items():
            group = self.spec.groups[phys.group]
            known = self._entries.get(dev_id)
            if known is None:
                self._entries[dev_id] = _Entry(phys=phys, group=group)
                log.log(
                    logging.INFO if self._scanned else logging.DEBUG,
                    "device appeared",
                    extra={"resource": self.resource_name, "device_id": dev_id},
                )
                continue
            entry = known
            if not entry.present:
                log.info(
                    "allocated device came back",
                    extra={"resource": self.resource_name, "device_id": dev_id},
                )
                if entry.expiry is not None:
                    entry.expiry.cancel()
                    entry.expiry = None
            if entry.group.health != group.health:
                entry.check = None  # a different check applies now; other edits keep it
            if entry.phys is not phys and entry.phys != phys:
                entry.phys = phys  # keep the old object when equal: snapshot cache hits
            entry.group, entry.present = group, True
        if not self._scanned:
            self._scanned = True
            log.info("found %d device(s)", len(found), extra={"resource": self.resource_name})
        self.publish()

    def apply_checks(self, results: dict[str, CheckResult]) -> None:
        """Adopt health-check results (by physical ID); log every transition."""
        for dev_id, result in results.items():
            entry = self._entries.get(dev_id)
            if entry is None:
                continue
            before = entry.check
            entry.check = result
            if before is None or before.healthy != result.healthy:
                if result.healthy:
                    log.info(
                        "health check passed",
                        extra={"resource": self.resource_name, "device_id": dev_id},
                    )
                else:
                    log.warning(
                        "health check failed: %s",
                        result.reason,
                        extra={"resource": self.resource_name, "device_id": dev_id},
                    )
        self.publish()

    def present_devices(self, group: int) -> list[PhysicalDevice]:
        """Present devices of group ``group`` (for the health checker)."""
        return [e.phys for e in self._entries.values() if e.present and e.phys.group == group]

    def unchecked(self, group: int) -> bool:
        """Whether a present device of ``group`` still waits for its first check."""
        return any(
            e.present and e.check is None and e.phys.group == group for e in self._entries.values()
        )

    def close(self) -> None:
        """Cancel expiry timers (the plugin is being removed)."""
        self._closed = True
        for entry in self._entries.values():
            if entry.expiry is not None:
                entry.expiry.cancel()
                entry.expiry = None

    def _drop(self, dev_id: str, why: str) -> None:
        entry = self._entries.pop(dev_id)
        if entry.expiry is not None:
            entry.expiry.cancel()
        self._allocated.discard(dev_id)
        log.info(why + "; removed", extra={"resource": self.resource_name, "device_id": dev_id})

    def _expire(self, dev_id: str) -> None:
        entry = self._entries.get(dev_id)
        if entry is None or entry.present or self._closed:
            return
        entry.expiry = None
        self._drop(dev_id, f"device gone for {self.keep_unhealthy_seconds:g}s")
        self.publish()

    # ----------------------------------------------------------------- snapshots out

    def _health(self, entry: _Entry) -> Health:
        if not entry.present:
            return Health.UNHEALTHY
        if entry.group.health is not None and (entry.check is None or not entry.check.healthy):
            return Health.UNHEALTHY
        return Health.HEALTHY

    def build_snapshot(self) -> Snapshot:
        """The full device list (replicas expanded) for the current state."""
        out: list[Device] = []
        for dev_id in sorted(self._entries):
            out.extend(self._devices_of(self._entries[dev_id]))
        return tuple(out)

    def _devices_of(self, entry: _Entry) -> tuple[Device, ...]:
        """The advertised devices of one entry, rebuilt only when something changed."""
        phys, group = entry.phys, entry.group
        health = self._health(entry)
        cache = entry.cache
        if cache is not None and cache[0] is phys and cache[1] is group and cache[2] is health:
            return cache[3]
        specs = tuple(DeviceSpec(n.container_path, n.host_path, n.permissions) for n in phys.nodes)
        mounts = tuple(Mount(m.container_path, m.host_path, m.read_only) for m in group.mounts)
        values = {"id": phys.id, "name": phys.name}
        cdi = tuple(Template.parse(c, CDI_VARIABLES).render(values) for c in group.cdi_devices)
        numa = () if phys.numa_node is None else (phys.numa_node,)
        devices = tuple(
            Device(
                id=replica_id(phys.id, i, group.count),
                health=health,
                numa_nodes=numa,
                device_specs=specs,
                mounts=mounts,
                cdi_devices=cdi,
            )
            for i in range(group.count)
        )
        entry.cache = (phys, group, health, devices)
        return devices

    def encoded_size(self) -> int:
        """Bytes the current device list takes in a ListAndWatch message, without building it.

        Computed from the IDs' lengths, so a list that cannot be sent (say, a glob
        matching 100 nodes with ``count: 10000``) is refused before a million device
        objects are made.
        """
        total = 0
        for entry in self._entries.values():
            health = len(_HEALTH_WIRE[self._health(entry)])
            numa = entry.phys.numa_node
            topology = 0
            if numa is not None:
                node = 0 if numa == 0 else 1 + _varint_len(numa)
                nodes = 1 + _varint_len(node) + node
                topology = 1 + _varint_len(nodes) + nodes
            base = len(entry.phys.id)
            count = entry.group.count
            if count == 1:
                total += _entry_len(base, health, topology)
                continue
            low = 0
            for digits in range(1, len(str(count - 1)) + 1):  # replicas "::0".."::<count-1>"
                high = min(count, 10**digits)
                total += (high - low) * _entry_len(base + 2 + digits, health, topology)
                low = high
        return total

    def publish(self) -> None:
        """Push the current snapshot if it changed and fits the kubelet's message size."""
        size = self.encoded_size()
        if size > self.max_message_bytes:
            ids = sum(e.group.count for e in self._entries.values())
            if self._too_big != (ids, size):
                self._too_big = (ids, size)
                log.error(
                    "NOT advertising the device list: %d device IDs (devices x count) encode "
                    "to %d bytes, over the kubelet's limit of %d bytes per ListAndWatch "
                    "message; lower count or set limit. The previous list stays in force",
                    ids,
                    size,
                    self.max_message_bytes,
                    extra={"resource": self.resource_name},
                )
            return
        self._too_big = None
        snapshot = self.build_snapshot()
        if snapshot == self._snapshot:
            return
        self._snapshot = snapshot
        self.update(snapshot)
        waiters, self._waiters = self._waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    @property
    def snapshot(self) -> Snapshot:
        """The last snapshot pushed (empty before the first scan)."""
        return self._snapshot or ()

    async def wait_for(self, predicate: Callable[[Snapshot], bool]) -> Snapshot:
        """Wait until a pushed snapshot satisfies ``predicate``; return it.

        Wrap it in ``asyncio.timeout`` to bound the wait.
        """
        while not predicate(self.snapshot):
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append(fut)
            await fut
        return self.snapshot

    @property
    def allocated(self) -> frozenset[str]:
        """Physical device IDs handed out by Allocate (and not yet dropped)."""
        return frozenset(self._allocated)

    # ----------------------------------------------------------------- RPC hooks

    def describe(self, device_id: str) -> tuple[str, int | None]:
        """(physical ID, NUMA node) of an advertised ID."""
        phys_id, _ = split_replica(device_id)  # sanitised IDs never contain ':'
        entry = self._entries.get(phys_id)
        return phys_id, (entry.phys.numa_node if entry is not None else None)

    async def preferred_allocation(
        self, available: Sequence[Device], must_include: Sequence[Device], size: int
    ) -> Sequence[str]:
        """Same NUMA node first, then replicas spread or packed per ``placement``."""
        return preferred_allocation(
            [d.id for d in available],
            [d.id for d in must_include],
            size,
            self.describe,
            self.spec.placement,
        )

    async def allocate(self, devices: Sequence[Device]) -> ContainerAllocation:
        """Device nodes, mounts, CDI names, and the groups' rendered envs and annotations."""
        by_group: dict[int, list[tuple[Device, _Entry]]] = {}
        for dev in devices:
            phys_id, _ = self.describe(dev.id)
            entry = self._entries[phys_id]
            self._allocated.add(phys_id)
            by_group.setdefault(entry.phys.group, []).append((dev, entry))
        base = ContainerAllocation.merge(devices)
        envs: dict[str, list[str]] = {}
        annotations: dict[str, list[str]] = {}
        for _index, members in sorted(by_group.items()):
            group = members[0][1].group
            phys_seen: dict[str, _Entry] = {}
            for _dev, entry in members:
                phys_seen.setdefault(entry.phys.id, entry)
            values = {
                "ids": ",".join(d.id for d, _ in members),
                "devices": ",".join(phys_seen),
                "paths": ",".join(
                    n.container_path for e in phys_seen.values() for n in e.phys.nodes
                ),
                "hostPaths": ",".join(
                    n.host_path for e in phys_seen.values() for n in e.phys.nodes
                ),
                "count": str(len(members)),
                "resource": self.resource_name,
            }
            for target, source in ((envs, group.envs), (annotations, group.annotations)):
                for key, tpl in source.items():
                    value = Template.parse(tpl, ENV_VARIABLES).render(values)
                    bucket = target.setdefault(key, [])
                    if value not in bucket:
                        bucket.append(value)
        return ContainerAllocation(
            envs={k: ",".join(v) for k, v in envs.items()},
            mounts=base.mounts,
            device_specs=base.device_specs,
            annotations={k: ",".join(v) for k, v in annotations.items()},
            cdi_devices=base.cdi_devices,
        )

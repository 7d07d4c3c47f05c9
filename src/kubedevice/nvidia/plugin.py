"""The SDK plugin of one GPU resource: device list with health, Allocate by strategy, preferences.

One :class:`GpuResourcePlugin` per advertised resource (``nvidia.com/gpu``,
``nvidia.com/gpu.shared``, ``nvidia.com/mig-1g.18gb`` ...). Allocate lists the GPUs the
configured ways (``deviceListStrategy``, several allowed):

* ``envvar``: ``NVIDIA_VISIBLE_DEVICES=<id>,<id>`` (read by the NVIDIA container toolkit);
* ``volume-mounts``: ``/dev/null`` mounted at ``/var/run/nvidia-container-devices/<id>``
  (the toolkit's way to keep unprivileged containers from choosing GPUs by env);
* ``cdi-annotations``: a ``cdi.k8s.io/...`` annotation naming the CDI devices;
* ``cdi-cri``: CDI device names in the response (CRI ``CDIDevices``).

The device nodes themselves are always in the response, so a container runtime without
any NVIDIA component still creates them.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Mapping, Sequence

from kubedevice.errors import AllocationError
from kubedevice.nvidia.cdi import cdi_name
from kubedevice.nvidia.config import Flags
from kubedevice.nvidia.devices import DeviceEntry, GpuUnit
from kubedevice.plugin import (
    ContainerAllocation,
    Device,
    DevicePlugin,
    DeviceSpec,
    Health,
    Mount,
    default_preferred_allocation,
)

__all__ = ["VOLUME_MOUNT_DIR", "GpuResourcePlugin", "Prefer"]

log = logging.getLogger(__name__)

VOLUME_MOUNT_DIR = "/var/run/nvidia-container-devices"

#: ``sharing.mps``: a container's env and mounts ``(container path, host path)`` for
#: ``count`` replicas of one GPU (as its MPS daemon's client).
MpsEdits = Callable[[GpuUnit, int], tuple[dict[str, str], list[tuple[str, str]]]]

#: Topology-aware choice: ``(available (device id, GPU uuid) pairs, must-include ids, size,
#: GPU uuid -> devices of it already taken)``.
Prefer = Callable[[Sequence[tuple[str, str]], Sequence[str], int, Mapping[str, int]], list[str]]


class GpuResourcePlugin(DevicePlugin):
    """The devices of one GPU resource, served through the SDK.

    Args:
        resource_name: The advertised name.
        entries: Its devices, in order.
        flags: The config's flags (list and ID strategies, CDI annotation prefix).
        healthy: UUID -> whether that GPU or MIG device is healthy now.
        shared: The resource is time-sliced (replicas).
        fail_requests_greater_than_one: Refuse a container asking for more than one
            replica of a shared resource (``INVALID_ARGUMENT``).
        prefer: The topology-aware preference; ``None`` for the SDK default.
        mps: ``sharing.mps``: the edits making a container its GPU's MPS client.
    """

    advertise_preferred_allocation = True

    def __init__(
        self,
        resource_name: str,
        entries: Sequence[DeviceEntry],
        flags: Flags,
        healthy: Callable[[str], bool],
        *,
        shared: bool = False,
        fail_requests_greater_than_one: bool = False,
        prefer: Prefer | None = None,
        mps: MpsEdits | None = None,
    ) -> None:
        self.resource_name = resource_name
        self.configure(entries, flags, shared, fail_requests_greater_than_one, prefer, mps)
        self._healthy = healthy

    def configure(
        self,
        entries: Sequence[DeviceEntry],
        flags: Flags,
        shared: bool,
        fail_requests_greater_than_one: bool,
        prefer: Prefer | None,
        mps: MpsEdits | None = None,
    ) -> None:
        """Adopt a new device set and settings (after a reload); call :meth:`refresh` next."""
        self.entries = {e.id: e for e in entries}
        self.flags = flags
        self.shared = shared
        self.fail_requests_greater_than_one = fail_requests_greater_than_one
        self.prefer = prefer
        self.mps = mps

    def snapshot(self) -> list[Device]:
        """The current device list, health included."""
        return [
            Device(
                id=e.id,
                health=Health.HEALTHY if self._healthy(e.unit.uuid) else Health.UNHEALTHY,
                numa_nodes=() if e.unit.numa_node is None else (e.unit.numa_node,),
            )
            for e in self.entries.values()
        ]

    def refresh(self) -> None:
        """Publish the current list (after a health change or a reload)."""
        self.update(self.snapshot())

    def units_for(self, device_ids: Sequence[str]) -> list[GpuUnit]:
        """The distinct units behind ``device_ids`` (replicas of one GPU count once)."""
        units: dict[str, GpuUnit] = {}
        for dev_id in device_ids:
            entry = self.entries.get(dev_id)
            if entry is not None:
                units.setdefault(entry.unit.uuid, entry.unit)
        return list(units.values())

    def _visible_id(self, unit: GpuUnit) -> str:
        return unit.uuid if self.flags.device_id_strategy == "uuid" else unit.index

    async def allocate(self, devices: Sequence[Device]) -> ContainerAllocation:
        """The container's device nodes and its GPU list in every configured form."""
        if self.shared and self.fail_requests_greater_than_one and len(devices) > 1:
            raise AllocationError(
                f"{self.resource_name} is shared and this plugin refuses requests of "
                f"more than one replica (failRequestsGreaterThanOne); asked for {len(devices)}",
                tuple(d.id for d in devices),
            )
        units = self.units_for([d.id for d in devices])
        ids = [self._visible_id(u) for u in units]
        nodes = dict.fromkeys(n for u in units for n in u.device_nodes)
        specs = tuple(DeviceSpec(n, n, "rw") for n in nodes)
        envs: dict[str, str] = {}
        mounts: list[Mount] = []
        if self.mps is not None and self.shared:
            envs, mounts = self._mps_edits([d.id for d in devices], units)
        annotations: dict[str, str] = {}
        cdi: tuple[str, ...] = ()
        strategies = self.flags.device_list_strategy
        for strategy in strategies:
            if strategy == "envvar":
                envs["NVIDIA_VISIBLE_DEVICES"] = ",".join(ids)
            elif strategy == "volume-mounts":
                if "envvar" not in strategies:
                    envs["NVIDIA_VISIBLE_DEVICES"] = VOLUME_MOUNT_DIR
                mounts.extend(
                    Mount(f"{VOLUME_MOUNT_DIR}/{i}", "/dev/null", read_only=True) for i in ids
                )
            elif strategy == "cdi-annotations":
                import hashlib  # only here: hashlib loads OpenSSL's digests (0.6 MB)

                digest = hashlib.sha256(",".join(sorted(ids)).encode()).hexdigest()[:16]
                key = f"{self.flags.cdi_annotation_prefix}kubedevice-nvidia_{digest}"
                annotations[key] = ",".join(cdi_name(i) for i in ids)
            else:  # cdi-cri
                cdi = tuple(cdi_name(i) for i in ids)
        return ContainerAllocation(
            envs=envs,
            mounts=tuple(mounts),
            device_specs=specs,
            annotations=annotations,
            cdi_devices=cdi,
        )

    def _mps_edits(
        self, ids: Sequence[str], units: Sequence[GpuUnit]
    ) -> tuple[dict[str, str], list[Mount]]:
        """The env and mounts of a client of its GPU's MPS daemon (its replicas' share)."""
        assert self.mps is not None
        if len(units) != 1:
            raise AllocationError(
                f"{self.resource_name} is shared by MPS: a container's replicas must be of one "
                f"GPU (a process is a client of one GPU's MPS daemon); got {len(units)} GPUs",
                tuple(ids),
            )
        env, pairs = self.mps(units[0], len(ids))
        return env, [Mount(inside, host, read_only=False) for inside, host in pairs]

    async def preferred_allocation(
        self, available: Sequence[Device], must_include: Sequence[Device], size: int
    ) -> Sequence[str]:
        """The best-connected set (topology), replicas spread over the least-loaded GPUs.

        A GPU's load is how many of its devices of this resource were not offered: taken
        by other containers (or Unhealthy, and then none of them is offered).
        """
        if self.prefer is None:
            return default_preferred_allocation(available, must_include, size)
        pairs = [
            (d.id, self.entries[d.id].unit.parent_uuid) for d in available if d.id in self.entries
        ]
        load = Counter(e.unit.parent_uuid for e in self.entries.values())
        load.subtract(gpu for _, gpu in pairs)
        return self.prefer(pairs, [d.id for d in must_include], size, load)

"""MIG on demand: every placement of every MIG profile published, made when a claim needs it.

With ``dra.migOnDemand`` (``--mig-on-demand``) each GPU in MIG mode whose instances the
backend can make (:class:`~kubedevice.nvidia.backend.MigPartitioning`) is published as:

* a counter set ``gpu-<minor>-counter-set``: one counter per memory slice
  (``memory-slice-0`` .. ``memory-slice-7``, value 1) and ``media-extensions`` (1) when a
  profile takes the GPU's media extensions;
* the whole GPU (``gpu-<minor>``), consuming every counter;
* one device per profile and placement (small profiles from the lowest memory slice up,
  half-GPU profiles from the top down, as the scheduler takes the first that fits),
  ``gpu-<minor>-mig-<profile>-<start>``
  (``gpu-0-mig-3g-40gb-4``), type ``mig``, with ``profile``, ``parentUUID``,
  ``parentIndex``, ``placementStart`` and ``placementSize`` attributes, the capacities a
  MIG device of that profile has (``memory``, and NVIDIA's ``multiprocessors``,
  ``copyEngines``, ``decoders``, ``encoders``, ``jpegEngines``, ``ofaEngines`` and
  ``memorySlice<i>`` where the backend knows the profile's engines), consuming the memory
  slices of its placement (and the media extensions for ``+me`` and 7g profiles).

The scheduler alone then decides what fits: two devices that share a memory slice are
never allocated together. Prepare makes the GPU instance at the device's placement and
its compute instance (or adopts the instance already there, at that placement and owned by
no other claim: one made by a prepare that was cut off); unprepare destroys it; at start,
instances that no prepared claim (the checkpoint) owns are destroyed, and an instance a
prepared claim owns that is gone (a reboot destroys them all) is made again at its placement.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from kubedevice.dra import CounterConsumption, CounterSet, Device
from kubedevice.nvidia.backend import (
    GpuInfo,
    GpuInstanceProfile,
    MigDeviceInfo,
    MigPartitioning,
    MigPlacement,
    NvmlBackend,
)
from kubedevice.nvidia.devices import GpuUnit
from kubedevice.nvidia.dra.devices import GpuDevice, Partition, fit, mig_capacity

__all__ = [
    "MEDIA_COUNTER",
    "MigRecord",
    "Partition",
    "counter_set_name",
    "destroy_if_ours",
    "find_at",
    "find_orphans",
    "holds",
    "make_or_adopt",
    "memory_slice_counter",
    "on_demand_devices",
    "partitionable",
]

log = logging.getLogger(__name__)

MEDIA_COUNTER: Final = "media-extensions"
_NOT_LABEL: Final = re.compile(r"[^a-z0-9-]+")


def memory_slice_counter(i: int) -> str:
    """The counter of memory slice ``i`` (``memory-slice-3``)."""
    return f"memory-slice-{i}"


def counter_set_name(gpu: GpuInfo) -> str:
    """The counter set of a GPU (``gpu-0-counter-set``)."""
    return f"gpu-{gpu.minor}-counter-set"


@dataclass(frozen=True, slots=True)
class MigRecord:
    """A MIG device made for a claim, as kept in the checkpoint (``data["mig"]``)."""

    gpu: str
    gi: int
    uuid: str

    def to_json(self) -> dict[str, Any]:
        return {"gpu": self.gpu, "gi": self.gi, "uuid": self.uuid}

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> MigRecord | None:
        """The record in one device's checkpoint data (``None``: none, or not readable)."""
        raw = data.get("mig")
        if not isinstance(raw, Mapping):
            return None
        gpu, gi, uuid = raw.get("gpu"), raw.get("gi"), raw.get("uuid")
        if not isinstance(gpu, str) or not isinstance(uuid, str):
            return None
        if not isinstance(gi, int) or isinstance(gi, bool):
            return None
        return cls(gpu, gi, uuid)


def _label(text: str) -> str:
    return _NOT_LABEL.sub("-", text.lower()).strip("-")


def _counters(profile: GpuInstanceProfile, placement: MigPlacement) -> dict[str, int]:
    out = {memory_slice_counter(i): 1 for i in placement.memory_slices}
    if profile.media_extensions:
        out[MEDIA_COUNTER] = 1
    return out


def _all_counters(profiles: Sequence[GpuInstanceProfile]) -> dict[str, int]:
    out: dict[str, int] = {}
    for p in profiles:
        for placement in p.placements:
            out.update(_counters(p, placement))
    return dict(sorted(out.items(), key=lambda kv: (len(kv[0]), kv[0])))


def _order(profile: GpuInstanceProfile) -> list[MigPlacement]:
    """The placements in the order they are published. The scheduler takes the first
    device that fits, so small profiles are listed from the bottom of the memory slices up
    and those of half the GPU (3g, 4g) from the top down: a 3g then lands on slices 4-7
    and leaves 0-3 to 2g and 1g devices, as NVIDIA's own placement choice does."""
    placements = sorted(profile.placements)
    total = max((p.start + p.size for p in placements), default=0)
    if placements and 2 * placements[0].size >= total > placements[0].size:
        placements.reverse()
    return placements


def on_demand_devices(
    whole: GpuDevice, profiles: Sequence[GpuInstanceProfile]
) -> tuple[CounterSet, list[GpuDevice]]:
    """A GPU's counter set, its whole device consuming all of it, and its partitions."""
    gpu = whole.gpu
    name = counter_set_name(gpu)
    total = _all_counters(profiles)
    counter_set = CounterSet(name, total)
    out = [
        dataclasses.replace(
            whole,
            device=dataclasses.replace(
                whole.device,
                consumes_counters=[CounterConsumption(name, total)],
                # not shared by memory as well: its partitions are how it is divided
                allow_multiple_allocations=False,
                request_policies={},
            ),
        )
    ]
    base = {
        k: v
        for k, v in whole.device.attributes.items()
        if k not in ("type", "uuid", "index", "migEnabled")
    }
    parent_unit = whole.unit
    for profile in profiles:
        for placement in _order(profile):
            device_name = f"gpu-{gpu.minor}-mig-{_label(profile.name)}-{placement.start}"
            attrs = {
                **base,
                "type": "mig",
                "migEnabled": True,
                "parentUUID": gpu.uuid,
                "parentIndex": gpu.index,
                "profile": profile.name,
                "placementStart": placement.start,
                "placementSize": placement.size,
            }
            capacity = {"memory": profile.memory_mib * 1024 * 1024}
            if profile.engines is not None:
                capacity.update(mig_capacity(profile.engines, placement.memory_slices))
                fit(attrs, capacity)
            device = Device(
                name=device_name[:63].rstrip("-"),
                attributes=attrs,
                capacity=capacity,
                edits=whole.device.edits,
                consumes_counters=[CounterConsumption(name, _counters(profile, placement))],
            )
            # The unit is the parent GPU's: its health (an XID on it) is every partition's.
            unit = GpuUnit(
                uuid=parent_unit.uuid,
                parent_uuid=gpu.uuid,
                index=parent_unit.index,
                resource=parent_unit.resource,
                numa_node=parent_unit.numa_node,
                device_nodes=parent_unit.device_nodes,
                product=f"{gpu.name} MIG {profile.name}",
                memory=profile.memory_mib * 1024 * 1024,
            )
            out.append(
                GpuDevice(
                    device=device, unit=unit, gpu=gpu, partition=Partition(profile, placement)
                )
            )
    return counter_set, out


def partitionable(
    backend: NvmlBackend, gpus: Iterable[GpuInfo], only: Sequence[str] = ()
) -> dict[str, list[GpuInstanceProfile]]:
    """GPU UUID -> its MIG profiles (those named in ``only``, when given), for the GPUs in
    MIG mode whose instances the backend can make and whose MIG devices are all instances
    it lists (blocking)."""
    if not isinstance(backend, MigPartitioning):
        return {}
    out: dict[str, list[GpuInstanceProfile]] = {}
    for gpu in gpus:
        if not gpu.mig_enabled:
            continue
        profiles = [
            p
            for p in backend.gpu_instance_profiles(gpu.uuid)
            if p.placements and (not only or p.name in only)
        ]
        if not profiles:
            continue
        listed = {d.uuid for gi in backend.gpu_instances(gpu.uuid) for d in gi.devices}
        others = [m.uuid for m in backend.mig_devices(gpu.uuid) if m.uuid not in listed]
        if others:
            log.warning(
                "GPU %s: MIG devices %s cannot be managed; not offered on demand",
                gpu.uuid,
                ", ".join(others),
            )
            continue
        out[gpu.uuid] = profiles
    return out


def find_orphans(
    backend: MigPartitioning, gpu_uuids: Iterable[str], owned: Iterable[MigRecord]
) -> list[tuple[str, int]]:
    """The GPU instances (GPU UUID, GI ID) that no prepared claim owns (blocking)."""
    keep = {(r.gpu, r.gi, r.uuid) for r in owned}
    out = []
    for gpu in gpu_uuids:
        for gi in backend.gpu_instances(gpu):
            if not any((gpu, gi.gi_id, d.uuid) in keep for d in gi.devices):
                out.append((gpu, gi.gi_id))
    return out


def destroy_if_ours(backend: MigPartitioning, record: MigRecord) -> bool:
    """Destroy the GPU instance of ``record`` if it still holds that MIG device (blocking).

    Returns whether it was destroyed (``False``: gone already, or the ID now holds
    another device: NVML reuses GPU instance IDs).
    """
    for gi in backend.gpu_instances(record.gpu):
        if gi.gi_id == record.gi and any(d.uuid == record.uuid for d in gi.devices):
            backend.destroy_mig_device(record.gpu, record.gi)
            return True
    return False


def holds(backend: MigPartitioning, record: MigRecord) -> bool:
    """Whether ``record``'s GPU instance still holds its MIG device (blocking)."""
    return any(
        gi.gi_id == record.gi and any(d.uuid == record.uuid for d in gi.devices)
        for gi in backend.gpu_instances(record.gpu)
    )


def find_at(
    backend: MigPartitioning, gpu: str, part: Partition, others: Iterable[int]
) -> MigDeviceInfo | None:
    """The MIG device of the GPU instance at ``part``'s profile and placement whose GI ID is
    not one of ``others`` (those other claims own), if there is one (blocking)."""
    taken = set(others)
    for gi in backend.gpu_instances(gpu):
        if (
            gi.gi_id not in taken
            and gi.profile_id == part.profile.id
            and gi.placement == part.placement
            and gi.devices
        ):
            return gi.devices[0]
    return None


def make_or_adopt(
    backend: MigPartitioning, gpu: str, part: Partition, others: Iterable[int]
) -> tuple[MigDeviceInfo, bool]:
    """The MIG device at ``part``: the one already there if no other claim owns it (made
    by a prepare cut off before it recorded it), else a new one; and whether it was there
    (blocking).

    Raises:
        NvmlError: NVML refused (``InsufficientResources``: another claim's instance
            overlaps).
    """
    there = find_at(backend, gpu, part, others)
    if there is not None:
        return there, True
    return backend.create_mig_device(gpu, part.profile.id, part.placement), False

"""GPUs and MIG devices as DRA devices: names, typed attributes, capacity, container edits.

Pure functions of what NVML enumerated, the GPU plugin's config (``migStrategy``, roots)
and the fake-able ``/dev`` and ``/sys`` trees. Attribute names and value types follow
NVIDIA's DRA driver (``k8s-dra-driver-gpu``), so a DeviceClass or claim written for it
selects the same GPUs once the driver name matches:

* every device: ``type`` (``gpu`` / ``mig``), ``uuid``, ``productName``, ``brand``
  (``Nvidia``, ``Tesla`` ...), ``architecture`` (``Hopper``, ``Ada Lovelace`` ...),
  ``cudaComputeCapability``, ``driverVersion`` and ``cudaDriverVersion`` as semantic
  versions (``9.0.0``, ``570.124.6``, ``12.8.0``), ``pcieBusID``, ``index``, ``minor``
  and ``migEnabled``;
* MIG devices also ``parentUUID``, ``parentIndex`` and ``profile`` (``1g.18gb``);
* the standard ``resource.kubernetes.io/pciBusID`` and ``resource.kubernetes.io/pcieRoot``
  (when sysfs tells), ``numaNode`` and the standard ``resource.kubernetes.io/numaNode``
  (when sysfs tells) and ``nvlinkDomain``: GPUs with the
  same value are all directly NVLink-connected to each other (the largest such group a
  GPU belongs to, named by its lowest NVML index; absent without NVLink);
* capacity ``memory`` (bytes); with ``dra.memoryShares`` a whole GPU allows
  multiple allocations and its ``memory`` has a request policy (:func:`memory_policy`);
  with ``dra.mps`` also ``compute`` (100, percent of the SMs; see
  :mod:`kubedevice.nvidia.dra.mps`);
  MIG devices also NVIDIA's ``multiprocessors``,
  ``copyEngines``, ``decoders``, ``encoders``, ``jpegEngines``, ``ofaEngines`` and
  ``memorySlice<i>`` (1 for each memory slice the GPU instance spans), from NVML's GPU
  instance profile info, where NVML gives it. A MIG device that would pass the API's 32
  attributes and capacities leaves out ``migEnabled``, ``nvlinkDomain`` and ``numaNode``
  (in that order, only as many as needed).

docs/nvidia-dra.md has the table of which names match NVIDIA's driver.

Device names are NVIDIA's: ``gpu-<minor>``, and ``gpu-<minor>-mig-<profile>-<gi>-<ci>``.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from kubedevice.dra import ContainerEdits, Device, DeviceNode, Fault, Health, RequestPolicy, Version
from kubedevice.dra.model.types import MAX_ATTRIBUTES_AND_CAPACITIES, AttributeValue
from kubedevice.nvidia.backend import (
    DriverInfo,
    GpuInfo,
    GpuInstanceProfile,
    MigDeviceInfo,
    MigEngines,
    MigPlacement,
)
from kubedevice.nvidia.config import Config
from kubedevice.nvidia.devices import GpuUnit, build_inventory
from kubedevice.nvidia.dra.mps import COMPUTE, COMPUTE_POLICY
from kubedevice.nvidia.topology import Topology
from kubedevice.plugin.pci import (
    NUMA_NODE_ATTRIBUTE,
    PCI_BUS_ID_ATTRIBUTE,
    PCIE_ROOT_ATTRIBUTE,
    normalize_bus_id,
    pcie_root,
)

__all__ = [
    "ARCHITECTURES",
    "BRANDS",
    "GpuDevice",
    "Partition",
    "build_devices",
    "fit",
    "memory_policy",
    "mig_capacity",
    "nvlink_domains",
    "semver",
]

#: Our architecture names (``GpuInfo.architecture``) -> NVIDIA's (go-nvlib's strings).
ARCHITECTURES: Final[Mapping[str, str]] = {
    "kepler": "Kepler",
    "maxwell": "Maxwell",
    "pascal": "Pascal",
    "volta": "Volta",
    "turing": "Turing",
    "ampere": "Ampere",
    "ada": "Ada Lovelace",
    "hopper": "Hopper",
    "blackwell": "Blackwell",
    "rubin": "Rubin",
    "unknown": "Unknown",
}
#: Our brand names (``GpuInfo.brand``) -> NVIDIA's (go-nvlib's strings).
BRANDS: Final[Mapping[str, str]] = {
    "unknown": "Unknown",
    "quadro": "Quadro",
    "tesla": "Tesla",
    "nvs": "NVS",
    "grid": "Grid",
    "geforce": "GeForce",
    "titan": "Titan",
    "nvidia-vapps": "NvidiaVApps",
    "nvidia-vpc": "NvidiaVPC",
    "nvidia-vcs": "NvidiaVCS",
    "nvidia-vws": "NvidiaVWS",
    "nvidia-cloud-gaming": "NvidiaCloudGaming",
    "quadro-rtx": "QuadroRTX",
    "nvidia-rtx": "NvidiaRTX",
    "nvidia": "Nvidia",
    "geforce-rtx": "GeForceRTX",
    "titan-rtx": "TitanRTX",
}

_VERSION = re.compile(r"v?(\d+)(?:\.(\d+))?(?:\.(\d+))?")
_NOT_LABEL = re.compile(r"[^a-z0-9-]+")


def semver(text: str) -> Version | None:
    """A driver or CUDA version as a semantic version, read the way NVIDIA's driver does.

    Missing parts are 0 and leading zeros go (``580.159.04`` -> ``580.159.4``,
    ``12.8`` -> ``12.8.0``); ``None`` when ``text`` is not a version at all.
    """
    match = _VERSION.fullmatch(text.strip())
    if match is None:
        return None
    parts = [int(p) if p else 0 for p in match.groups()]
    return Version(".".join(str(p) for p in parts))


def nvlink_domains(gpus: Sequence[GpuInfo], topology: Topology | None) -> dict[str, int]:
    """GPU UUID -> its NVLink domain: the lowest NVML index of its largest NVLink clique.

    A clique is a set of GPUs every two of which have at least one NVLink link between
    them; a GPU with no NVLink link has no domain. Ties between cliques of one size go to
    the clique with the lowest indexes, so the answer is deterministic.
    """
    if topology is None:
        return {}
    uuids = [g.uuid for g in gpus]
    neighbours: dict[str, set[str]] = {u: set() for u in uuids}
    for a in uuids:
        for b in uuids:
            if a != b:
                link = topology.link(a, b)
                if link is not None and link.nvlinks > 0:
                    neighbours[a].add(b)
    cliques: list[frozenset[str]] = []

    def expand(r: set[str], p: set[str], x: set[str]) -> None:  # Bron-Kerbosch, pivoting
        if not p and not x:
            if len(r) > 1:
                cliques.append(frozenset(r))
            return
        pivot = max(p | x, key=lambda u: len(neighbours[u] & p))
        for v in list(p - neighbours[pivot]):
            expand(r | {v}, p & neighbours[v], x & neighbours[v])
            p.discard(v)
            x.add(v)

    expand(set(), set(uuids), set())
    index = {g.uuid: g.index for g in gpus}
    out: dict[str, int] = {}
    for uuid in uuids:
        mine = [c for c in cliques if uuid in c]
        if not mine:
            continue
        best = min(mine, key=lambda c: (-len(c), sorted(index[u] for u in c)))
        out[uuid] = min(index[u] for u in best)
    return out


@dataclass(frozen=True, slots=True)
class Partition:
    """What a MIG device made on demand stands for: a profile at one placement of a GPU."""

    profile: GpuInstanceProfile
    placement: MigPlacement


@dataclass(frozen=True, slots=True)
class GpuDevice:
    """One published device and the hardware behind it.

    Attributes:
        device: The DRA device (name, attributes, capacity, edits; health applied later).
        unit: The whole GPU or MIG device (UUIDs, device nodes).
        gpu: The physical GPU.
        mig: The MIG device, ``None`` for a whole GPU.
        partition: The profile and placement of a MIG device made on demand (``mig`` is
            ``None``: it exists only while a claim has it).
    """

    device: Device
    unit: GpuUnit
    gpu: GpuInfo
    mig: MigDeviceInfo | None = None
    partition: Partition | None = None

    def with_health(self, health: Health, fault: Fault | None = None) -> Device:
        """The device as published with ``health`` (and why, when not healthy)."""
        d = self.device
        if d.health == health and d.fault == fault:
            return d
        return dataclasses.replace(d, health=health, fault=fault)  # shares, policies kept


def _label(text: str) -> str:
    return _NOT_LABEL.sub("-", text.lower()).strip("-")


def _common(gpu: GpuInfo, driver: DriverInfo | None, sys_root: str) -> dict[str, AttributeValue]:
    attrs: dict[str, AttributeValue] = {
        "productName": gpu.name[:64],
        "brand": BRANDS.get(gpu.brand, gpu.brand.capitalize()),
        "architecture": ARCHITECTURES.get(gpu.architecture, gpu.architecture.capitalize()),
        "migEnabled": gpu.mig_enabled,
    }
    cc = semver("{}.{}".format(*gpu.compute_capability))
    if cc is not None:
        attrs["cudaComputeCapability"] = cc
    if driver is not None:
        for name, text in (
            ("driverVersion", driver.driver_version),
            ("cudaDriverVersion", driver.cuda_version),
        ):
            version = semver(text)
            if version is not None:
                attrs[name] = version
    bus_id = normalize_bus_id(gpu.pci_bus_id)
    if bus_id is not None:
        attrs["pcieBusID"] = bus_id
        attrs[PCI_BUS_ID_ATTRIBUTE] = bus_id
        root = pcie_root(sys_root, bus_id)
        if root is not None:
            attrs[PCIE_ROOT_ATTRIBUTE] = root
    return attrs


def mig_capacity(engines: MigEngines, memory_slices: range) -> dict[str, int]:
    """A MIG device's capacities as NVIDIA's driver names them: its GPU instance profile's
    engines and multiprocessors, and ``memorySlice<i>: 1`` for each memory slice the
    instance spans (``memory`` stays the device's own memory in bytes)."""
    out = {
        "multiprocessors": engines.multiprocessors,
        "copyEngines": engines.copy_engines,
        "decoders": engines.decoders,
        "encoders": engines.encoders,
        "jpegEngines": engines.jpeg_engines,
        "ofaEngines": engines.ofa_engines,
    }
    for i in memory_slices:
        out[f"memorySlice{i}"] = 1
    return out


#: Our own MIG attributes NVIDIA's driver does not publish, left out (in this order) where
#: a device would pass the API's 32 attributes and capacities: ``migEnabled`` is always true
#: on a MIG device, a MIG device has no NVLink peer access, and the standard
#: ``resource.kubernetes.io/numaNode`` stays.
_DROPPABLE: Final = ("migEnabled", "nvlinkDomain", "numaNode")


def fit(attrs: dict[str, AttributeValue], capacity: Mapping[str, int]) -> None:
    """Drop our own droppable attributes until the device is within the API's limit."""
    for name in _DROPPABLE:
        if len(attrs) + len(capacity) <= MAX_ATTRIBUTES_AND_CAPACITIES:
            return
        attrs.pop(name, None)


def binary_quantity(size: int) -> str:
    """``size`` bytes as the API server writes it: ``80Gi``, ``512Mi``, ``1Ti`` or bytes."""
    for shift, suffix in ((60, "Ei"), (50, "Pi"), (40, "Ti"), (30, "Gi"), (20, "Mi"), (10, "Ki")):
        if size and size % (1 << shift) == 0:
            return f"{size >> shift}{suffix}"
    return str(size)


def memory_policy(memory: int, step: int) -> RequestPolicy | None:
    """The request policy of a shared GPU's ``memory`` (``memory`` and ``step`` in bytes).

    A share is at least one ``step`` and grows by whole steps, up to the most whole steps
    the GPU holds. A claim that names no memory gets that most (the default), so it keeps
    the GPU to itself as it would without shares. ``None`` for a GPU under two steps.
    """
    most = memory // step * step
    if most < 2 * step:
        return None
    top = binary_quantity(most)
    return RequestPolicy(
        default=top, min=binary_quantity(step), max=top, step=binary_quantity(step)
    )


def _edits(unit: GpuUnit) -> ContainerEdits:
    return ContainerEdits(device_nodes=[DeviceNode(p, host_path=p) for p in unit.device_nodes])


def build_devices(
    config: Config,
    driver: DriverInfo | None,
    gpus: Sequence[GpuInfo],
    mig: Mapping[str, Sequence[MigDeviceInfo]],
    *,
    topology: Topology | None = None,
) -> list[GpuDevice]:
    """The DRA devices of this node, in NVML order (a MIG-enabled GPU's MIG devices in place).

    ``config.flags.migStrategy`` decides as in the device plugin: ``none`` publishes every
    GPU whole; ``single`` and ``mixed`` publish the MIG devices of MIG-enabled GPUs
    (``single`` checks that they all have one profile) and the other GPUs whole.

    Raises:
        ConfigError: ``single`` on GPUs that do not share one MIG profile.
    """
    flags = config.flags
    inventory = build_inventory(config, gpus, mig, dev_root=flags.dev_root)
    by_uuid = {g.uuid: g for g in gpus}
    migs = {m.uuid: m for devices in mig.values() for m in devices}
    domains = nvlink_domains(gpus, topology)
    out: list[GpuDevice] = []
    for unit in inventory.units.values():
        gpu = by_uuid[unit.parent_uuid]
        attrs = _common(gpu, driver, flags.sys_root)
        if unit.numa_node is not None:
            attrs["numaNode"] = unit.numa_node
            attrs[NUMA_NODE_ATTRIBUTE] = unit.numa_node
        if gpu.uuid in domains:
            attrs["nvlinkDomain"] = domains[gpu.uuid]
        m = migs.get(unit.uuid)
        if m is None:
            name = f"gpu-{gpu.minor}"
            attrs.update(type="gpu", uuid=gpu.uuid, index=gpu.index, minor=gpu.minor)
        else:
            name = f"gpu-{gpu.minor}-mig-{_label(m.profile)}-{m.gi_id}-{m.ci_id}"
            attrs.update(
                type="mig",
                uuid=m.uuid,
                parentUUID=gpu.uuid,
                parentIndex=gpu.index,
                index=m.index,
                minor=gpu.minor,
                profile=m.profile,
            )
        capacity: dict[str, int] = {"memory": unit.memory}
        info = m.profile_info if m is not None else None
        if info is not None:
            where = range(info.placement_start, info.placement_start + info.placement_size)
            capacity.update(mig_capacity(info.engines, where))
            fit(attrs, capacity)
        shares = config.dra.memory_shares
        policy = memory_policy(unit.memory, shares.step_bytes) if shares.enabled else None
        policies: dict[str, RequestPolicy] = {}
        if policy is not None and m is None:
            policies["memory"] = policy
            if config.dra.mps:  # SMs too: percent, counted by the scheduler like memory
                capacity[COMPUTE] = 100
                policies[COMPUTE] = COMPUTE_POLICY
        device = Device(
            name=name[:63].rstrip("-"),
            attributes=attrs,
            capacity=capacity,
            edits=_edits(unit),
            allow_multiple_allocations=bool(policies),
            request_policies=policies,
        )
        out.append(GpuDevice(device=device, unit=unit, gpu=gpu, mig=m))
    return out

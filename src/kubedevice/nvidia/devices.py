"""GPUs and MIG devices -> the schedulable devices of each resource, with their nodes and NUMA.

Pure functions of what NVML enumerated, the config and the fake-able ``/dev`` and ``/sys``
trees: which resources exist (``nvidia.com/gpu``, ``nvidia.com/mig-1g.18gb`` ... by
``migStrategy``), the device IDs (UUID or index, ``<id>::<n>`` replicas), the device nodes
a container needs and the NUMA node of each GPU.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from kubedevice._regular_file import read_regular
from kubedevice.errors import ConfigError, PluginServerError
from kubedevice.nvidia.backend import GpuInfo, MigDeviceInfo
from kubedevice.nvidia.config import GPU_RESOURCE, Config
from kubedevice.plugin.config import default_socket_name
from kubedevice.plugin.unixsock import check_path_length, temp_path

__all__ = [
    "CONTROL_NODES",
    "MAX_NUMA_NODE",
    "DeviceEntry",
    "GpuUnit",
    "Inventory",
    "advertised_names",
    "build_inventory",
    "plan_resources",
    "read_numa_node",
    "replica_id",
    "split_replica",
]

log = logging.getLogger(__name__)

#: Control nodes a CUDA process needs besides its GPU's node, given when present.
CONTROL_NODES: Final = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")
_BUS_ID = re.compile(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
_REPLICA_SEP: Final = "::"


def replica_id(base: str, n: int) -> str:
    """The ID of replica ``n`` of device ``base``: ``<base>::<n>``."""
    return f"{base}{_REPLICA_SEP}{n}"


def split_replica(device_id: str) -> tuple[str, int | None]:
    """``"<base>::<n>"`` -> ``(base, n)``; an ID without a replica suffix -> ``(id, None)``."""
    base, sep, n = device_id.rpartition(_REPLICA_SEP)
    if sep and n.isdigit():
        return base, int(n)
    return device_id, None


@dataclass(frozen=True, slots=True)
class GpuUnit:
    """One schedulable piece of hardware: a whole GPU or one MIG device.

    Attributes:
        uuid: ``GPU-...`` or ``MIG-...``.
        parent_uuid: The physical GPU (``uuid`` itself for a whole GPU).
        index: ``"0"``, or ``"<gpu index>:<MIG index>"`` for a MIG device.
        resource: The resource it belongs to before any sharing rename.
        numa_node: The GPU's NUMA node, ``None`` when the platform has none.
        device_nodes: Host paths of the nodes a container needs (``/dev/nvidia0`` ...).
        product: The GPU's name (``NVIDIA H200``), with the MIG profile for a MIG device.
        memory: Bytes of memory.
    """

    uuid: str
    parent_uuid: str
    index: str
    resource: str
    numa_node: int | None
    device_nodes: tuple[str, ...]
    product: str
    memory: int


@dataclass(frozen=True, slots=True)
class DeviceEntry:
    """One advertised device: a unit, or one replica of it.

    Attributes:
        id: The device ID the kubelet sees.
        unit: The hardware behind it.
        replica: The replica number, ``None`` when the resource is not shared.
    """

    id: str
    unit: GpuUnit
    replica: int | None = None


@dataclass(frozen=True, slots=True)
class Inventory:
    """Every unit, and the devices of each advertised resource (in NVML order).

    Attributes:
        units: Whole GPUs and MIG devices that are offered, by UUID.
        resources: Advertised resource name -> its devices.
        shared: Advertised resource names that are time-sliced.
    """

    units: Mapping[str, GpuUnit]
    resources: Mapping[str, tuple[DeviceEntry, ...]]
    shared: frozenset[str] = frozenset()


#: Linux's largest NUMA node count (CONFIG_NODES_SHIFT 10): a larger number is not a node.
MAX_NUMA_NODE: Final = 1023


def read_numa_node(
    sys_root: str | os.PathLike[str], pci_bus_id: str, fallback: int | None = None
) -> int | None:
    """The NUMA node of a PCI device from ``<sysRoot>/bus/pci/devices/<bus id>/numa_node``.

    Args:
        sys_root: Where sysfs is.
        pci_bus_id: The device's PCI bus ID.
        fallback: The answer when sysfs has no such file (what a fake machine says).

    Returns:
        The node, or ``None`` when the file is unreadable, says ``-1`` (no NUMA) or
        something that is not a NUMA node (logged, one line), or the bus ID is malformed
        (never a path outside ``sysRoot``).
    """
    bus_id = pci_bus_id.lower()
    if not _BUS_ID.fullmatch(bus_id):
        log.warning("malformed PCI bus id %r; no NUMA node", pci_bus_id)
        return None
    path = Path(sys_root, "bus", "pci", "devices", bus_id, "numa_node")
    try:
        text = read_regular(path, 64).decode("ascii").strip()
    except FileNotFoundError:
        return fallback
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    try:
        value = int(text) if len(text) <= 20 else None
    except ValueError:
        value = None
    if value is None or value > MAX_NUMA_NODE:
        log.warning("%s: %r is not a NUMA node (0-%d or -1); ignored", path, text, MAX_NUMA_NODE)
        return None
    return value if value >= 0 else None


def _present(dev_root: str, name: str) -> bool:
    return os.path.lexists(os.path.join(dev_root, name))


def _gpu_nodes(dev_root: str, gpu: GpuInfo, control: Sequence[str]) -> tuple[str, ...]:
    own = f"nvidia{gpu.minor}"
    if not _present(dev_root, own):
        log.warning("device node /dev/%s of GPU %s is missing under %s", own, gpu.uuid, dev_root)
    return (f"/dev/{own}", *control)


def _mig_nodes(dev_root: str, gpu_nodes: tuple[str, ...], mig: MigDeviceInfo) -> tuple[str, ...]:
    caps = []
    for minor in mig.cap_minors:
        rel = f"nvidia-caps/nvidia-cap{minor}"
        if not _present(dev_root, rel):
            log.warning("MIG capability node /dev/%s of %s is missing", rel, mig.uuid)
        caps.append(f"/dev/{rel}")
    return (*gpu_nodes, *caps)


_SOCKET_HINT: Final = "use a shorter rename or device plugin directory"


def _mig_resource(profile: str) -> str:
    return f"nvidia.com/mig-{profile}"


def plan_resources(
    config: Config,
    gpus: Sequence[GpuInfo],
    mig: Mapping[str, Sequence[MigDeviceInfo]],
    *,
    device_plugin_dir: Path | None = None,
) -> dict[str, str]:
    """The resources ``config`` makes of these GPUs: base name -> advertised name.

    The one check of a config against the hardware, shared by ``nvidia run`` (start and
    every reload) and ``nvidia info``: nothing is read or written.

    Args:
        config: The config.
        gpus: The GPUs, in NVML index order.
        mig: GPU UUID -> its MIG devices.
        device_plugin_dir: Where the resources' sockets go (the device plugin's kubelet
            directory); each socket path is checked against the AF_UNIX limit as the
            plugin server checks it. ``None``: no sockets (the DRA driver).

    Raises:
        ConfigError: ``single`` on a node whose GPUs do not all share one MIG profile,
            or a sharing rename that collides with another resource's name or socket,
            or whose socket path would be too long.
    """
    strategy = config.flags.mig_strategy
    enabled = [g for g in gpus if g.mig_enabled]
    if strategy == "single" and enabled:
        profiles = {m.profile for g in enabled for m in mig.get(g.uuid, ())}
        whole = [g for g in gpus if not g.mig_enabled]
        if whole or len(profiles) != 1:
            what = []
            if whole:
                what.append(f"GPU(s) {', '.join(str(g.index) for g in whole)} have MIG disabled")
            if len(profiles) > 1:
                what.append(f"MIG profiles differ ({', '.join(sorted(profiles))})")
            if not profiles:
                what.append("no MIG device is configured")
            raise ConfigError(
                "flags.migStrategy: 'single' needs every GPU MIG-enabled with one MIG profile, "
                f"but {'; '.join(what)}; use 'mixed'"
            )
    present = [m.profile for g in enabled for m in mig.get(g.uuid, ())]
    return advertised_names(config, present, device_plugin_dir=device_plugin_dir)


def advertised_names(
    config: Config, mig_profiles: Sequence[str], *, device_plugin_dir: Path | None = None
) -> dict[str, str]:
    """The resources ``config`` makes of GPUs with these MIG profiles: base -> advertised.

    The naming half of :func:`plan_resources`, without the hardware: ``nvidia.com/gpu``
    always, ``nvidia.com/mig-<profile>`` per profile under ``migStrategy: mixed``, each
    renamed as ``sharing.timeSlicing`` says. The DRA driver's DeviceClasses are named
    with it, so they can never differ from what the device plugin advertises.

    Args:
        config: The config.
        mig_profiles: The MIG profiles of the node's MIG devices (repeats are fine).
        device_plugin_dir: As for :func:`plan_resources`.

    Raises:
        ConfigError: A sharing rename that collides with another resource's name or
            socket, or whose socket path would be too long.
    """
    strategy = config.flags.mig_strategy
    base_names = [GPU_RESOURCE]  # always served, so a pod can wait for a GPU
    if strategy == "mixed":
        base_names.extend(_mig_resource(p) for p in mig_profiles)
    base_names = list(dict.fromkeys(base_names))
    slicing, key = config.sharing.active, config.sharing.key
    advertised: dict[str, str] = {}
    sockets: dict[str, str] = {}
    for base in base_names:
        name = slicing.advertised_name(base)
        if name in advertised.values() or (name != base and name in base_names):
            raise ConfigError(
                f"{key}: {base} would be advertised as {name}, which is already another resource"
            )
        socket = default_socket_name(name)
        if socket in sockets:
            raise ConfigError(
                f"{key}: {base} would be advertised as {name}, whose socket "
                f"name {socket!r} is already used by {sockets[socket]}"
            )
        if device_plugin_dir is not None:
            path = device_plugin_dir / socket
            try:
                check_path_length(path, temp_path(path), hint=_SOCKET_HINT)
            except PluginServerError as exc:
                if name == base:
                    raise ConfigError(str(exc)) from None
                raise ConfigError(
                    f"{key}: {base} would be advertised as {name}, whose {exc}"
                ) from None
        sockets[socket] = name
        advertised[base] = name
    return advertised


def build_inventory(
    config: Config,
    gpus: Sequence[GpuInfo],
    mig: Mapping[str, Sequence[MigDeviceInfo]],
    *,
    dev_root: str | None = None,
    sys_root: str | None = None,
    device_plugin_dir: Path | None = None,
) -> Inventory:
    """Turn what NVML enumerated into the devices of each resource.

    ``migStrategy``: ``none`` offers every GPU whole as ``nvidia.com/gpu``; ``single``
    offers the MIG devices as ``nvidia.com/gpu`` when every GPU is MIG-enabled with one
    profile (no MIG-enabled GPU: whole GPUs); ``mixed`` offers MIG devices as
    ``nvidia.com/mig-<profile>`` and the other GPUs whole.

    Args:
        config: The config (strategies, sharing, roots).
        gpus: The GPUs, in NVML index order.
        mig: GPU UUID -> its MIG devices (GPUs with MIG off may be absent).
        dev_root: Overrides ``flags.devRoot``.
        sys_root: Overrides ``flags.sysRoot``.
        device_plugin_dir: Where the resources' sockets go, to check their paths'
            length (see :func:`plan_resources`).

    Raises:
        ConfigError: ``single`` on a node whose GPUs do not all share one MIG profile,
            or a sharing rename that collides with another resource.
    """
    flags = config.flags
    dev_root = dev_root or flags.dev_root
    sys_root = sys_root or flags.sys_root
    advertised = plan_resources(config, gpus, mig, device_plugin_dir=device_plugin_dir)
    control = tuple(f"/dev/{n}" for n in CONTROL_NODES if _present(dev_root, n))
    strategy = flags.mig_strategy
    units: dict[str, GpuUnit] = {}
    for gpu in gpus:
        numa = read_numa_node(sys_root, gpu.pci_bus_id, gpu.numa_node)
        nodes = _gpu_nodes(dev_root, gpu, control)
        if strategy != "none" and gpu.mig_enabled:
            for m in mig.get(gpu.uuid, ()):
                units[m.uuid] = GpuUnit(
                    uuid=m.uuid,
                    parent_uuid=gpu.uuid,
                    index=f"{gpu.index}:{m.index}",
                    resource=GPU_RESOURCE if strategy == "single" else _mig_resource(m.profile),
                    numa_node=numa,
                    device_nodes=_mig_nodes(dev_root, nodes, m),
                    product=f"{gpu.name} MIG {m.profile}",
                    memory=m.memory_total,
                )
            if not mig.get(gpu.uuid):
                log.warning("GPU %s has MIG enabled but no MIG device; not offered", gpu.uuid)
            continue
        units[gpu.uuid] = GpuUnit(
            uuid=gpu.uuid,
            parent_uuid=gpu.uuid,
            index=str(gpu.index),
            resource=GPU_RESOURCE,
            numa_node=numa,
            device_nodes=nodes,
            product=gpu.name,
            memory=gpu.memory_total,
        )
    slicing = config.sharing.active
    resources: dict[str, list[DeviceEntry]] = {}
    shared: set[str] = set()
    for base, name in advertised.items():
        replicas = slicing.replicas_of(base)
        entries: list[DeviceEntry] = resources.setdefault(name, [])
        if replicas > 1:
            shared.add(name)
        for unit in units.values():
            if unit.resource != base:
                continue
            dev_id = unit.uuid if flags.device_id_strategy == "uuid" else unit.index
            if replicas == 1:
                entries.append(DeviceEntry(dev_id, unit))
            else:
                entries.extend(DeviceEntry(replica_id(dev_id, n), unit, n) for n in range(replicas))
    return Inventory(
        units=units,
        resources={k: tuple(v) for k, v in resources.items()},
        shared=frozenset(shared),
    )

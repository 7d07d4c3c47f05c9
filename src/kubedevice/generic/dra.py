"""The generic plugin's ``/dev`` devices as a DRA driver (``kubedevice run --dra``).

The same YAML config and the same discovery as the device plugin (:class:`Scanner`: globs,
USB identity, claims between resources, no symlink out of ``devRoot``), but each device is
published in the node's ResourceSlices instead of advertised as an extended resource:

* name: ``<resource's last part>-<device ID>`` as a DNS label (``fuse-fuse-3``,
  ``serial-ttyusb0``), ``-<n>`` appended per replica when the group has ``count > 1``;
* attributes: ``resource`` (the configured resource name), ``group``, ``path`` (the
  primary node's host path), ``replica`` (with ``count > 1``), ``numaNode``, and the
  standard ``resource.kubernetes.io/pciBusID`` / ``pcieRoot`` where sysfs has them;
* edits: the device's nodes, the group's mounts and envs (rendered for this device).

Hot-plug: the device directories are watched with inotify (as in the device plugin) and
every change yields a new device list, which the kit publishes.
"""

from __future__ import annotations

import asyncio
import glob
import hashlib
import logging
import os
import re
import stat
from collections.abc import AsyncIterator, Sequence
from typing import ClassVar, Final

from kubedevice.dra import ContainerEdits, Device, DeviceNode, Driver, Mount
from kubedevice.dra.types import AttributeValue
from kubedevice.generic.config import Config, GroupSpec, ResourceSpec, group_name
from kubedevice.generic.discovery import PhysicalDevice, Scanner, watch_dirs
from kubedevice.generic.templates import ENV_VARIABLES, Template
from kubedevice.plugin.pci import (
    PCI_BUS_ID_ATTRIBUTE,
    PCIE_ROOT_ATTRIBUTE,
    pci_bus_id_of,
    pcie_root,
)

__all__ = ["DEFAULT_DRIVER_NAME", "GenericDraDriver", "build_devices", "device_name"]

log = logging.getLogger(__name__)

#: The driver name ``kubedevice run --dra`` publishes under (``--driver-name`` changes it).
DEFAULT_DRIVER_NAME: Final = "dev.kubedevice.io"

_NOT_LABEL = re.compile(r"[^a-z0-9]+")
_MAX_NAME: Final = 63
_MAX_STRING: Final = 64


def _label(text: str) -> str:
    return _NOT_LABEL.sub("-", text.lower()).strip("-")


def device_name(resource: str, device_id: str, replica: int | None = None) -> str:
    """The DRA device name of a device (and replica): a DNS label of at most 63 characters.

    A name that had to be shortened, or whose text changed in the mapping (upper case,
    ``_``, ``.``), gets a short hash of the original so distinct devices keep distinct names.
    """
    base = f"{_label(resource.rsplit('/', 1)[-1])}-{_label(device_id)}".strip("-") or "dev"
    suffix = "" if replica is None else f"-{replica}"
    exact = f"{resource.rsplit('/', 1)[-1]}-{device_id}"
    lossy = base != exact
    if lossy or len(base) + len(suffix) > _MAX_NAME:
        digest = hashlib.sha1(f"{resource}\0{device_id}".encode()).hexdigest()[:8]
        room = _MAX_NAME - len(suffix) - 9
        base = f"{base[:room].rstrip('-')}-{digest}"
    return base + suffix


def _pci(sys_root: str, phys: PhysicalDevice) -> tuple[str | None, str | None]:
    """(pciBusID, pcieRoot) of a device node's PCI device, ``None`` where sysfs does not say.

    The node's sysfs device is found from its device number (``/sys/dev/char/M:m``), or
    else by its name (``/sys/class/*/<name>/device``); the nearest PCI device above it in
    ``/sys/devices`` is the one. Links leading out of ``sysRoot`` are not followed.
    """
    if not phys.nodes:
        return None, None
    local = phys.nodes[0].local_path
    candidates: list[str] = []
    try:
        st = os.stat(local)
    except OSError:
        st = None
    if st is not None and (stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)):
        kind = "char" if stat.S_ISCHR(st.st_mode) else "block"
        candidates.append(
            os.path.join(sys_root, "dev", kind, f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}")
        )
    name = glob.escape(os.path.basename(phys.nodes[0].host_path))
    candidates += sorted(glob.glob(os.path.join(glob.escape(sys_root), "class", "*", name)))
    for entry in candidates:
        real = os.path.realpath(entry)
        if not real.startswith(sys_root.rstrip("/") + "/") or not os.path.exists(real):
            continue
        bus_id = pci_bus_id_of(sys_root, real)
        if bus_id is None:
            device = os.path.realpath(os.path.join(real, "device"))
            if device.startswith(sys_root.rstrip("/") + "/"):
                bus_id = pci_bus_id_of(sys_root, device)
        if bus_id is not None:
            return bus_id, pcie_root(sys_root, bus_id)
    return None, None


def _edits(group: GroupSpec, phys: PhysicalDevice, resource: str) -> ContainerEdits:
    nodes = [DeviceNode(n.container_path, n.host_path, n.permissions) for n in phys.nodes]
    mounts = [Mount(m.host_path, m.container_path, m.read_only) for m in group.mounts]
    values = {
        "ids": phys.id,
        "devices": phys.id,
        "paths": ",".join(n.container_path for n in phys.nodes),
        "hostPaths": ",".join(n.host_path for n in phys.nodes),
        "count": "1",
        "resource": resource,
    }
    env = {k: Template.parse(v, ENV_VARIABLES).render(values) for k, v in group.envs.items()}
    return ContainerEdits(env=env, device_nodes=nodes, mounts=mounts)


def _devices_of(
    res: ResourceSpec, phys: PhysicalDevice, sys_root: str, taken: set[str]
) -> list[Device]:
    group = res.groups[phys.group]
    attrs: dict[str, AttributeValue] = {
        "resource": res.name[:_MAX_STRING],
        "group": group_name(group, phys.group),
    }
    if phys.nodes and len(phys.nodes[0].host_path) <= _MAX_STRING:
        attrs["path"] = phys.nodes[0].host_path
    if phys.numa_node is not None:
        attrs["numaNode"] = phys.numa_node
    bus_id, root = _pci(sys_root, phys)
    if bus_id is not None:
        attrs[PCI_BUS_ID_ATTRIBUTE] = bus_id
    if root is not None:
        attrs[PCIE_ROOT_ATTRIBUTE] = root
    edits = _edits(group, phys, res.name)
    out: list[Device] = []
    for replica in range(group.count):
        name = device_name(res.name, phys.id, replica if group.count > 1 else None)
        if name in taken:
            log.warning("device %s of %s: name %s is taken; not published", phys.id, res.name, name)
            continue
        taken.add(name)
        more: dict[str, AttributeValue] = {"replica": replica} if group.count > 1 else {}
        out.append(Device(name=name, attributes={**attrs, **more}, edits=edits))
    return out


def build_devices(config: Config, found: dict[str, list[PhysicalDevice]]) -> list[Device]:
    """The DRA devices of one scan (``Scanner.scan()``), in config and discovery order."""
    taken: set[str] = set()
    out: list[Device] = []
    for res in config.resources:
        for phys in found.get(res.name, []):
            out.extend(_devices_of(res, phys, os.path.realpath(config.sys_root), taken))
    return out


class GenericDraDriver(Driver):
    """The ``/dev`` devices of a generic config, published as DRA devices, with hot-plug.

    Args:
        config: The validated config (roots already overridden).
    """

    driver_name: ClassVar[str] = DEFAULT_DRIVER_NAME

    def __init__(self, config: Config) -> None:
        self.config = config
        self._scanner = Scanner(config)

    def scan(self) -> list[Device]:
        """Scan the trees now; the devices found."""
        return build_devices(self.config, self._scanner.scan())

    async def devices(self) -> AsyncIterator[Sequence[Device]]:
        """The devices now, then again after every change in the watched directories."""
        from kubedevice.plugin.filewatch import DirWatcher

        watcher = DirWatcher()
        try:
            watcher.watch_exactly(watch_dirs(self.config))
            last = self.scan()
            log.info("publishing %d device(s)", len(last))
            yield last
            while True:
                await watcher.changed()
                watcher.watch_exactly(watch_dirs(self.config))
                try:
                    now = await asyncio.to_thread(self.scan)
                except Exception:  # a scan bug must not end hot-plug
                    log.exception("scan failed")
                    continue
                if now != last:
                    log.info("devices changed: %d now", len(now))
                    last = now
                    yield now
        finally:
            watcher.close()

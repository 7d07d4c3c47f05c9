"""PCI facts from a (fake-able) sysfs tree: the standard DRA attributes of a PCI device.

Kubernetes names two standard device attributes for PCI devices (the
``k8s.io/dynamic-resource-allocation/deviceattribute`` package):

* ``resource.kubernetes.io/pciBusID``: the extended BDF, ``0000:3b:00.0``;
* ``resource.kubernetes.io/pcieRoot``: the PCIe root complex, ``pci0000:3a``, the first
  component of the device's real path under ``<sysRoot>/devices`` (``<sysRoot>/bus/pci/
  devices/<BDF>`` is a symlink to it).

A third, ``resource.kubernetes.io/numaNode`` (the device's NUMA node, an int, from sysfs
``numa_node``), is proposed as standard in the same package and already published by other
drivers (the DRA CPU driver's cores among them). Drivers that publish them let a claim align
devices of different drivers (a GPU and a NIC under one root, or on one NUMA node) with
``matchAttribute``. Pure filesystem reads; nothing outside
``sysRoot`` is followed. Neither side's protocol code: used by the DRA drivers.
"""

from __future__ import annotations

import os
import re
from typing import Final

__all__ = [
    "NUMA_NODE_ATTRIBUTE",
    "PCIE_ROOT_ATTRIBUTE",
    "PCI_BUS_ID_ATTRIBUTE",
    "normalize_bus_id",
    "pci_bus_id_of",
    "pcie_root",
]

PCI_BUS_ID_ATTRIBUTE: Final = "resource.kubernetes.io/pciBusID"
PCIE_ROOT_ATTRIBUTE: Final = "resource.kubernetes.io/pcieRoot"
NUMA_NODE_ATTRIBUTE: Final = "resource.kubernetes.io/numaNode"

_BDF = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-9a-f]")
_LONG_BDF = re.compile(r"[0-9a-f]{8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-9a-f]")
_ROOT = re.compile(r"pci[0-9a-f]{4}:[0-9a-f]{2}")


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def normalize_bus_id(bus_id: str) -> str | None:
    """A PCI bus ID in the extended BDF form Kubernetes expects, or ``None`` if malformed.

    Lower case; NVML's 8-digit domain (``00000000:3b:00.0``) is cut to 4 digits when its
    upper half is zero.
    """
    text = bus_id.strip().lower()
    if _LONG_BDF.fullmatch(text) and text.startswith("0000"):
        text = text[4:]
    return text if _BDF.fullmatch(text) else None


def pcie_root(sys_root: str | os.PathLike[str], bus_id: str) -> str | None:
    """The PCIe root complex (``pci0000:00``) of a PCI device, or ``None`` when unknown.

    Read from the symlink ``<sysRoot>/bus/pci/devices/<BDF>``, which must lead into
    ``<sysRoot>/devices/pci<domain>:<bus>/.../<BDF>``.
    """
    bdf = normalize_bus_id(bus_id)
    if bdf is None:
        return None
    root = os.path.realpath(sys_root)
    link = os.path.join(root, "bus", "pci", "devices", bdf)
    if not os.path.islink(link):
        return None
    real = os.path.realpath(link)
    devices = os.path.join(root, "devices")
    if not _within(real, devices) or os.path.basename(real) != bdf:
        return None
    first = os.path.relpath(real, devices).split(os.sep)[0]
    return first if _ROOT.fullmatch(first) else None


def pci_bus_id_of(sys_root: str | os.PathLike[str], sys_path: str) -> str | None:
    """The BDF of the PCI device a sysfs device path belongs to (the nearest one up).

    ``sys_path`` is a real path under ``sysRoot`` (``/sys/devices/pci0000:00/0000:00:1f.0/
    tty/ttyS0`` gives ``0000:00:1f.0``); ``None`` when no PCI device is above it.
    """
    root = os.path.realpath(sys_root)
    current = os.path.realpath(sys_path)
    while _within(current, root) and current != root:
        name = os.path.basename(current)
        if _BDF.fullmatch(name):
            return name
        current = os.path.dirname(current)
    return None

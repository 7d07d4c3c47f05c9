"""The CDI spec of the GPUs: built from the inventory and the driver files, written atomically.

A CDI-enabled containerd or CRI-O reads ``<cdiDir>/*.json`` and, for a container given
``nvidia.com/gpu=<name>``, adds that device's nodes plus the spec-wide edits (control
nodes, the driver's user-space libraries and tools). Every unit gets two names: its UUID
and its index (``0``, ``0:1`` for a MIG device). Files are looked up under the driver root
as this process sees it (``nvidiaDriverRoot``) and written with their host paths
(``hostDriverRoot``); symlinks leading out of the driver root are never followed.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from pathlib import PurePosixPath
from typing import Any, Final

from kubedevice.nvidia.devices import CONTROL_NODES, Inventory
from kubedevice.plugin import cdi
from kubedevice.plugin.cdi import validate_spec

__all__ = [
    "CDI_KIND",
    "CDI_VERSION",
    "SPEC_FILE",
    "build_spec",
    "cdi_name",
    "find_driver_files",
    "validate_spec",
    "write_spec",
]

log = logging.getLogger(__name__)

CDI_KIND: Final = "nvidia.com/gpu"
#: 0.5.0: ``hostPath`` of device nodes.
CDI_VERSION: Final = "0.5.0"
SPEC_FILE: Final = "kubedevice-nvidia.json"

#: User-space driver libraries a CUDA (or NVML) process loads, by base name.
DRIVER_LIBRARIES: Final = (
    "libcuda.so",
    "libcudadebugger.so",
    "libnvidia-ml.so",
    "libnvidia-ptxjitcompiler.so",
    "libnvidia-nvvm.so",
    "libnvidia-gpucomp.so",
    "libnvidia-allocator.so",
    "libnvidia-cfg.so",
    "libnvidia-opencl.so",
)
DRIVER_BINARIES: Final = ("nvidia-smi", "nvidia-debugdump", "nvidia-persistenced")
LIBRARY_DIRS: Final = (
    "usr/lib/x86_64-linux-gnu",
    "usr/lib/aarch64-linux-gnu",
    "usr/lib64",
    "usr/lib",
    "lib/x86_64-linux-gnu",
    "lib64",
)
BINARY_DIRS: Final = ("usr/bin", "usr/local/bin")

_MOUNT_OPTIONS: Final = ["ro", "nosuid", "nodev", "bind"]
_CONTROL: Final = frozenset(f"/dev/{n}" for n in CONTROL_NODES)


def cdi_name(device: str) -> str:
    """The fully qualified CDI name of one of our devices: ``nvidia.com/gpu=<device>``."""
    return f"{CDI_KIND}={device}"


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def find_driver_files(driver_root: str, driver_version: str | None) -> list[str]:
    """Driver files to mount, as paths relative to ``driver_root`` (``usr/lib/.../libcuda.so.1``).

    For each library the versioned file (``libcuda.so.<driver version>`` when the version
    is known, else any regular ``libcuda.so.*`` file) and its ``.so.1`` name; the tools in
    ``usr/bin``. Links whose target lies outside ``driver_root`` are skipped.
    """
    root = os.path.realpath(driver_root)
    found: list[str] = []
    for rel_dir in LIBRARY_DIRS:
        directory = os.path.join(root, rel_dir)
        if not os.path.isdir(directory) or not _within(os.path.realpath(directory), root):
            continue
        try:
            names = sorted(os.listdir(directory))
        except OSError:
            continue
        for lib in DRIVER_LIBRARIES:
            exact = f"{lib}.{driver_version}" if driver_version else None
            for name in names:
                if not name.startswith(lib + "."):
                    continue
                if exact is not None and name not in (exact, f"{lib}.1"):
                    continue
                full = os.path.join(directory, name)
                real = os.path.realpath(full)
                if not _within(real, root) or not os.path.isfile(real):
                    log.warning("skipping %s: not a file inside the driver root", full)
                    continue
                found.append(os.path.relpath(full, root))
    for rel_dir in BINARY_DIRS:
        for tool in DRIVER_BINARIES:
            full = os.path.join(root, rel_dir, tool)
            real = os.path.realpath(full)
            if os.path.isfile(real) and _within(real, root):
                found.append(os.path.relpath(full, root))
    return list(dict.fromkeys(found))


def _node(path: str) -> dict[str, Any]:
    return {"path": path, "hostPath": path, "permissions": "rw"}


def build_spec(
    inventory: Inventory,
    *,
    driver_files: Iterable[str] = (),
    host_driver_root: str = "/",
) -> dict[str, Any]:
    """The CDI spec (a JSON-able dict) of every unit in ``inventory``.

    Args:
        inventory: The GPUs and MIG devices.
        driver_files: Driver files relative to the driver root (:func:`find_driver_files`).
        host_driver_root: Where the driver root is on the host (mount sources).
    """
    devices: list[dict[str, Any]] = []
    common: dict[str, None] = {}
    for unit in inventory.units.values():
        own = [n for n in unit.device_nodes if n not in _CONTROL]
        common.update((n, None) for n in unit.device_nodes if n in _CONTROL)
        edits = {"deviceNodes": [_node(n) for n in own]}
        for name in (unit.uuid, unit.index):
            devices.append({"name": name, "containerEdits": edits})
    mounts = []
    for rel in driver_files:
        container = str(PurePosixPath("/", rel))
        mounts.append(
            {
                "hostPath": str(PurePosixPath(host_driver_root, rel)),
                "containerPath": container,
                "options": list(_MOUNT_OPTIONS),
            }
        )
    spec: dict[str, Any] = {"cdiVersion": CDI_VERSION, "kind": CDI_KIND, "devices": devices}
    container_edits: dict[str, Any] = {}
    if common:
        container_edits["deviceNodes"] = [_node(n) for n in common]
    if mounts:
        container_edits["mounts"] = mounts
    if container_edits:
        spec["containerEdits"] = container_edits
    validate_spec(spec)
    return spec


def write_spec(cdi_dir: str | os.PathLike[str], spec: dict[str, Any]) -> bool:
    """Write ``spec`` to ``<cdi_dir>/kubedevice-nvidia.json`` atomically, if it changed.

    See :func:`kubedevice.plugin.cdi.write_spec`.
    """
    return cdi.write_spec(cdi_dir, SPEC_FILE, spec)

"""The CDI spec of the GPUs: built from the inventory and the driver files, written atomically.

A CDI-enabled containerd or CRI-O reads ``<cdiDir>/*.json`` and, for a container given
``nvidia.com/gpu=<name>``, adds that device's nodes plus the spec-wide edits (control
nodes, the driver's user-space libraries and tools). Every unit gets two names: its UUID
and its index (``0``, ``0:1`` for a MIG device). Files are looked up under the driver root
as this process sees it (``nvidiaDriverRoot``) and written with their host paths
(``hostDriverRoot``); symlinks leading out of the driver root are never followed.
Each library is also mounted in the dynamic loader's default directories, so an image whose
loader does not search the host's library directory still loads it without an ld.so.cache
update; a tool that is a wrapper script is replaced by the binary it runs.
"""

from __future__ import annotations

import logging
import os
import platform
import re
from collections.abc import Iterable
from pathlib import PurePosixPath
from typing import Any, Final, NamedTuple

from kubedevice.nvidia.devices import CONTROL_NODES, Inventory
from kubedevice.plugin import cdi
from kubedevice.plugin.cdi import validate_spec

__all__ = [
    "CDI_KIND",
    "CDI_VERSION",
    "LOADER_DIRS",
    "SPEC_FILE",
    "DriverFile",
    "build_spec",
    "cdi_name",
    "find_driver_files",
    "find_tool",
    "resolve_binary",
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
#: The dynamic loader's default directories, by machine: glibc looks there after its cache,
#: so a library mounted there is found in any image (``usr/lib64``: Fedora, RHEL, UBI, SUSE;
#: the multiarch directory: Debian, Ubuntu), whatever its ld.so.conf and ld.so.cache say.
LOADER_DIRS: Final[dict[str, tuple[str, ...]]] = {
    "x86_64": ("usr/lib64", "usr/lib/x86_64-linux-gnu"),
    "aarch64": ("usr/lib64", "usr/lib/aarch64-linux-gnu"),
}

_ELF: Final = b"\x7fELF"
#: how much of a script is read to find the binary it runs
_SCRIPT_BYTES: Final = 64 * 1024
_ABSOLUTE_PATH: Final = re.compile(r"(?<![\w$.-])/[\w./+-]+")
_REAL_SUFFIXES: Final = (".real", ".bin")
_WRAPPED_BINARY_DIRS: Final = ("usr/lib/nvidia/bin", "usr/local/nvidia/bin")
_MOUNT_OPTIONS: Final = ["ro", "nosuid", "nodev", "bind"]
_CONTROL: Final = frozenset(f"/dev/{n}" for n in CONTROL_NODES)


def cdi_name(device: str) -> str:
    """The fully qualified CDI name of one of our devices: ``nvidia.com/gpu=<device>``."""
    return f"{CDI_KIND}={device}"


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


class DriverFile(NamedTuple):
    """One driver file the spec mounts: where it is and where a container sees it."""

    #: the file, relative to the driver root (``usr/lib/x86_64-linux-gnu/libcuda.so.1``)
    source: str
    #: the absolute path in the container (``/usr/lib64/libcuda.so.1``)
    target: str


def _arch_of(rel_dir: str) -> str:
    for arch in LOADER_DIRS:
        if f"{arch}-linux-gnu" in rel_dir:
            return arch
    return platform.machine()


def _library_targets(rel: str) -> list[str]:
    """Where a library found at ``rel`` is mounted: its own path, then the loader's dirs."""
    rel_dir, name = os.path.split(rel)
    dirs = [rel_dir, *LOADER_DIRS.get(_arch_of(rel_dir), ())]
    return [str(PurePosixPath("/", d, name)) for d in dict.fromkeys(dirs)]


def _head(path: str, size: int) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(size)
    except OSError:
        return b""


def _elf_inside(root: str, path: str) -> str | None:
    """``path`` resolved (inside ``root`` only) if it is an ELF file, else ``None``."""
    real = os.path.realpath(path)
    if _within(real, root) and os.path.isfile(real) and _head(real, 4) == _ELF:
        return real
    return None


def _script_candidates(root: str, wrapper: str, tool: str, text: str) -> list[str]:
    """Paths (inside ``root``) a wrapper script of ``tool`` may run, most likely first."""
    named = [
        os.path.join(root, token.lstrip("/"))
        for token in _ABSOLUTE_PATH.findall(text)
        if os.path.basename(token).startswith(tool)
    ]
    rel_dir = os.path.dirname(os.path.relpath(wrapper, root))
    siblings = [os.path.join(root, rel_dir, tool + suffix) for suffix in _REAL_SUFFIXES]
    fallback = [os.path.join(root, d, tool) for d in _WRAPPED_BINARY_DIRS]
    return [*named, *siblings, *fallback]


def resolve_binary(driver_root: str, rel: str) -> str | None:
    """The ELF binary that ``<driver_root>/<rel>`` runs, relative to the driver root.

    The file itself when it is (or links, inside the driver root, to) an ELF file. When it is
    a script (``#!``), the binary it wraps: the first ELF file among the absolute paths in the
    script whose name starts with the tool's name, then ``<tool>.real`` / ``<tool>.bin`` next
    to it, then ``usr/lib/nvidia/bin`` and ``usr/local/nvidia/bin``; every path is looked up
    under the driver root and links leading out of it are never followed. ``None`` (with a
    warning) when there is no such binary: a wrapper alone would not run in a container.
    """
    root = os.path.realpath(driver_root)
    full = os.path.join(root, rel)
    real = os.path.realpath(full)
    if not _within(real, root) or not os.path.isfile(real):
        return None
    head = _head(real, _SCRIPT_BYTES)
    if head[:4] == _ELF:
        return rel
    tool = os.path.basename(rel)
    if head[:2] != b"#!":
        log.warning(
            "skipping a driver tool: neither an ELF binary nor a script", extra={"tool": full}
        )
        return None
    text = head.decode("utf-8", "replace")
    for candidate in _script_candidates(root, real, tool, text):
        found = _elf_inside(root, candidate)
        if found is not None and found != real:
            chosen = os.path.relpath(found, root)
            log.info(
                "driver tool is a wrapper script: mounting the binary it runs",
                extra={"tool": full, "binary": chosen},
            )
            return chosen
    log.warning(
        "skipping a driver tool: a script, and no ELF binary it runs in the driver root",
        extra={"tool": full},
    )
    return None


def find_driver_files(driver_root: str, driver_version: str | None) -> list[DriverFile]:
    """Driver files to mount, with their container paths.

    For each library the versioned file (``libcuda.so.<driver version>`` when the version
    is known, else any regular ``libcuda.so.*`` file) and its ``.so.1`` name, each at its
    own path and in the dynamic loader's default directories (:data:`LOADER_DIRS`), so an
    image whose loader searches only ``/usr/lib64`` (or only the Debian directory) finds
    them. The tools in ``usr/bin``, a wrapper script replaced by the binary it runs
    (:func:`resolve_binary`). Links whose target lies outside ``driver_root`` are skipped.
    """
    root = os.path.realpath(driver_root)
    libraries: list[str] = []
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
                libraries.append(os.path.relpath(full, root))
    found: dict[str, str] = {}  # container path -> source; a host path wins over a loader dir
    for rel in libraries:
        found.setdefault(str(PurePosixPath("/", rel)), rel)
    for rel in libraries:
        for target in _library_targets(rel):
            found.setdefault(target, rel)
    for rel_dir in BINARY_DIRS:
        for tool in DRIVER_BINARIES:
            rel = os.path.join(rel_dir, tool)
            source = resolve_binary(root, rel)
            if source is not None:
                found.setdefault(str(PurePosixPath("/", rel)), source)
    return [DriverFile(source, target) for target, source in found.items()]


def _node(path: str) -> dict[str, Any]:
    return {"path": path, "hostPath": path, "permissions": "rw"}


def build_spec(
    inventory: Inventory,
    *,
    driver_files: Iterable[DriverFile] = (),
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
    mounts = [
        {
            "hostPath": str(PurePosixPath(host_driver_root, f.source)),
            "containerPath": f.target,
            "options": list(_MOUNT_OPTIONS),
        }
        for f in driver_files
    ]
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


def find_tool(driver_root: str, name: str) -> str | None:
    """The driver's tool ``name`` under ``driver_root`` (``usr/bin`` ...), if executable."""
    for rel in ("usr/bin", "usr/local/bin", "bin"):
        path = os.path.join(driver_root, rel, name)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None

"""Discovery: turn a config plus the ``/dev`` and ``/sys`` trees into physical devices.

One :class:`Scanner` scans every resource in config order, so a node claimed by an earlier
resource (or group) is not offered by a later one. Symlinks are never followed out of
``devRoot``/``sysRoot``. Pure filesystem reads; no asyncio, no gRPC.
"""

from __future__ import annotations

import glob
import logging
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from kubedevice._regular_file import read_regular
from kubedevice.generic.config import Config, GroupSpec, ResourceSpec, group_name, has_glob
from kubedevice.generic.ids import MAX_ID_LENGTH, sanitize_id
from kubedevice.generic.templates import CDI_VARIABLES, Template

__all__ = ["Node", "PhysicalDevice", "Scanner", "watch_dirs"]

log = logging.getLogger(__name__)

#: Largest NUMA node number Linux can have (``CONFIG_NODES_SHIFT`` is at most 10).
MAX_NUMA_NODE = 1023


@dataclass(frozen=True, slots=True)
class Node:
    """A device node of a physical device.

    Attributes:
        host_path: The node's path on the host (``/dev/...``), as the kubelet needs it.
        local_path: Where this process sees it (under ``devRoot``).
        container_path: Where the container gets it.
        permissions: cgroup permissions (``rwm`` subset).
    """

    host_path: str
    local_path: str
    container_path: str
    permissions: str


@dataclass(frozen=True, slots=True)
class PhysicalDevice:
    """One device found by a scan, before replicas.

    Attributes:
        id: Stable ID (without replica suffix).
        group: Index of the group that found it within its resource.
        name: Basename of the primary node, or the USB device's sysfs name.
        nodes: Device nodes given to the container.
        numa_node: NUMA node from sysfs, or None.
        claims: Canonical host paths this device claims (not offered by later selectors),
            sorted and distinct: a tuple, a quarter of a one-element frozenset's size.
    """

    id: str
    group: int
    name: str
    nodes: tuple[Node, ...]
    numa_node: int | None
    claims: tuple[str, ...]

    @property
    def primary_path(self) -> str:
        """Local path of the first node (used by health-check templates)."""
        return self.nodes[0].local_path if self.nodes else ""


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


class Scanner:
    """Scans the trees for every resource of a config; keeps a small NUMA cache."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.dev_root = os.path.realpath(config.dev_root)
        self.sys_root = os.path.realpath(config.sys_root)
        self._numa_cache: dict[str, int | None] = {}
        self._bad_numa: set[tuple[str, str]] = set()  # (file, value) already logged
        self._warned: set[str] = set()
        self._offered: dict[str, frozenset[str]] = {}  # IDs per resource, for ``limit``

    # ----------------------------------------------------------------- public

    def scan(self) -> dict[str, list[PhysicalDevice]]:
        """Devices per resource name, in config order, with claims applied."""
        claimed: set[str] = set()
        out: dict[str, list[PhysicalDevice]] = {}
        seen_numa: set[str] = set()
        for res in self.config.resources:
            out[res.name] = self._scan_resource(res, claimed, seen_numa)
        for key in list(self._numa_cache):
            if key not in seen_numa:
                del self._numa_cache[key]
        return out

    # ----------------------------------------------------------------- per resource

    def _scan_resource(
        self, res: ResourceSpec, claimed: set[str], seen_numa: set[str]
    ) -> list[PhysicalDevice]:
        found: list[PhysicalDevice] = []
        ids: set[str] = set()
        mine: set[str] = set()  # claims within this resource (earlier groups win)
        for index, group in enumerate(res.groups):
            max_len = MAX_ID_LENGTH - (len(f"::{group.count - 1}") if group.count > 1 else 0)
            candidates = (
                self._usb_devices(group, index, max_len)
                if group.usb
                else self._path_devices(group, index, group_name(group, index), max_len)
            )
            for dev in candidates:
                if not (claimed.isdisjoint(dev.claims) and mine.isdisjoint(dev.claims)):
                    continue
                if dev.id in ids:
                    dev = _with_id(dev, sanitize_id(f"{dev.id}/{list(dev.claims)}", max_len))
                mine.update(dev.claims)
                ids.add(dev.id)
                found.append(dev)
        if res.limit is not None and len(found) > res.limit:
            # Devices offered by the previous scan keep their places: a device that
            # appears later never displaces one already advertised (maybe allocated).
            before = self._offered.get(res.name, frozenset())
            ranked = [d.id for d in found if d.id in before]
            ranked += [d.id for d in found if d.id not in before]  # then discovery order
            chosen = set(ranked[: res.limit])
            found = [d for d in found if d.id in chosen]
        self._offered[res.name] = frozenset(d.id for d in found)
        for dev in found:
            claimed.update(dev.claims)
            seen_numa.update(dev.claims)
        return found

    # ----------------------------------------------------------------- paths

    def _local(self, dev_path: str) -> str:
        return self.dev_root + dev_path[len("/dev") :]

    def _host(self, local: str) -> str:
        return "/dev" + local[len(self.dev_root) :]

    def _matches(self, pattern: str) -> list[tuple[str, str]]:
        """(local path, canonical host path) of the nodes matching a ``/dev`` glob.

        One ``lstat`` per entry: a plain entry's real path is its directory's (cached) real
        path plus its name; only symlinks are resolved in full.
        """
        local_pattern = self._local(pattern)
        paths = sorted(glob.glob(local_pattern)) if has_glob(pattern) else [local_pattern]
        out = []
        dir_real: dict[str, str] = {}
        for local in paths:
            try:
                st = os.lstat(local)
                if stat.S_ISLNK(st.st_mode):
                    real = os.path.realpath(local)
                    st = os.stat(local)
                else:
                    parent, name = os.path.split(local)
                    base = dir_real.get(parent)
                    if base is None:
                        base = dir_real[parent] = os.path.realpath(parent)
                    real = os.path.join(base, name)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode):
                continue
            if not _within(real, self.dev_root):
                if local not in self._warned:
                    self._warned.add(local)
                    log.warning(
                        "skipping %s: it resolves to %s, outside devRoot %s",
                        self._host(local),
                        real,
                        self.dev_root,
                        extra={"path": self._host(local)},
                    )
                continue
            out.append((local, self._host(real)))
        return out

    def _path_devices(
        self, group: GroupSpec, index: int, gname: str, max_len: int
    ) -> Iterable[PhysicalDevice]:
        matched = [self._matches(spec.path) for spec in group.paths]
        for spec, hits in zip(group.paths, matched, strict=True):
            if not hits and not spec.optional:
                return
        shared_specs = group.paths[1:] if group.per_match else group.paths
        shared_hits = matched[1:] if group.per_match else matched
        shared_nodes: list[Node] = []
        for spec, hits in zip(shared_specs, shared_hits, strict=True):
            for local, _host in hits:
                shared_nodes.append(self._node(spec.container_path, spec.permissions, local))
        if not group.per_match:
            if not shared_nodes:
                return  # every path optional and none present: nothing to offer
            claims = tuple(sorted({h for hits in matched for _l, h in hits}))
            yield PhysicalDevice(
                id=sanitize_id(gname, max_len),
                group=index,
                name=gname,
                nodes=tuple(shared_nodes),
                numa_node=self._numa_for(next(iter(claims), None), matched),
                claims=claims,
            )
            return
        primary = group.paths[0]
        for local, host in matched[0]:
            node = self._node(primary.container_path, primary.permissions, local, host)
            yield PhysicalDevice(
                id=sanitize_id(node.host_path[len("/dev/") :], max_len),
                group=index,
                name=os.path.basename(local),
                nodes=(node, *shared_nodes),
                numa_node=self._node_numa(local, host),
                claims=(host,),
            )

    def _node(
        self, container_path: str | None, permissions: str, local: str, real: str | None = None
    ) -> Node:
        """The node at ``local``; ``real`` is its canonical host path when known.

        A node reached without symlinks has the same host path as its canonical one: that
        string is shared rather than built again (one string less per device).
        """
        host = self._host(local)
        if host == real:
            host = real
        if container_path is None:
            cpath = host
        else:
            tpl = Template.parse(container_path, CDI_VARIABLES)
            cpath = tpl.render({"id": "", "name": os.path.basename(local)})
        return Node(host_path=host, local_path=local, container_path=cpath, permissions=permissions)

    def _numa_for(self, host: str | None, matched: list[list[tuple[str, str]]]) -> int | None:
        for hits in matched:
            for local, h in hits:
                if h == host:
                    return self._node_numa(local, h)
        return None

    # ----------------------------------------------------------------- USB

    def _usb_devices(self, group: GroupSpec, index: int, max_len: int) -> Iterable[PhysicalDevice]:
        base = os.path.join(self.sys_root, "bus", "usb", "devices")
        try:
            names = sorted(os.listdir(base))
        except OSError:
            return
        for sysname in names:
            entry = os.path.join(base, sysname)
            real = os.path.realpath(entry)
            if not _within(real, self.sys_root):
                if entry not in self._warned:
                    self._warned.add(entry)
                    log.warning("skipping USB entry %s: resolves outside sysRoot", entry)
                continue
            vendor = self._attr(real, "idVendor")
            if vendor is None:
                continue  # interfaces and hubs without ids
            product = self._attr(real, "idProduct") or ""
            serial = self._attr(real, "serial")
            if not any(
                m.vendor == vendor.lower()
                and (m.product is None or m.product == product.lower())
                and (m.serial is None or m.serial == serial)
                for m in group.usb
            ):
                continue
            busnum = self._attr(real, "busnum")
            devnum = self._attr(real, "devnum")
            if busnum is None or devnum is None or not busnum.isdigit() or not devnum.isdigit():
                log.warning("USB device %s has no usable busnum/devnum; skipped", sysname)
                continue
            dev_path = f"/dev/bus/usb/{int(busnum):03d}/{int(devnum):03d}"
            hits = self._matches(dev_path)
            if not hits:
                continue
            local, host = hits[0]
            ident = (
                f"usb-{vendor}-{product}-{serial}"
                if serial
                else f"usb-{vendor}-{product}-{sysname}"
            )
            node = Node(host_path=host, local_path=local, container_path=host, permissions="rw")
            yield PhysicalDevice(
                id=sanitize_id(ident, max_len),
                group=index,
                name=sysname,
                nodes=(node,),
                numa_node=self._walk_numa(real),
                claims=(host,),
            )

    def _attr(self, directory: str, name: str) -> str | None:
        """A sysfs attribute's text; None when missing or a symlink out of sysRoot."""
        path = os.path.join(directory, name)
        if os.path.islink(path) and not _within(os.path.realpath(path), self.sys_root):
            return None
        return _read(path)

    # ----------------------------------------------------------------- NUMA

    def _node_numa(self, local: str, host: str) -> int | None:
        if host in self._numa_cache:
            return self._numa_cache[host]
        numa: int | None = None
        try:
            st = os.stat(local)
        except OSError:
            st = None
        if st is not None and stat.S_ISCHR(st.st_mode):
            entry = os.path.join(
                self.sys_root, "dev", "char", f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"
            )
            if os.path.exists(entry):
                numa = self._walk_numa(os.path.realpath(entry))
        if numa is None:
            name = os.path.basename(host)
            for cand in sorted(
                glob.glob(os.path.join(glob.escape(self.sys_root), "class", "*", glob.escape(name)))
            ):
                value = self._read_numa(os.path.join(cand, "device", "numa_node"))
                if value is not None:
                    numa = value
                    break
        self._numa_cache[host] = numa
        return numa

    def _walk_numa(self, real: str) -> int | None:
        """The first ``numa_node`` in ``real``/``real``'s ``device`` or its ancestors in sysRoot."""
        current = real
        while _within(current, self.sys_root) and current != self.sys_root:
            for candidate in (
                os.path.join(current, "numa_node"),
                os.path.join(current, "device", "numa_node"),
            ):
                if os.path.exists(candidate):
                    return self._read_numa(candidate)
            current = os.path.dirname(current)
        return None

    def _read_numa(self, path: str) -> int | None:
        real = os.path.realpath(path)
        if not _within(real, self.sys_root):
            return None
        text = _read(real)
        if text is None:
            return None
        if text.startswith("-"):
            return None  # -1: the kernel's "no NUMA node"
        if not text.isascii() or not text.isdigit() or len(text) > 4:
            self._refuse_numa(real, text)
            return None
        value = int(text)
        if value > MAX_NUMA_NODE:
            self._refuse_numa(real, text)
            return None
        return value

    def _refuse_numa(self, path: str, text: str) -> None:
        shown = text if len(text) <= 40 else text[:40] + "..."
        if (path, shown) not in self._bad_numa:
            self._bad_numa.add((path, shown))
            log.warning(
                "ignoring %s: %r is not a NUMA node (0 to %d); the device gets no NUMA node",
                path,
                shown,
                MAX_NUMA_NODE,
            )


def _with_id(dev: PhysicalDevice, new_id: str) -> PhysicalDevice:
    return PhysicalDevice(
        id=new_id,
        group=dev.group,
        name=dev.name,
        nodes=dev.nodes,
        numa_node=dev.numa_node,
        claims=dev.claims,
    )


def _read(path: str) -> str | None:
    try:
        # a FIFO planted there is an error, never a wait
        return read_regular(path, follow_symlinks=True).decode("utf-8", "replace").strip()
    except OSError:
        return None


def watch_dirs(config: Config) -> set[str]:
    """Directories whose entries decide what a scan finds (inotify targets).

    For each glob: its static prefix directory (or the nearest existing ancestor inside
    devRoot when it does not exist yet) and every existing directory the intermediate glob
    components match. USB groups add ``/dev/bus/usb`` (and its bus dirs) and sysfs's
    ``bus/usb/devices``. Recompute after each scan: new directories become watchable.
    """
    dev_root = os.path.realpath(config.dev_root)
    sys_root = os.path.realpath(config.sys_root)
    out: set[str] = set()
    patterns: list[str] = []
    for res in config.resources:
        for group in res.groups:
            patterns.extend(spec.path for spec in group.paths)
            if group.usb:
                patterns.append("/dev/bus/usb/*/*")
                out.update(
                    _existing_dirs(os.path.join(sys_root, "bus", "usb", "devices"), sys_root)
                )
    for pattern in patterns:
        parts = Path(pattern).parts[2:]  # drop "/" and "dev"
        level = [dev_root]
        for i, part in enumerate(parts):
            if i == len(parts) - 1 or has_glob(part):
                for d in level:
                    out.update(_existing_dirs(d, dev_root))
            if i == len(parts) - 1:
                break
            if has_glob(part):
                level = [
                    p
                    for d in level
                    for p in glob.glob(os.path.join(glob.escape(d), part))
                    if os.path.isdir(p) and _within(os.path.realpath(p), dev_root)
                ]
            else:
                level = [os.path.join(d, part) for d in level]
    return out


def _existing_dirs(path: str, root: str) -> set[str]:
    """``path`` if it is a directory, else its nearest existing ancestor within ``root``.

    Returned as real paths (inotify does not follow a symlinked directory); when ``path``
    is reached through a symlink, the directory holding that link is watched too, so
    replacing the link is noticed.
    """
    current = path
    while not os.path.isdir(current):
        parent = os.path.dirname(current)
        if parent == current or not _within(parent, root):
            return set()
        current = parent
    real = os.path.realpath(current)
    out = {real} if _within(real, root) else set()
    if real != current:
        probe = current
        while probe != root and _within(probe, root):
            if os.path.islink(probe):
                parent = os.path.realpath(os.path.dirname(probe))
                if _within(parent, root):
                    out.add(parent)
            probe = os.path.dirname(probe)
    return out

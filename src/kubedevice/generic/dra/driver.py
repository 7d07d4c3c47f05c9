"""The generic plugin's ``/dev`` devices as a DRA driver (``kubedevice run --dra``).

The same YAML config and the same discovery as the device plugin (:class:`Scanner`: globs,
USB identity, claims between resources, no symlink out of ``devRoot``), but each device is
published in the node's ResourceSlices instead of advertised as an extended resource:

* name: ``<resource's last part>-<device ID>`` as a DNS label (``fuse-fuse-3``,
  ``serial-ttyusb0``), ``-<n>`` appended per replica when the group has ``count > 1``;
* attributes: ``resource`` (the configured resource name), ``group``, ``path`` (the
  primary node's host path), ``replica`` (with ``count > 1``), ``numaNode``, and the
  standard ``resource.kubernetes.io/pciBusID`` / ``pcieRoot`` / ``numaNode`` where sysfs
  has them;
* edits: the device's nodes, the group's mounts and envs (rendered for this device);
* a group with ``shares: N``: each device allows multiple allocations, with a capacity
  ``shares`` of N that each claim consumes 1 of by default (``capacity.requests.shares``
  asks for more; a request policy of whole steps from 1), so the scheduler gives one
  device to at most N claims, in any namespaces.

Hot-plug: the device directories are watched with inotify (as in the device plugin) and
every change yields a new device list, which the kit publishes.

Health: a group's ``health`` checks (sysfs attribute or command, every ``periodSeconds``)
run as for the device plugin; a device whose check fails, or cannot run, is published
``Unhealthy`` (the kit taints it ``<driver>/health-check=<group>``: no new claim gets it;
the failing check is the message in the pods' status) until a check passes again. The
first round runs before the first list, so a device is not published healthy unchecked.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import hashlib
import logging
import os
import re
import stat
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import ClassVar, Final

from kubedevice.dra import (
    ContainerEdits,
    Device,
    DeviceNode,
    Driver,
    Fault,
    Health,
    Mount,
    RequestPolicy,
)
from kubedevice.dra.model.types import AttributeValue
from kubedevice.generic.config import Config, GroupSpec, ResourceSpec, group_name
from kubedevice.generic.discovery import PhysicalDevice, Scanner, watch_dirs
from kubedevice.generic.health import CheckResult, run_check
from kubedevice.generic.templates import ENV_VARIABLES, Template
from kubedevice.plugin.pci import (
    NUMA_NODE_ATTRIBUTE,
    PCI_BUS_ID_ATTRIBUTE,
    PCIE_ROOT_ATTRIBUTE,
    pci_bus_id_of,
    pcie_root,
)

__all__ = [
    "DEFAULT_DRIVER_NAME",
    "SHARES_CAPACITY",
    "GenericDraDriver",
    "build_devices",
    "device_name",
    "resource_attribute",
]

log = logging.getLogger(__name__)

#: The driver name ``kubedevice run --dra`` publishes under (``--driver-name`` changes it).
DEFAULT_DRIVER_NAME: Final = "dev.kubedevice.io"

_NOT_LABEL = re.compile(r"[^a-z0-9]+")
_MAX_NAME: Final = 63
_MAX_STRING: Final = 64
_LABEL_VALUE: Final = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9]$")
_MAX_PARALLEL_CHECKS: Final = 16

#: Health-check results by (resource name, physical device ID).
Checks = Mapping[tuple[str, str], CheckResult]


def _label(text: str) -> str:
    return _NOT_LABEL.sub("-", text.lower()).strip("-")


def resource_attribute(resource: str) -> str:
    """The ``resource`` attribute of a device of ``resource`` (at most 64 characters)."""
    return resource[:_MAX_STRING]


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
    mounts = [
        Mount(container_path=m.container_path, host_path=m.host_path, read_only=m.read_only)
        for m in group.mounts
    ]
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
    res: ResourceSpec, phys: PhysicalDevice, sys_root: str, taken: set[str], checks: Checks | None
) -> list[Device]:
    group = res.groups[phys.group]
    health = Health.HEALTHY
    fault: Fault | None = None
    if checks is not None and group.health is not None:
        result = checks.get((res.name, phys.id))
        health = Health.HEALTHY if result is not None and result.healthy else Health.UNHEALTHY
        if health == Health.UNHEALTHY:
            fault = _fault(group, phys.group, result)
    attrs: dict[str, AttributeValue] = {
        "resource": resource_attribute(res.name),
        "group": group_name(group, phys.group),
    }
    # the API server counts bytes: a non-ASCII path of 64 characters can be over 64 bytes
    if (
        phys.nodes
        and len(phys.nodes[0].host_path.encode("utf-8", "surrogateescape")) <= _MAX_STRING
    ):
        attrs["path"] = phys.nodes[0].host_path
    if phys.numa_node is not None:
        attrs["numaNode"] = phys.numa_node
        attrs[NUMA_NODE_ATTRIBUTE] = phys.numa_node
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
        out.append(
            Device(
                name=name,
                attributes={**attrs, **more},
                health=health,
                edits=edits,
                fault=fault,
                capacity=_share_capacity(group),
                allow_multiple_allocations=group.shares is not None,
                request_policies=_SHARE_POLICY if group.shares is not None else {},
            )
        )
    return out


#: The capacity a shared device has (``shares: N``), of which each claim consumes 1.
SHARES_CAPACITY: Final = "shares"


_SHARE_POLICY: Final = {SHARES_CAPACITY: RequestPolicy(default=1, min=1, step=1)}


def _share_capacity(group: GroupSpec) -> dict[str, int]:
    """The capacity of a device of ``group``: ``shares: N`` with ``shares``, else none."""
    return {} if group.shares is None else {SHARES_CAPACITY: group.shares}


def _fault(group: GroupSpec, index: int, result: CheckResult | None) -> Fault:
    """Why a device of ``group`` is not healthy: the taint ``<driver>/health-check=<group>``
    and the failing check in the message."""
    name = group_name(group, index)
    assert group.health is not None
    check = "sysfsAttribute" if group.health.sysfs_attribute is not None else "command"
    why = result.reason if result is not None else "not checked yet"
    value = name if _LABEL_VALUE.match(name) else ""
    return Fault("health-check", value, f"health check ({check}) of group {name} failed: {why}")


def build_devices(
    config: Config, found: dict[str, list[PhysicalDevice]], checks: Checks | None = None
) -> list[Device]:
    """The DRA devices of one scan (``Scanner.scan()``), in config and discovery order.

    With ``checks``, a device of a group with health checks is ``Unhealthy`` unless its
    last check passed; without, health is not considered.
    """
    taken: set[str] = set()
    out: list[Device] = []
    sys_root = os.path.realpath(config.sys_root)
    for res in config.resources:
        for phys in found.get(res.name, []):
            out.extend(_devices_of(res, phys, sys_root, taken, checks))
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
        self._found: dict[str, list[PhysicalDevice]] = {}
        self._checks: dict[tuple[str, str], CheckResult] = {}
        self._limit = asyncio.Semaphore(_MAX_PARALLEL_CHECKS)

    def scan(self) -> list[Device]:
        """Scan the trees now; the devices found (health not considered)."""
        return build_devices(self.config, self._scanner.scan())

    async def devices(self) -> AsyncIterator[Sequence[Device]]:
        """The devices now, then again after every change in the watched directories or
        in a device's health."""
        from kubedevice.plugin.filewatch import DirWatcher

        watcher = DirWatcher()
        wake = asyncio.Event()
        rescan = False

        async def watch() -> None:
            nonlocal rescan
            while True:
                await watcher.changed()
                watcher.watch_exactly(watch_dirs(self.config))
                rescan = True
                wake.set()

        tasks: list[asyncio.Task[None]] = []
        try:
            watcher.watch_exactly(watch_dirs(self.config))
            self._found = self._scanner.scan()
            await self._check_all()
            last = build_devices(self.config, self._found, self._checks)
            tasks.append(asyncio.create_task(watch(), name="watch /dev"))
            tasks.extend(self._start_health(wake))
            log.info("publishing %d device(s)", len(last))
            yield last
            while True:
                await wake.wait()
                wake.clear()
                if rescan:
                    rescan = False
                    try:
                        self._found = await asyncio.to_thread(self._scanner.scan)
                    except Exception:  # a scan bug must not end hot-plug
                        log.exception("scan failed")
                        continue
                    await self._check_new()
                now = build_devices(self.config, self._found, self._checks)
                if now != last:
                    log.info("devices changed: %d now", len(now))
                    last = now
                    yield now
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            # in a thread: closing an inotify descriptor waits 8 to 20 ms in the kernel
            await asyncio.to_thread(watcher.close)

    # ----------------------------------------------------------------- health

    def _present(self, res: ResourceSpec, index: int) -> list[PhysicalDevice]:
        return [p for p in self._found.get(res.name, []) if p.group == index]

    async def _check(self, res: ResourceSpec, index: int) -> bool:
        """Check the present devices of one group; whether any result changed."""
        spec = res.groups[index].health
        assert spec is not None
        devices = self._present(res, index)

        async def one(dev: PhysicalDevice) -> CheckResult:
            async with self._limit:
                try:
                    return await run_check(spec, dev, self._scanner.sys_root)
                except Exception as exc:  # a checker bug must not leave devices Healthy
                    log.exception("health check of %s crashed", dev.id)
                    return CheckResult(False, f"health check crashed: {exc!r}")

        results = await asyncio.gather(*(one(d) for d in devices))
        changed = False
        for dev, result in zip(devices, results, strict=True):
            key = (res.name, dev.id)
            before = self._checks.get(key)
            if before is None or before.healthy != result.healthy:
                changed = True
                if result.healthy:
                    log.info("%s %s: health check passed", res.name, dev.id)
                else:
                    log.warning("%s %s: health check failed: %s", res.name, dev.id, result.reason)
            self._checks[key] = result
        return changed

    async def _check_all(self) -> None:
        await asyncio.gather(
            *(
                self._check(res, i)
                for res in self.config.resources
                for i, group in enumerate(res.groups)
                if group.health is not None
            )
        )

    async def _check_new(self) -> None:
        """Forget the results of devices gone; check at once the groups with a new device."""
        present = {(name, p.id) for name, found in self._found.items() for p in found}
        for key in [k for k in self._checks if k not in present]:
            del self._checks[key]
        await asyncio.gather(
            *(
                self._check(res, i)
                for res in self.config.resources
                for i, group in enumerate(res.groups)
                if group.health is not None
                and any((res.name, p.id) not in self._checks for p in self._present(res, i))
            )
        )

    def _start_health(self, wake: asyncio.Event) -> list[asyncio.Task[None]]:
        async def loop(res: ResourceSpec, index: int, period: float) -> None:
            while True:
                await asyncio.sleep(period)  # the configured check period
                if await self._check(res, index):
                    wake.set()

        return [
            asyncio.create_task(
                loop(res, i, group.health.period_seconds), name=f"health {res.name}[{i}]"
            )
            for res in self.config.resources
            for i, group in enumerate(res.groups)
            if group.health is not None
        ]

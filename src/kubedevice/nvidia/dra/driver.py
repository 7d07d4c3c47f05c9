"""The GPU DRA driver (``kubedevice nvidia dra``): the NVML backend's GPUs on the DRA kit.

:class:`GpuDraDriver` starts NVML, publishes every GPU (or MIG device, by ``migStrategy``)
with NVIDIA's attribute names (:mod:`kubedevice.nvidia.dra.devices`), runs the same XID
health policies as the device plugin (:class:`~kubedevice.nvidia.health.HealthMonitor`):
an Unhealthy or lost GPU is tainted in the ResourceSlices by why (``<driver>/xid=79``,
``<driver>/gpu-lost``: no new allocation, or eviction for the faults in ``evictOn``; see
:mod:`kubedevice.nvidia.dra.faults`) and reported with that reason on the kubelet's health
stream, and is untainted when the policy says it has recovered.

Prepare: each allocated device's opaque ``GpuConfig`` / ``MigDeviceConfig``
(:mod:`kubedevice.nvidia.dra.config`) is validated first, for every device of the claim,
then applied (the time-slice interval, through the backend); the claim's CDI spec gets
each device's own nodes (``/dev/nvidia<minor>``, MIG capability nodes), and once per
claim the control nodes and the driver's files.

Memory shares (``dra.memoryShares``): a whole GPU allows multiple allocations and
each claim is given a share of its ``memory``; the scheduler adds the shares up. The
prepare tells the container the claim's share of each GPU in bytes (a claim's shares of
one GPU added up), in ``KUBEDEVICE_GPU_MEMORY_LIMIT_<GPU UUID>`` (``-`` as ``_``) and, when
the claim's shares are all of one GPU, ``KUBEDEVICE_GPU_MEMORY_LIMIT`` too. Without MPS
nothing enforces it: the workload is advised, the scheduler accounts. With ``dra.mps`` it
is enforced: each share is a client of its GPU's MPS control daemon, limited to what the
scheduler counted (:mod:`kubedevice.nvidia.dra.mps`); a daemon that died and was started
again makes its GPU Unhealthy (``<driver>/mps-daemon``) until its earlier shares are gone.

Time slices of claims that share a GPU: the level in force is the one the most recently
prepared of them asked for. Unpreparing a claim leaves the GPU as if that claim had never
been prepared: the level of the most recent remaining claim that set one, or ``Default``
when none is left (the backend is called only when the level changes). What each claim set
(GPU UUID, level, order) is its devices' ``data`` in the kit's checkpoint, and the
``restore`` hook rebuilds it at start, so a restarted driver still gives a GPU back, and
sets each GPU's level in force again (a reboot sets them to Default).

MIG on demand (:mod:`kubedevice.nvidia.dra.ondemand`, :mod:`kubedevice.nvidia.dra.migs`):
prepare makes (or adopts) each partition's GPU instance; the ``refresh`` hook makes one a
reboot destroyed again at its placement, at start and on every answer from the checkpoint.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any, ClassVar, Final

from kubedevice.dra import (
    ClaimError,
    ContainerEdits,
    CounterSet,
    Device,
    DeviceNode,
    Driver,
    Fault,
    Health,
    Mount,
    PreparedDevice,
)
from kubedevice.dra.model.types import AllocatedDevice, Claim, PreparedClaim
from kubedevice.errors import ConfigError, NvmlError
from kubedevice.nvidia.backend import MigPartitioning, NvmlBackend
from kubedevice.nvidia.cdi import DriverFile, find_driver_files
from kubedevice.nvidia.config import Config
from kubedevice.nvidia.devices import CONTROL_NODES, read_numa_node
from kubedevice.nvidia.dra import mps, ondemand, timeslice
from kubedevice.nvidia.dra.config import TIME_SLICE_LEVELS, effective_config
from kubedevice.nvidia.dra.devices import GpuDevice, Partition, build_devices
from kubedevice.nvidia.dra.faults import fault_of
from kubedevice.nvidia.dra.migs import MigInstances, caps_of
from kubedevice.nvidia.dra.shares import MEMORY_LIMIT_ENV, share_env
from kubedevice.nvidia.health import HealthMonitor, HealthState
from kubedevice.nvidia.mps import MpsDaemons, control_command
from kubedevice.nvidia.runner import Hardware, enumerate_hardware
from kubedevice.nvidia.topology import build_topology

__all__ = ["DEFAULT_DRIVER_NAME", "MEMORY_LIMIT_ENV", "GpuDraDriver"]

log = logging.getLogger(__name__)

#: The driver name ``kubedevice nvidia dra`` publishes under (``--driver-name`` changes it).
DEFAULT_DRIVER_NAME: Final = "gpu.kubedevice.io"
_PLUGINS: Final = "/var/lib/kubelet/plugins"
_CONTROL: Final = frozenset(f"/dev/{n}" for n in CONTROL_NODES)


class GpuDraDriver(Driver):
    """The GPUs of one node as DRA devices.

    Args:
        config: The GPU plugin's config (``migStrategy``, health policies, roots), CLI
            overrides applied.
        backend: The NVML backend, not yet initialised (the driver starts and stops it).
        wait_timeout_ms: Longest single NVML event wait (see :class:`HealthMonitor`).
        mps_root: With ``dra.mps``: where each GPU's MPS pipe and log directories go (on
            the host; ``<kubelet dir>/plugins/<driver>/mps``).
    """

    driver_name: ClassVar[str] = DEFAULT_DRIVER_NAME

    def __init__(
        self,
        config: Config,
        backend: NvmlBackend,
        *,
        wait_timeout_ms: int = 1000,
        mps_root: Path | None = None,
    ) -> None:
        self.config = config
        self.backend = backend
        self.hardware = Hardware(None, (), {})
        self.health: HealthState | None = None
        self._wait_timeout_ms = wait_timeout_ms
        self._by_name: dict[str, GpuDevice] = {}
        self._opened: list[GpuDevice] | None = None
        self._driver_files: list[DriverFile] = []
        self._changed = asyncio.Event()
        self._started = asyncio.Event()
        # GPU UUID -> claim UID -> (order prepared, the time-slice level that claim set)
        self._slices: dict[str, dict[str, tuple[int, int]]] = {}
        self._order = 0  # the highest order given (or restored)
        self._slice_lock = asyncio.Lock()  # one time-slice change at a time
        self._counter_sets: list[CounterSet] = []  # MIG on demand: one per GPU
        #: MIG on demand: the instances made for claims (None: the backend cannot make any).
        self.migs = MigInstances(backend) if isinstance(backend, MigPartitioning) else None
        self._restored = False  # restore() ran once (the time slices are set again)
        #: ``dra.mps``: the MPS control daemons (set up by :meth:`open`).
        self.mps: MpsDaemons | None = None
        self._mps_root = mps_root or Path(_PLUGINS, self.driver_name, "mps")

    # ------------------------------------------------------------------ devices

    @property
    def gpu_devices(self) -> list[GpuDevice]:
        """The published devices and their hardware (after :meth:`devices` started)."""
        return list(self._by_name.values())

    async def wait_started(self) -> None:
        """Wait until NVML is up and the first device list was built."""
        await self._started.wait()

    def open(self) -> None:
        """Start NVML and build the device list now (blocking), so that a node without a
        driver, or a config that does not fit the GPUs, fails before anything is served.

        :meth:`devices` does it itself when this was not called.

        Raises:
            NvmlError: NVML cannot start and ``failOnInitError`` is set.
            ConfigError: The config does not fit the GPUs (``migStrategy: single``).
        """
        try:
            self._opened = self._start()
        except BaseException:
            try:
                self.backend.shutdown()
            except NvmlError as exc:  # the clean-up's error never hides the real one
                log.debug("NVML shutdown after a failed start: %s", exc)
            raise

    def _start(self) -> list[GpuDevice]:
        """Start NVML and build the devices (blocking; in a thread)."""
        flags = self.config.flags
        hw = enumerate_hardware(self.backend, fail_on_init_error=flags.fail_on_init_error)
        self.hardware = hw
        numa = {g.uuid: read_numa_node(flags.sys_root, g.pci_bus_id) for g in hw.gpus}
        topology = build_topology(self.backend, hw.gpus, numa) if len(hw.gpus) > 1 else None
        devices = build_devices(self.config, hw.driver, hw.gpus, hw.mig, topology=topology)
        if self.config.dra.mig_on_demand:
            devices = self._on_demand(devices, topology)
        if hw.driver is not None:
            self._driver_files = find_driver_files(
                flags.nvidia_driver_root, hw.driver.driver_version
            )
        if self.config.dra.mps and self.mps is None:
            command = control_command(self.backend, flags.nvidia_driver_root)
            self.mps = MpsDaemons(
                self._mps_root, command, on_change=self._changed.set,
                cgroup_root=flags.host_cgroup_root,
            )  # fmt: skip
        return devices

    def _on_demand(self, devices: list[GpuDevice], topology: Any) -> list[GpuDevice]:
        """MIG on demand: each partitionable GPU's devices become the whole GPU and every
        placement of every profile, with the GPU's counter set (blocking)."""
        hw = self.hardware
        parts = ondemand.partitionable(
            self.backend, hw.gpus, self.config.dra.mig_on_demand_profiles
        )
        if not parts:
            log.warning("MIG on demand: no GPU in MIG mode whose MIG devices can be made")
            return devices
        flags = dataclasses.replace(self.config.flags, mig_strategy="none")
        whole_config = dataclasses.replace(self.config, flags=flags)
        wholes = {
            gd.gpu.uuid: gd
            for gd in build_devices(whole_config, hw.driver, hw.gpus, {}, topology=topology)
        }
        out: list[GpuDevice] = []
        self._counter_sets = []
        # In NVML order; a partitionable GPU's own devices (none under ``mixed``: it has no
        # MIG device yet) give way to its on-demand ones.
        for gpu in hw.gpus:
            uuid = gpu.uuid
            if uuid not in parts:
                out.extend(gd for gd in devices if gd.gpu.uuid == uuid)
            elif uuid in wholes:
                counter_set, made = ondemand.on_demand_devices(wholes.pop(uuid), parts[uuid])
                self._counter_sets.append(counter_set)
                out.extend(made)
                log.info(
                    "MIG on demand on %s: %d placements of %d profiles",
                    uuid,
                    len(made) - 1,
                    len(parts[uuid]),
                )
        return out

    def counter_sets(self) -> Sequence[CounterSet]:
        """MIG on demand: each partitionable GPU's counters (memory slices ...)."""
        return list(self._counter_sets)

    def _snapshot(self) -> list[Device]:
        out = []
        faults = self.health.faults() if self.health is not None else {}
        broken = self.mps.faults() if self.mps is not None else {}
        for gd in self._by_name.values():
            fault = faults.get(gd.unit.uuid)
            if fault is not None:
                out.append(gd.with_health(Health.UNHEALTHY, fault_of(*fault)))
            elif gd.unit.uuid in broken:
                why = Fault("mps-daemon", "restarted", broken[gd.unit.uuid])
                out.append(gd.with_health(Health.UNHEALTHY, why))
            else:
                out.append(gd.with_health(Health.HEALTHY))
        return out

    async def devices(self) -> AsyncIterator[Sequence[Device]]:
        """Start NVML; yield the GPUs now and again after every health change."""
        if self._opened is None:
            await asyncio.to_thread(self.open)
        built, self._opened = self._opened or [], None
        self._by_name = {gd.device.name: gd for gd in built}
        monitor: HealthMonitor | None = None
        if not self.config.health.disabled and self.hardware.gpus:
            self.health = HealthState(self.config.health, self.hardware.parents)
            monitor = HealthMonitor(
                self.backend,
                self.health,
                self._changed.set,
                wait_timeout_ms=self._wait_timeout_ms,
            )
            await monitor.start()
        self._started.set()
        log.info("publishing %d GPU device(s)", len(built))
        try:
            while True:
                self._changed.clear()
                snapshot = self._snapshot()
                bad = [d.name for d in snapshot if d.health != Health.HEALTHY]
                if bad:
                    log.warning("unhealthy, not offered: %s", ", ".join(bad))
                yield snapshot
                await self._changed.wait()
        finally:
            if monitor is not None:
                await monitor.stop()
            if self.mps is not None:  # the daemons keep running: claims still hold them
                await self.mps.close()
            await asyncio.to_thread(self.backend.shutdown)

    # ------------------------------------------------------------------ prepare

    def _check(self, claim: Claim) -> list[tuple[GpuDevice, int | None]]:
        """Each allocated device and the time-slice level its config asks for (or None).

        Raises:
            ClaimError: An unknown device, or a config that is invalid or of
                the wrong kind for its device; the message names the request and field.
        """
        plan: list[tuple[GpuDevice, int | None]] = []
        for allocated in claim.devices:
            gd = self._by_name.get(allocated.name)
            if gd is None:
                raise ClaimError(f"device {allocated.name} is not a GPU of this node")
            # an unhealthy device: the kit refused the claim before this hook (its rule,
            # the same for every driver: kubedevice.dra.node.rules), unless it tolerates the taint
            source = f"request {allocated.request}: opaque config"
            try:
                config = effective_config([c.parameters for c in allocated.configs], source)
            except ConfigError as exc:
                raise ClaimError(str(exc)) from None
            level: int | None = None
            if config is not None:
                is_mig = gd.mig is not None or gd.partition is not None
                want = "MigDeviceConfig" if is_mig else "GpuConfig"
                if config.kind != want:
                    what = "a MIG device" if is_mig else "a whole GPU"
                    raise ClaimError(
                        f"{source}: kind: {config.kind} does not apply to {allocated.name}, "
                        f"which is {what} (use {want})"
                    )
                if config.interval is not None and not is_mig:
                    level = TIME_SLICE_LEVELS[config.interval]
            plan.append((gd, level))
        return plan

    def _edits(self, gd: GpuDevice, first: bool, caps: Sequence[str] = ()) -> ContainerEdits:
        own = [DeviceNode(p, host_path=p) for p in gd.unit.device_nodes if p not in _CONTROL]
        own += [DeviceNode(p, host_path=p) for p in caps]
        if not first:
            return ContainerEdits(device_nodes=own)
        control = [DeviceNode(p, host_path=p) for p in gd.unit.device_nodes if p in _CONTROL]
        host_root = self.config.flags.effective_host_driver_root
        mounts = [
            Mount(container_path=f.target, host_path=str(PurePosixPath(host_root, f.source)))
            for f in self._driver_files
        ]
        return ContainerEdits(device_nodes=own + control, mounts=mounts)

    def _set_time_slice(self, uuid: str, level: int) -> None:
        """Set a GPU's time-slice level (blocking; see :func:`timeslice.set_time_slice`)."""
        timeslice.set_time_slice(self.backend, self.config.flags.nvidia_driver_root, uuid, level)

    async def prepare(self, claim: Claim) -> Sequence[PreparedDevice]:
        """Check every device and config of ``claim``, apply the configs, give the edits.

        Each device's ``data`` records the time slice it set (``gpu``, ``timeSlice``,
        ``order``), for :meth:`unprepare` and :meth:`restore`. If a GPU refuses, what the
        claim set on the others is given back and the claim fails.
        """
        plan = self._check(claim)
        uid = claim.ref.uid
        gpu = None  # dra.mps: start (or join) the daemon of the GPU the claim has shares of
        if self.mps is not None:
            wholes = [None if gd.mig or gd.partition else gd.gpu.uuid for gd, _ in plan]
            gpu = await mps.hold(self.mps, claim, wholes)
        try:
            return await self._prepare(claim, plan, gpu)
        except BaseException:
            if gpu is not None and self.mps is not None:
                await self.mps.release(gpu, uid)
            raise

    async def _prepare(
        self, claim: Claim, plan: list[tuple[GpuDevice, int | None]], gpu: str | None
    ) -> Sequence[PreparedDevice]:
        uid = claim.ref.uid
        made = await self._make_mig_devices(claim, [gd for gd, _ in plan])
        data: list[dict[str, Any]] = []
        async with self._slice_lock:
            for gd, level in plan:
                if level is None:
                    # a record even so: a device with none was never prepared to the end
                    data.append({"gpu": gd.gpu.uuid})
                    continue
                try:
                    await asyncio.to_thread(self._set_time_slice, gd.gpu.uuid, level)
                except NvmlError as exc:
                    await self._release(uid)
                    await self._destroy([r for r, _ in made if r is not None])
                    raise ClaimError(
                        f"cannot set the time-slice interval of {gd.device.name}: {exc}"
                    ) from None
                self._order += 1
                self._slices.setdefault(gd.gpu.uuid, {})[uid] = (self._order, level)
                data.append({"gpu": gd.gpu.uuid, "timeSlice": level, "order": self._order})
                log.info(
                    "time-slice level %d set on %s for claim %s", level, gd.gpu.uuid, claim.ref
                )
        envs = share_env(
            [(d, gd.unit.uuid) for d, (gd, _) in zip(claim.devices, plan, strict=True)]
        )
        prepared = []
        for i, (allocated, (gd, _level), record, (mig, caps), env) in enumerate(
            zip(claim.devices, plan, data, made, envs, strict=True)
        ):
            if mig is not None:
                record = {**record, "mig": mig.to_json()}
            edits = self._edits(gd, i == 0, caps)
            mounts = list(edits.mounts)
            if gpu is not None and gpu == gd.gpu.uuid and env and self.mps is not None:
                record = {**record, "mps": True}
                env, more = mps.claim_edits(self.mps, claim, [gd.gpu.uuid for gd, _ in plan], env)
                mounts += more
            if env:
                edits = ContainerEdits(env, edits.device_nodes, mounts)
            prepared.append(PreparedDevice(allocated, edits, data=record))
        return prepared

    async def _make_mig_devices(
        self, claim: Claim, devices: Sequence[GpuDevice]
    ) -> list[tuple[ondemand.MigRecord | None, tuple[str, ...]]]:
        """MIG on demand: make (or adopt) each partition's MIG device (its record and cap
        nodes); see :class:`MigInstances`.

        If NVML refuses one, those made for this claim are destroyed and the claim fails.
        """
        wanted = [
            (gd.gpu.uuid, gd.partition, gd.device.name) if gd.partition is not None else None
            for gd in devices
        ]
        if self.migs is None or not any(wanted):
            return [(None, ()) for _ in devices]
        made = await self.migs.make(claim.ref.uid, wanted)
        return [
            (ondemand.MigRecord(m.parent_uuid, m.gi_id, m.uuid), caps_of(m)) if m else (None, ())
            for m in made
        ]

    async def _destroy(self, records: Sequence[ondemand.MigRecord]) -> None:
        """Destroy these MIG devices (those still there).

        Raises:
            NvmlError: NVML refused (``InUse`` ...).
        """
        if self.migs is not None:
            await self.migs.destroy(records)

    async def unprepare(self, claim: PreparedClaim) -> None:
        """Destroy the MIG devices the claim had made; give each GPU the claim set a time
        slice on the level still in force without it."""
        records = [r for r in map(ondemand.MigRecord.from_data, claim.data) if r is not None]
        try:
            await self._destroy(records)
            if self.migs is not None and claim.devices and not any(claim.data):
                # a prepare cut short: the instances at its placements no other claim owns
                parts = self._partitions(claim, await self._known())
                await self.migs.undo(claim.ref.uid, parts)
        except NvmlError as exc:  # the kubelet asks again
            raise ClaimError(f"cannot destroy the claim's MIG devices: {exc}") from None
        async with self._slice_lock:  # claims of an earlier run are known from restore()
            await self._release(claim.ref.uid)
            if claim.devices and not any(claim.data):
                await self._settle_unrecorded(claim)
        if self.mps is not None:
            await mps.release(self.mps, claim, await self._known())

    async def _settle_unrecorded(self, claim: PreparedClaim) -> None:
        """A prepare cut short (the driver killed, or the caller's deadline, in :meth:`prepare`)
        recorded nothing (a finished one records each device): give each GPU of the claim
        the time-slice level in force without it, whatever that prepare set (locked)."""
        known = await self._known()
        uuids = sorted({gd.gpu.uuid for _, _, name in claim.devices if (gd := known.get(name))})
        for uuid in uuids:
            level = _in_force(self._slices.get(uuid, {}))
            try:
                await asyncio.to_thread(self._set_time_slice, uuid, level)
            except NvmlError as exc:
                log.warning(
                    "claim %s: cannot set the time-slice interval of %s back to %d: %s",
                    claim.ref, uuid, level, exc,
                )  # fmt: skip
            else:
                log.info(
                    "claim %s: its prepare was cut short; time-slice level of %s is %d",
                    claim.ref, uuid, level,
                )  # fmt: skip

    async def restore(self, claims: Sequence[PreparedClaim]) -> None:
        """Take back what the claims prepared before a restart set (from their ``data``).

        At start the GPUs are given the time-slice levels in force again (a reboot set them
        back to Default) and, with MIG on demand, the instances no claim owns are destroyed
        (those a claim owns and a reboot destroyed are made again by :meth:`refresh`).
        Also called with the whole new set when another instance of the driver on the node
        (a rolling upgrade) changed the checkpoint: the claims are the truth, the time
        slices known are rebuilt from them alone.
        """
        async with self._slice_lock:
            self._slices = {}
            for claim in claims:
                self._remember(claim)
            if not self._restored and self._slices:
                await self._known()  # NVML started
                await self._set_in_force(sorted(self._slices), "at start")
            self._restored = True
        if self._slices:
            log.info("time slices of earlier claims restored on %d GPU(s)", len(self._slices))
        if self.config.dra.mig_on_demand and self.migs is not None:
            known = await self._known()
            gpus = sorted({gd.gpu.uuid for gd in known.values() if gd.partition is not None})
            await self.migs.restore(claims, gpus)
        if self.config.dra.mps:
            await self._known()  # NVML started, the daemons' supervisor made
            if self.mps is not None:  # adopt the daemons the claims hold, stop the others
                await self.mps.adopt(mps.holders(claims))

    async def refresh(self, claim: PreparedClaim) -> Sequence[PreparedDevice | None] | None:
        """Make what the claim's checkpoint entry says exists true again (a reboot): each
        MIG device that is gone is made at its placement (new cap nodes: its device's
        ``data`` and edits are answered); each GPU it set a time slice on is set to the
        level in force."""
        async with self._slice_lock:
            mine = sorted({r["gpu"] for r in claim.data if "timeSlice" in r and "gpu" in r})
            if mine:
                await self._known()
                await self._set_in_force([g for g in mine if g in self._slices], "again")
        if self.migs is None or not any(map(ondemand.MigRecord.from_data, claim.data)):
            return None
        known = await self._known()
        out: list[PreparedDevice | None] = []
        for i, ((request, pool, name), data) in enumerate(
            zip(claim.devices, claim.data, strict=False)
        ):
            record, gd = ondemand.MigRecord.from_data(data), known.get(name)
            if record is None or gd is None or gd.partition is None:
                out.append(None)
                continue
            try:
                mig = await self.migs.remake(claim.ref.uid, record, gd.partition)
            except NvmlError as exc:
                raise ClaimError(f"cannot make MIG device {name} again: {exc}") from None
            if mig is None:
                out.append(None)
                continue
            new = ondemand.MigRecord(mig.parent_uuid, mig.gi_id, mig.uuid)
            share = claim.share_ids[i] if i < len(claim.share_ids) else None
            admin = claim.admin_access[i] if i < len(claim.admin_access) else False
            device = AllocatedDevice(request, pool, name, gd.device, admin_access=admin,
                                     share_id=share)  # fmt: skip
            edits = self._edits(gd, i == 0, caps_of(mig))
            out.append(PreparedDevice(device, edits, {**data, "mig": new.to_json()}))
        out += [None] * (len(claim.devices) - len(out))
        return out if any(out) else None

    async def _known(self) -> dict[str, GpuDevice]:
        """The devices by name, NVML started first if it was not (a call at start)."""
        if self._opened is None and not self._by_name:
            await asyncio.to_thread(self.open)
        # before devices() runs (at start), the GPUs are still in _opened
        return self._by_name or {gd.device.name: gd for gd in self._opened or ()}

    @staticmethod
    def _partitions(
        claim: PreparedClaim, known: Mapping[str, GpuDevice]
    ) -> list[tuple[str, Partition]]:
        """``(GPU UUID, partition)`` of each of the claim's devices made on demand."""
        out = []
        for _, _, name in claim.devices:
            gd = known.get(name)
            if gd is not None and gd.partition is not None:
                out.append((gd.gpu.uuid, gd.partition))
        return out

    async def _set_in_force(self, uuids: Sequence[str], why: str) -> None:
        """Set each GPU's time-slice level in force (locked); a refusal is logged."""
        for uuid in uuids:
            level = _in_force(self._slices.get(uuid, {}))
            try:
                await asyncio.to_thread(self._set_time_slice, uuid, level)
            except NvmlError as exc:
                log.warning("cannot set the time-slice level of %s to %d: %s", uuid, level, exc)
            else:
                log.info("time-slice level of %s set to %d %s", uuid, level, why)

    def _remember(self, claim: PreparedClaim) -> None:
        """Record the time slices in ``claim``'s data that are not known yet."""
        levels = set(TIME_SLICE_LEVELS.values())
        for record in claim.data:
            if "timeSlice" not in record:  # none set (or a prepare cut short: no record)
                continue
            gpu = record.get("gpu")
            level, order = _int(record.get("timeSlice")), _int(record.get("order"))
            if not isinstance(gpu, str) or level is None or level not in levels or order is None:
                log.warning("claim %s: unknown time-slice record %r, ignored", claim.ref, record)
                continue
            self._slices.setdefault(gpu, {}).setdefault(claim.ref.uid, (order, level))
            self._order = max(self._order, order)

    async def _release(self, uid: str) -> None:
        """Forget ``uid``'s time slices; set each GPU whose level in force changes (locked)."""
        for gpu_uuid, by_claim in list(self._slices.items()):
            before = _in_force(by_claim)
            if by_claim.pop(uid, None) is None:
                continue
            after = _in_force(by_claim)
            if not by_claim:
                del self._slices[gpu_uuid]
            if after == before:
                continue
            try:
                await asyncio.to_thread(self._set_time_slice, gpu_uuid, after)
            except NvmlError as exc:
                log.warning(
                    "cannot set the time-slice interval of %s to %d: %s", gpu_uuid, after, exc
                )
            else:
                log.info("time-slice level of %s back to %d", gpu_uuid, after)


def _in_force(by_claim: Mapping[str, tuple[int, int]]) -> int:
    """The level of the most recently prepared claim (``0``, Default, when none)."""
    return max(by_claim.values())[1] if by_claim else 0


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None

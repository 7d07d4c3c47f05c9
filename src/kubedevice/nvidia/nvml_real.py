"""The real NVML backend on nvidia-ml-py (``import pynvml``, loaded lazily by ``init()``).

Error mapping: an NVML call that answers NotSupported (or FunctionNotFound, an older
driver) where the value is optional gives ``None``; every other failure raises
:class:`~kubedevice.errors.NvmlError` with NVML's error name (``"GpuIsLost"`` ...) and the
GPU's UUID.

Events: one NVML event set holds XidCriticalError | DoubleBitEccError of every watched
GPU (single-bit ECC is not a health event). NVML cannot be woken from
``nvmlEventSetWait``, so :meth:`RealNvml.wait_event` waits in slices of at most
``interrupt_slice_ms`` (500 ms by default) and :meth:`RealNvml.interrupt` takes effect at
the end of the current slice; events themselves are returned the moment NVML reports
them. When the wait fails with GpuIsLost (NVML does not say which GPU), every watched GPU
is probed and a GPU_LOST event is returned for each that no longer answers.

MIG: profile names are computed from the MIG device's attributes (slices and memory) the
way NVIDIA's tools name them (``1g.18gb``, ``1c.3g.71gb``); the ``nvidia-caps`` minors of a
MIG device are read from ``<proc>/driver/nvidia/capabilities/gpu<minor>/mig/gi<G>[/ci<C>]/access``.

This module has been exercised only against a stand-in ``pynvml`` module in the test
suite (no GPU was available where it was written); ``scripts/gpu-check`` runs it on a
real GPU.
"""

from __future__ import annotations

import collections
import importlib
import logging
import math
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubedevice.errors import NvmlError
from kubedevice.nvidia.backend import (
    ARCHITECTURE_NAMES,
    BRAND_NAMES,
    DriverInfo,
    EventKind,
    GpuInfo,
    GpuSample,
    HealthEvent,
    Link,
    MigDeviceInfo,
    MigProfileInfo,
    P2PLevel,
    ProcessSample,
)
from kubedevice.nvidia.nvml_mig import RealMigPartitioning, engines_of

__all__ = ["RealNvml", "mig_profile_name"]

log = logging.getLogger(__name__)

_MIB = 1024 * 1024
_GIB = 1024 * _MIB
_NO_INSTANCE = 0xFFFFFFFF  # gpuInstanceId / computeInstanceId of a non-MIG event
_OPTIONAL_CODES = frozenset({"NotSupported", "FunctionNotFound"})
# Failures of NVML as a whole, not of one GPU: enumeration stops on these.
_FATAL_CODES = frozenset(
    {"Uninitialized", "DriverNotLoaded", "LibraryNotFound", "LibRmVersionMismatch"}
)
_MINOR_RE = re.compile(r"DeviceFileMinor:\s*(\d+)")


def mig_profile_name(
    gi_slices: int, ci_slices: int, memory_mib: int, parent_memory_bytes: int
) -> str:
    """The canonical MIG profile name (``"1g.18gb"``, ``"1c.3g.71gb"``).

    The memory part is the MIG device's share of the parent's memory rounded up to
    eighths, times the parent's memory in whole GiB (rounded up), rounded half up:
    an H200 (141 GiB) gives 1g.18gb, 2g.35gb, 3g.71gb, 7g.141gb; an H100 80GB gives
    1g.10gb, 2g.20gb, 3g.40gb, 7g.80gb.
    """
    if parent_memory_bytes <= 0:
        gb = max(1, round(memory_mib / 1024))
    else:
        share = memory_mib * _MIB / parent_memory_bytes
        share = math.ceil(share * 8 - 1e-9) / 8
        total_gb = -(-parent_memory_bytes // _GIB)
        gb = math.floor(share * total_gb + 0.5)
    base = f"{gi_slices}g.{gb}gb"
    return base if ci_slices in (0, gi_slices) else f"{ci_slices}c.{base}"


def _text(value: Any) -> str:
    """pynvml returns ``bytes`` in older releases and ``str`` in newer ones."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace").rstrip("\x00")
    return str(value)


def _sysfs_bus_id(bus_id: str) -> str:
    """NVML's "00000000:18:00.0" -> sysfs "0000:18:00.0"."""
    bus_id = bus_id.strip().lower()
    domain, sep, rest = bus_id.partition(":")
    if sep and len(domain) > 4:
        domain = domain[-4:]
    return f"{domain}{sep}{rest}"


class RealNvml(RealMigPartitioning):
    """An :class:`~kubedevice.nvidia.backend.NvmlBackend` on the NVIDIA driver's NVML.

    Also :class:`~kubedevice.nvidia.backend.MigPartitioning` (:mod:`.nvml_mig`).
    """

    def __init__(
        self,
        *,
        proc_root: Path = Path("/proc"),
        interrupt_slice_ms: int = 500,
        module: Any = None,
    ) -> None:
        self._proc_root = proc_root
        self._slice_ms = max(1, interrupt_slice_ms)
        self._module = module  # a pynvml-compatible module (tests); None = import pynvml
        self._nv: Any = None
        self._up = False  # nvmlInit succeeded and nvmlShutdown has not run since
        self._codes: dict[int, str] = {}
        self._lock = threading.RLock()
        self._handles: dict[str, Any] = {}  # uuid -> handle (GPUs and MIG devices)
        self._infos: dict[str, GpuInfo] = {}
        self._mig: dict[str, list[MigDeviceInfo]] = {}
        self._set: Any = None
        self._set_busy = False
        self._retired: list[Any] = []
        self._watched: list[str] = []
        self._pending: collections.deque[HealthEvent] = collections.deque()
        self._interrupt = threading.Event()
        self.skipped: list[tuple[int, NvmlError]] = []  # GPUs gpus() left out

    # ---- plumbing

    def _load(self) -> Any:
        if self._nv is not None:
            return self._nv
        if self._module is not None:
            nv = self._module
        else:
            try:
                nv = importlib.import_module("pynvml")
            except ImportError as e:
                raise NvmlError(
                    "LibraryNotFound",
                    "nvidia-ml-py is not installed: pip install 'kubedevice[nvidia]'",
                ) from e
        self._codes = {
            int(getattr(nv, name)): "".join(
                w.capitalize() for w in name.removeprefix("NVML_ERROR_").split("_")
            )
            for name in dir(nv)
            if name.startswith("NVML_ERROR_") and isinstance(getattr(nv, name), int)
        }
        self._nv = nv
        return nv

    def _code(self, e: Exception) -> str:
        value = getattr(e, "value", None)
        if isinstance(value, int) and value in self._codes:
            return self._codes[value]
        return "Unknown"

    def _call(
        self, fn: Callable[..., Any], *args: Any, uuid: str | None = None, optional: bool = False
    ) -> Any:
        """Call an NVML function; NotSupported -> None when ``optional``, else NvmlError."""
        nv = self._load()
        try:
            return fn(*args)
        except nv.NVMLError as e:
            code = self._code(e)
            if optional and code in _OPTIONAL_CODES:
                return None
            raise NvmlError(code, f"{getattr(fn, '__name__', 'nvml')}: {e}", uuid) from e

    def _handle(self, uuid: str) -> Any:
        with self._lock:
            h = self._handles.get(uuid)
        if h is None:
            nv = self._require()
            h = self._call(nv.nvmlDeviceGetHandleByUUID, uuid, uuid=uuid)
            with self._lock:
                self._handles[uuid] = h
        return h

    def _require(self) -> Any:
        if self._nv is None:
            raise NvmlError("Uninitialized", "RealNvml.init() has not been called")
        return self._nv

    # ---- NvmlBackend

    def init(self) -> DriverInfo:
        """Load libnvidia-ml through pynvml and initialise it."""
        nv = self._load()
        self._call(nv.nvmlInit)
        self._up = True
        driver = _text(self._call(nv.nvmlSystemGetDriverVersion))
        cuda_fn = (
            getattr(nv, "nvmlSystemGetCudaDriverVersion_v2", None)
            or nv.nvmlSystemGetCudaDriverVersion
        )
        cuda = self._call(cuda_fn, optional=True)
        nvml_version = _text(self._call(nv.nvmlSystemGetNVMLVersion, optional=True) or "")
        cuda_text = f"{int(cuda) // 1000}.{(int(cuda) % 1000) // 10}" if cuda else ""
        return DriverInfo(driver_version=driver, cuda_version=cuda_text, nvml_version=nvml_version)

    def shutdown(self) -> None:
        """Free the event set and shut NVML down; nothing when NVML is not up (so a
        clean-up after a failed init() never raises ``Uninitialized`` over its error)."""
        nv = self._nv
        if nv is None or not self._up:
            return
        with self._lock:
            sets = [s for s in (self._set, *self._retired) if s is not None]
            self._set, self._retired, self._watched = None, [], []
            self._handles.clear()
        for s in sets:
            self._call(nv.nvmlEventSetFree, s, optional=True)
        self._up = False
        self._call(nv.nvmlShutdown)

    def gpus(self) -> list[GpuInfo]:
        """Every GPU that answers, in NVML index order (optional facts may be "unknown").

        A GPU that fails to answer (fallen off the bus, ``Unknown`` ...) is left out and
        logged, so one broken GPU does not keep the others from being offered; the
        indexes and errors of those left out are in :attr:`skipped`.
        """
        nv = self._require()
        out: list[GpuInfo] = []
        self.skipped = []
        for index in range(int(self._call(nv.nvmlDeviceGetCount))):
            try:
                info, h = self._gpu_info(nv, index)
            except NvmlError as e:
                if e.code in _FATAL_CODES:
                    raise
                log.error("GPU %d does not answer NVML, left out: %s", index, e)
                self.skipped.append((index, e))
                continue
            out.append(info)
            with self._lock:
                self._handles[info.uuid] = h
                self._infos[info.uuid] = info
        return out

    def _gpu_info(self, nv: Any, index: int) -> tuple[GpuInfo, Any]:
        h = self._call(nv.nvmlDeviceGetHandleByIndex, index)
        uuid = _text(self._call(nv.nvmlDeviceGetUUID, h))
        mem = self._call(nv.nvmlDeviceGetMemoryInfo, h, uuid=uuid)
        pci = self._call(nv.nvmlDeviceGetPciInfo, h, uuid=uuid)
        bus = _text(getattr(pci, "busIdLegacy", b"") or pci.busId)
        cc = self._call(nv.nvmlDeviceGetCudaComputeCapability, h, uuid=uuid, optional=True)
        arch = self._call(nv.nvmlDeviceGetArchitecture, h, uuid=uuid, optional=True)
        brand = self._call(nv.nvmlDeviceGetBrand, h, uuid=uuid, optional=True)
        mig = self._call(nv.nvmlDeviceGetMigMode, h, uuid=uuid, optional=True)
        serial = self._call(nv.nvmlDeviceGetSerial, h, uuid=uuid, optional=True)
        info = GpuInfo(
            index=index,
            uuid=uuid,
            minor=int(self._call(nv.nvmlDeviceGetMinorNumber, h, uuid=uuid)),
            name=_text(self._call(nv.nvmlDeviceGetName, h, uuid=uuid)),
            memory_total=int(mem.total),
            pci_bus_id=_sysfs_bus_id(bus),
            compute_capability=(int(cc[0]), int(cc[1])) if cc else (0, 0),
            architecture=ARCHITECTURE_NAMES.get(int(arch), "unknown")
            if arch is not None
            else "unknown",
            brand=BRAND_NAMES.get(int(brand), "unknown") if brand is not None else "unknown",
            mig_capable=mig is not None,
            mig_enabled=bool(mig is not None and int(mig[0]) == 1),
            serial=_text(serial) if serial else None,
        )
        return info, h

    def mig_devices(self, gpu_uuid: str) -> list[MigDeviceInfo]:
        """The MIG devices of a MIG-enabled GPU, with profile names and cap minors."""
        nv = self._require()
        h = self._handle(gpu_uuid)
        mode = self._call(nv.nvmlDeviceGetMigMode, h, uuid=gpu_uuid, optional=True)
        if mode is None or int(mode[0]) != 1:
            return []
        info = self._infos.get(gpu_uuid)
        parent_mem = (
            info.memory_total if info else int(self._call(nv.nvmlDeviceGetMemoryInfo, h).total)
        )
        minor = info.minor if info else int(self._call(nv.nvmlDeviceGetMinorNumber, h))
        index = info.index if info else int(self._call(nv.nvmlDeviceGetIndex, h))
        count = int(self._call(nv.nvmlDeviceGetMaxMigDeviceCount, h, uuid=gpu_uuid))
        out: list[MigDeviceInfo] = []
        for i in range(count):
            try:
                mh = self._call(nv.nvmlDeviceGetMigDeviceHandleByIndex, h, i, uuid=gpu_uuid)
            except NvmlError as e:
                if e.code in ("NotFound", "InvalidArgument"):
                    continue  # an empty slot
                raise
            muuid = _text(self._call(nv.nvmlDeviceGetUUID, mh, uuid=gpu_uuid))
            gi = int(self._call(nv.nvmlDeviceGetGpuInstanceId, mh, uuid=muuid))
            ci = int(self._call(nv.nvmlDeviceGetComputeInstanceId, mh, uuid=muuid))
            attrs = self._call(nv.nvmlDeviceGetAttributes, mh, uuid=muuid)
            mem_mib = int(attrs.memorySizeMB)
            out.append(
                MigDeviceInfo(
                    parent_uuid=gpu_uuid,
                    parent_index=index,
                    uuid=muuid,
                    index=len(out),
                    profile=mig_profile_name(
                        int(attrs.gpuInstanceSliceCount),
                        int(attrs.computeInstanceSliceCount),
                        mem_mib,
                        parent_mem,
                    ),
                    gi_id=gi,
                    ci_id=ci,
                    memory_total=mem_mib * _MIB,
                    cap_minors=self._cap_minors(minor, gi, ci),
                    profile_info=self._profile_info(h, gi, muuid),
                )
            )
            with self._lock:
                self._handles[muuid] = mh
        with self._lock:
            self._mig[gpu_uuid] = out
        return out

    def _profile_info(self, h: Any, gi: int, uuid: str) -> MigProfileInfo | None:
        """The GPU instance's profile info and placement; ``None`` where NVML cannot say."""
        nv = self._require()
        try:
            info = nv.nvmlGpuInstanceGetInfo(nv.nvmlDeviceGetGpuInstanceById(h, gi))
            for profile in range(int(getattr(nv, "NVML_GPU_INSTANCE_PROFILE_COUNT", 0))):
                try:
                    p = nv.nvmlDeviceGetGpuInstanceProfileInfo(h, profile)
                except nv.NVMLError:
                    continue  # a profile this GPU does not have
                if int(p.id) == int(info.profileId):
                    return MigProfileInfo(
                        engines=engines_of(p),
                        memory_mib=int(p.memorySizeMB),
                        placement_start=int(info.placement.start),
                        placement_size=int(info.placement.size),
                    )
        except (nv.NVMLError, AttributeError) as exc:
            log.debug("%s: no GPU instance profile info: %s", uuid, exc)
        return None

    def _cap_minors(self, gpu_minor: int, gi: int, ci: int) -> tuple[int, ...]:
        base = self._proc_root / "driver/nvidia/capabilities" / f"gpu{gpu_minor}" / "mig"
        minors: list[int] = []
        for path in (base / f"gi{gi}" / "access", base / f"gi{gi}" / f"ci{ci}" / "access"):
            try:
                m = _MINOR_RE.search(path.read_text())
            except OSError:
                continue
            if m:
                minors.append(int(m.group(1)))
        return tuple(minors)

    def link(self, uuid_a: str, uuid_b: str) -> Link | None:
        """PCIe common ancestor and NVLink count between two GPUs (None if NVML cannot tell)."""
        nv = self._require()
        if uuid_a == uuid_b:
            raise NvmlError("InvalidArgument", "link() needs two distinct GPUs", uuid_a)
        ha, hb = self._handle(uuid_a), self._handle(uuid_b)
        level = self._call(
            nv.nvmlDeviceGetTopologyCommonAncestor, ha, hb, uuid=uuid_a, optional=True
        )
        bus_b = self._bus_id(uuid_b, hb)
        active_a, direct = self._nvlinks(uuid_a, ha, bus_b)
        nvlinks = direct
        if nvlinks == 0 and active_a:
            # Links to an NVSwitch: the remote end is the switch, not the peer GPU. If NVML
            # says the pair talks over NVLink, count the links both sides can use.
            status = self._call(
                nv.nvmlDeviceGetP2PStatus,
                ha,
                hb,
                nv.NVML_P2P_CAPS_INDEX_NVLINK,
                uuid=uuid_a,
                optional=True,
            )
            if status is not None and int(status) == int(nv.NVML_P2P_STATUS_OK):
                active_b, _ = self._nvlinks(uuid_b, hb, "")
                nvlinks = min(active_a, active_b)
        if level is None and nvlinks == 0:
            return None
        try:
            p2p = P2PLevel(int(level)) if level is not None else P2PLevel.SYSTEM
        except ValueError:
            p2p = P2PLevel.SYSTEM
        return Link(level=p2p, nvlinks=nvlinks)

    def _bus_id(self, uuid: str, h: Any) -> str:
        info = self._infos.get(uuid)
        if info is not None:
            return info.pci_bus_id
        pci = self._call(self._require().nvmlDeviceGetPciInfo, h, uuid=uuid)
        return _sysfs_bus_id(_text(getattr(pci, "busIdLegacy", b"") or pci.busId))

    def _nvlinks(self, uuid: str, h: Any, peer_bus: str) -> tuple[int, int]:
        """(active links, active links whose remote end is ``peer_bus``)."""
        nv = self._require()
        active = direct = 0
        for link in range(int(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18))):
            try:
                state = self._call(nv.nvmlDeviceGetNvLinkState, h, link, uuid=uuid, optional=True)
            except NvmlError as e:
                if e.code == "InvalidArgument":  # past the last link of this GPU
                    break
                raise
            if state is None:  # NotSupported: no NVLink on this GPU
                break
            if int(state) != 1:
                continue
            active += 1
            if peer_bus:
                remote = self._call(
                    nv.nvmlDeviceGetNvLinkRemotePciInfo, h, link, uuid=uuid, optional=True
                )
                if remote is not None:
                    rbus = _text(getattr(remote, "busIdLegacy", b"") or remote.busId)
                    if _sysfs_bus_id(rbus) == peer_bus:
                        direct += 1
        return active, direct

    def sample(self, uuid: str) -> GpuSample:
        """One reading of every live value; NotSupported fields are None."""
        nv = self._require()
        h = self._handle(uuid)

        def opt(fn: Callable[..., Any], *args: Any) -> Any:
            return self._call(fn, h, *args, uuid=uuid, optional=True)

        util = opt(nv.nvmlDeviceGetUtilizationRates)
        mem = opt(nv.nvmlDeviceGetMemoryInfo)
        power = opt(nv.nvmlDeviceGetPowerUsage)
        temp = opt(nv.nvmlDeviceGetTemperature, nv.NVML_TEMPERATURE_GPU)
        procs = opt(nv.nvmlDeviceGetComputeRunningProcesses) or []
        ecc = opt(
            nv.nvmlDeviceGetTotalEccErrors,
            nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            nv.NVML_VOLATILE_ECC,
        )
        remapped = opt(nv.nvmlDeviceGetRemappedRows)
        return GpuSample(
            utilization_gpu=int(util.gpu) if util is not None else None,
            utilization_memory=int(util.memory) if util is not None else None,
            memory_used=int(mem.used) if mem is not None else None,
            memory_total=int(mem.total) if mem is not None else None,
            power_mw=int(power) if power is not None else None,
            temperature_c=int(temp) if temp is not None else None,
            processes=tuple(
                ProcessSample(
                    pid=int(p.pid),
                    used_memory=int(p.usedGpuMemory) if p.usedGpuMemory is not None else None,
                )
                for p in procs
            ),
            ecc_double_bit_volatile=int(ecc) if ecc is not None else None,
            remapped_rows_pending=bool(remapped[2]) if remapped is not None else None,
            remapped_rows_failure=bool(remapped[3]) if remapped is not None else None,
        )

    def probe(self, uuid: str) -> None:
        """Ask the GPU for its memory info; raise NvmlError if it does not answer."""
        nv = self._require()
        self._call(nv.nvmlDeviceGetMemoryInfo, self._handle(uuid), uuid=uuid, optional=True)

    def watch(self, uuids: list[str]) -> None:
        """Register XID and double-bit ECC events of these GPUs in a new event set.

        NotSupported GPUs are skipped; a GPU already lost yields a GPU_LOST event; any
        other per-GPU failure is logged and that GPU skipped (the others stay watched).
        """
        nv = self._require()
        wanted = int(nv.nvmlEventTypeXidCriticalError) | int(nv.nvmlEventTypeDoubleBitEccError)
        new_set = self._call(nv.nvmlEventSetCreate)
        watched: list[str] = []
        lost: list[str] = []
        with self._lock:
            parent = {m.uuid: g for g, migs in self._mig.items() for m in migs}
        # Events are registered on physical GPUs; a MIG UUID stands for its parent.
        for u in dict.fromkeys(parent.get(u, u) for u in uuids):
            try:
                h = self._handle(u)
                supported = self._call(
                    nv.nvmlDeviceGetSupportedEventTypes, h, uuid=u, optional=True
                )
                mask = wanted & int(supported) if supported is not None else 0
                if not mask:
                    log.info("NVML health events not supported; GPU not watched", extra={"uuid": u})
                    continue
                self._call(nv.nvmlDeviceRegisterEvents, h, mask, new_set, uuid=u, optional=True)
                watched.append(u)
            except NvmlError as e:
                if e.code == "GpuIsLost":
                    lost.append(u)
                else:
                    log.warning("cannot watch GPU events: %s", e, extra={"uuid": u})
        with self._lock:
            old = self._set
            self._set, self._watched = new_set, watched
            if old is not None:
                self._retired.append(old)
            now = time.monotonic()
            self._pending.extend(HealthEvent(EventKind.GPU_LOST, u, monotonic=now) for u in lost)
            retired = [] if self._set_busy else self._retired
            if not self._set_busy:
                self._retired = []
        for s in retired:
            self._call(nv.nvmlEventSetFree, s, optional=True)

    def wait_event(self, timeout_ms: int) -> HealthEvent | None:
        """Block in nvmlEventSetWait (in slices, see the module docstring) until an event."""
        nv = self._require()
        deadline = time.monotonic() + max(timeout_ms, 0) / 1000.0
        while True:
            with self._lock:
                if self._pending:
                    return self._pending.popleft()
                if self._interrupt.is_set():
                    self._interrupt.clear()
                    return None
                event_set = self._set
                self._set_busy = event_set is not None
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            if remaining_ms <= 0:
                self._release_set()
                return None
            if event_set is None:
                # Nothing watched: wait for interrupt() or the timeout, no NVML call.
                self._interrupt.wait(remaining_ms / 1000.0)
                continue
            try:
                data = self._call(nv.nvmlEventSetWait, event_set, min(remaining_ms, self._slice_ms))
            except NvmlError as e:
                if e.code == "Timeout":
                    continue
                if e.code == "GpuIsLost":
                    self._find_lost()
                    continue
                raise
            finally:
                self._release_set()
            event = self._event(data)
            if event is not None:
                return event

    def interrupt(self) -> None:
        """Make wait_event return None at the end of its current slice (NVML cannot be woken)."""
        self._interrupt.set()

    # ---- events

    def _release_set(self) -> None:
        nv = self._nv
        with self._lock:
            self._set_busy = False
            retired, self._retired = self._retired, []
        for s in retired:
            self._call(nv.nvmlEventSetFree, s, optional=True)

    def _find_lost(self) -> None:
        with self._lock:
            watched = list(self._watched)
        now = time.monotonic()
        for u in watched:
            try:
                self.probe(u)
            except NvmlError as e:
                if e.code == "GpuIsLost":
                    with self._lock:
                        self._watched.remove(u)
                        self._pending.append(HealthEvent(EventKind.GPU_LOST, u, monotonic=now))

    def _event(self, data: Any) -> HealthEvent | None:
        nv = self._require()
        now = time.monotonic()
        uuid = _text(self._call(nv.nvmlDeviceGetUUID, data.device))
        gi, ci = int(data.gpuInstanceId), int(data.computeInstanceId)
        if gi != _NO_INSTANCE:
            for m in self._mig.get(uuid, ()):
                if m.gi_id == gi and (ci == _NO_INSTANCE or m.ci_id == ci):
                    uuid = m.uuid
                    break
        etype = int(data.eventType)
        if etype & int(nv.nvmlEventTypeXidCriticalError):
            return HealthEvent(EventKind.XID, uuid, xid=int(data.eventData), monotonic=now)
        if etype & int(nv.nvmlEventTypeDoubleBitEccError):
            return HealthEvent(EventKind.ECC_DOUBLE_BIT, uuid, monotonic=now)
        return None

"""A stand-in ``pynvml`` module (hardware fake) for testing nvml_real without a GPU.

It keeps pynvml's surface where RealNvml touches it: NVMLError carrying ``.value``,
the NVML_ERROR_* codes, the constants, handles, ctypes-like result objects with the
same attribute names, and an event set whose wait blocks on a queue with a timeout.
"""

from __future__ import annotations

import queue
import types
from dataclasses import dataclass, field
from typing import Any

ERRORS = {
    "NVML_ERROR_UNINITIALIZED": 1,
    "NVML_ERROR_INVALID_ARGUMENT": 2,
    "NVML_ERROR_NOT_SUPPORTED": 3,
    "NVML_ERROR_NO_PERMISSION": 4,
    "NVML_ERROR_NOT_FOUND": 6,
    "NVML_ERROR_DRIVER_NOT_LOADED": 9,
    "NVML_ERROR_TIMEOUT": 10,
    "NVML_ERROR_LIBRARY_NOT_FOUND": 12,
    "NVML_ERROR_FUNCTION_NOT_FOUND": 13,
    "NVML_ERROR_GPU_IS_LOST": 15,
    "NVML_ERROR_UNKNOWN": 999,
}
NOT_SUPPORTED = "NOT_SUPPORTED"


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        self.value = value
        super().__init__(f"NVML error {value}")


def err(name: str) -> NVMLError:
    return NVMLError(ERRORS[f"NVML_ERROR_{name}"])


@dataclass
class MigSpec:
    uuid: str
    gi: int
    ci: int
    gi_slices: int
    ci_slices: int
    memory_mib: int


@dataclass
class GpuSpec:
    uuid: str
    bus: str  # NVML form "00000000:18:00.0"
    minor: int
    name: Any = "NVIDIA H100 80GB HBM3"
    memory_total: int = 81559 * 1024 * 1024
    memory_used: int = 600 * 1024 * 1024
    cc: Any = (9, 0)
    arch: Any = 9
    brand: Any = 14
    mig_mode: Any = (0, 0)  # NOT_SUPPORTED for a GPU without MIG
    serial: Any = "1650000000001"
    util: Any = (10, 3)
    power: Any = 70000
    temp: Any = 31
    procs: Any = ()  # (pid, used or None)
    ecc: Any = 0
    remapped: Any = (0, 0, 0, 0)
    nvlink_remote: Any = ()  # remote bus ids of active links, or NOT_SUPPORTED
    events: Any = 0xFF9F  # supported event types, or NOT_SUPPORTED
    lost: bool = False
    mig: list[MigSpec] = field(default_factory=list)


@dataclass(frozen=True)
class Handle:
    uuid: str


class _Obj:
    def __init__(self, **kw: Any) -> None:
        self.__dict__.update(kw)


def make_module(
    gpus: list[GpuSpec],
    *,
    init_error: str | None = None,
    ancestors: Any = None,
    p2p_nvlink_ok: Any = (),
) -> types.ModuleType:
    """A module object with pynvml's names, playing ``gpus``."""
    mod = types.ModuleType("pynvml")
    for k, v in ERRORS.items():
        setattr(mod, k, v)
    mod.NVMLError = NVMLError  # type: ignore[attr-defined]
    consts = {
        "NVML_TEMPERATURE_GPU": 0,
        "NVML_MEMORY_ERROR_TYPE_UNCORRECTED": 1,
        "NVML_VOLATILE_ECC": 0,
        "NVML_P2P_CAPS_INDEX_NVLINK": 2,
        "NVML_P2P_STATUS_OK": 0,
        "NVML_NVLINK_MAX_LINKS": 18,
        "nvmlEventTypeSingleBitEccError": 1,
        "nvmlEventTypeDoubleBitEccError": 2,
        "nvmlEventTypeXidCriticalError": 8,
    }
    for k, v in consts.items():
        setattr(mod, k, v)
    by_uuid = {g.uuid: g for g in gpus}
    mig_by_uuid = {m.uuid: (g, m) for g in gpus for m in g.mig}
    state: dict[str, Any] = {"init": False, "registered": [], "sets": [], "freed": 0}
    events: queue.Queue[Any] = queue.Queue()
    mod.state = state  # type: ignore[attr-defined]
    mod.events = events  # type: ignore[attr-defined]
    mod.gpus = by_uuid  # type: ignore[attr-defined]
    mod.mig_by_uuid = mig_by_uuid  # type: ignore[attr-defined]

    def need_init() -> None:
        if not state["init"]:
            raise err("UNINITIALIZED")

    def gpu(h: Handle) -> GpuSpec:
        need_init()
        g = by_uuid.get(h.uuid) or mig_by_uuid[h.uuid][0]
        if g.lost:
            raise err("GPU_IS_LOST")
        return g

    def value(v: Any) -> Any:
        if v == NOT_SUPPORTED:
            raise err("NOT_SUPPORTED")
        return v

    def fn(f: Any) -> Any:
        setattr(mod, f.__name__, f)
        return f

    @fn
    def nvmlInit() -> None:
        if init_error:
            raise err(init_error)
        state["init"] = True

    @fn
    def nvmlShutdown() -> None:
        need_init()  # as libnvidia-ml: a shutdown without a successful init is Uninitialized
        state["init"] = False

    @fn
    def nvmlSystemGetDriverVersion() -> Any:
        return b"580.159.04"  # old pynvml releases answer bytes

    @fn
    def nvmlSystemGetCudaDriverVersion_v2() -> int:
        return 13000

    @fn
    def nvmlSystemGetNVMLVersion() -> str:
        return "13.580.159.04"

    @fn
    def nvmlDeviceGetCount() -> int:
        need_init()
        return len(gpus)

    @fn
    def nvmlDeviceGetHandleByIndex(i: int) -> Handle:
        need_init()
        return Handle(gpus[i].uuid)

    @fn
    def nvmlDeviceGetHandleByUUID(u: str) -> Handle:
        need_init()
        if u not in by_uuid and u not in mig_by_uuid:
            raise err("NOT_FOUND")
        return Handle(u)

    @fn
    def nvmlDeviceGetUUID(h: Handle) -> str:
        gpu(h)
        return h.uuid

    @fn
    def nvmlDeviceGetIndex(h: Handle) -> int:
        return gpus.index(gpu(h))

    @fn
    def nvmlDeviceGetMinorNumber(h: Handle) -> int:
        return gpu(h).minor

    @fn
    def nvmlDeviceGetName(h: Handle) -> Any:
        return gpu(h).name

    @fn
    def nvmlDeviceGetMemoryInfo(h: Handle) -> Any:
        g = gpu(h)
        if h.uuid in mig_by_uuid:
            m = mig_by_uuid[h.uuid][1]
            return _Obj(total=m.memory_mib << 20, used=0, free=m.memory_mib << 20)
        return _Obj(total=g.memory_total, used=g.memory_used, free=g.memory_total - g.memory_used)

    @fn
    def nvmlDeviceGetPciInfo(h: Handle) -> Any:
        g = gpu(h)
        return _Obj(busId=g.bus.encode(), busIdLegacy=g.bus[4:].encode())

    @fn
    def nvmlDeviceGetCudaComputeCapability(h: Handle) -> Any:
        return value(gpu(h).cc)

    @fn
    def nvmlDeviceGetArchitecture(h: Handle) -> Any:
        return value(gpu(h).arch)

    @fn
    def nvmlDeviceGetBrand(h: Handle) -> Any:
        return value(gpu(h).brand)

    @fn
    def nvmlDeviceGetMigMode(h: Handle) -> Any:
        return value(gpu(h).mig_mode)

    @fn
    def nvmlDeviceGetSerial(h: Handle) -> Any:
        return value(gpu(h).serial)

    @fn
    def nvmlDeviceGetMaxMigDeviceCount(h: Handle) -> int:
        return 7 if gpu(h).mig else 0

    @fn
    def nvmlDeviceGetMigDeviceHandleByIndex(h: Handle, i: int) -> Handle:
        g = gpu(h)
        if i >= len(g.mig):
            raise err("NOT_FOUND")
        return Handle(g.mig[i].uuid)

    @fn
    def nvmlDeviceGetGpuInstanceId(h: Handle) -> int:
        gpu(h)
        return mig_by_uuid[h.uuid][1].gi

    @fn
    def nvmlDeviceGetComputeInstanceId(h: Handle) -> int:
        gpu(h)
        return mig_by_uuid[h.uuid][1].ci

    @fn
    def nvmlDeviceGetAttributes(h: Handle) -> Any:
        gpu(h)
        m = mig_by_uuid[h.uuid][1]
        return _Obj(
            gpuInstanceSliceCount=m.gi_slices,
            computeInstanceSliceCount=m.ci_slices,
            memorySizeMB=m.memory_mib,
        )

    @fn
    def nvmlDeviceGetTopologyCommonAncestor(a: Handle, b: Handle) -> Any:
        gpu(a), gpu(b)
        if ancestors is None:
            raise err("NOT_SUPPORTED")
        return ancestors[frozenset((a.uuid, b.uuid))]

    @fn
    def nvmlDeviceGetNvLinkState(h: Handle, link: int) -> int:
        remotes = value(gpu(h).nvlink_remote)
        if link >= 4:
            raise err("INVALID_ARGUMENT")
        return 1 if link < len(remotes) else 0

    @fn
    def nvmlDeviceGetNvLinkRemotePciInfo(h: Handle, link: int) -> Any:
        return _Obj(busId=gpu(h).nvlink_remote[link].encode())

    @fn
    def nvmlDeviceGetP2PStatus(a: Handle, b: Handle, index: int) -> int:
        assert index == 2
        return 0 if frozenset((a.uuid, b.uuid)) in p2p_nvlink_ok else 5

    @fn
    def nvmlDeviceGetUtilizationRates(h: Handle) -> Any:
        u = value(gpu(h).util)
        return _Obj(gpu=u[0], memory=u[1])

    @fn
    def nvmlDeviceGetPowerUsage(h: Handle) -> Any:
        return value(gpu(h).power)

    @fn
    def nvmlDeviceGetTemperature(h: Handle, sensor: int) -> Any:
        assert sensor == 0
        return value(gpu(h).temp)

    @fn
    def nvmlDeviceGetComputeRunningProcesses(h: Handle) -> Any:
        return [_Obj(pid=p, usedGpuMemory=m) for p, m in value(gpu(h).procs)]

    @fn
    def nvmlDeviceGetTotalEccErrors(h: Handle, etype: int, counter: int) -> Any:
        assert (etype, counter) == (1, 0)
        return value(gpu(h).ecc)

    @fn
    def nvmlDeviceGetRemappedRows(h: Handle) -> Any:
        return value(gpu(h).remapped)

    @fn
    def nvmlEventSetCreate() -> Any:
        need_init()
        s = _Obj(id=len(state["sets"]))
        state["sets"].append(s)
        return s

    @fn
    def nvmlEventSetFree(s: Any) -> None:
        state["freed"] += 1

    @fn
    def nvmlDeviceGetSupportedEventTypes(h: Handle) -> Any:
        return value(gpu(h).events)

    @fn
    def nvmlDeviceRegisterEvents(h: Handle, mask: int, s: Any) -> None:
        gpu(h)
        state["registered"].append((h.uuid, mask, s.id))

    @fn
    def nvmlEventSetWait(s: Any, timeout_ms: int) -> Any:
        need_init()
        try:
            item = events.get(timeout=timeout_ms / 1000.0)
        except queue.Empty:
            raise err("TIMEOUT") from None
        if isinstance(item, str):
            raise err(item)
        uuid, etype, data, gi, ci = item
        return _Obj(
            device=Handle(uuid),
            eventType=etype,
            eventData=data,
            gpuInstanceId=gi,
            computeInstanceId=ci,
        )

    return mod

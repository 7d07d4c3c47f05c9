"""MIG instance calls for the stand-in ``pynvml`` (hardware fake): what an H200 answered.

The profile infos and placements are those NVML gave on a real H200 (driver 580.159.04).
Placements and counts go through ctypes arrays and ``byref`` as with the real module; a
placement passed to ``nvmlDeviceCreateGpuInstanceWithPlacement`` by value (the real call
then crashes the process) raises ``TypeError`` here.
"""

from __future__ import annotations

import ctypes
import itertools
import types
import uuid as uuidlib
from typing import Any

from .stand_in_pynvml import Handle, MigSpec, NVMLError, _Obj

#: enum value -> (profile id, name, slices, memory MiB, OFA count, placements)
H200: dict[int, tuple[int, str, int, int, int, list[tuple[int, int]]]] = {
    0: (19, "MIG 1g.18gb", 1, 16384, 0, [(i, 1) for i in range(7)]),
    1: (14, "MIG 2g.35gb", 2, 33280, 0, [(0, 2), (2, 2), (4, 2)]),
    2: (9, "MIG 3g.71gb", 3, 71424, 0, [(0, 4), (4, 4)]),
    3: (5, "MIG 4g.71gb", 4, 71424, 0, [(0, 4)]),
    4: (0, "MIG 7g.141gb", 7, 143360, 1, [(0, 8)]),
    7: (20, "MIG 1g.18gb+me", 1, 16384, 1, [(i, 1) for i in range(7)]),
    9: (15, "MIG 1g.35gb", 1, 33280, 0, [(0, 2), (2, 2), (4, 2), (6, 2)]),
}


#: profile id -> (SMs, copy engines, decoders, encoders, JPEG): NVIDIA's MIG user guide's
#: Hopper figures (not part of the H200 recording above).
ENGINES: dict[int, tuple[int, int, int, int, int]] = {
    19: (16, 1, 1, 0, 1),
    20: (16, 1, 1, 0, 1),
    15: (26, 1, 1, 0, 1),
    14: (32, 2, 2, 0, 2),
    9: (60, 3, 3, 0, 3),
    5: (64, 4, 4, 0, 4),
    0: (132, 8, 7, 0, 7),
}


class Placement(ctypes.Structure):
    _fields_ = [("start", ctypes.c_uint), ("size", ctypes.c_uint)]


def add_mig(mod: types.ModuleType) -> None:
    """Give ``mod`` (from ``make_module``) the calls that make and destroy MIG devices."""
    mod.NVML_ERROR_IN_USE = 19  # type: ignore[attr-defined]
    mod.NVML_ERROR_INSUFFICIENT_RESOURCES = 23  # type: ignore[attr-defined]
    mod.NVML_GPU_INSTANCE_PROFILE_COUNT = 0x12  # type: ignore[attr-defined]
    mod.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED = 0  # type: ignore[attr-defined]
    mod.c_nvmlGpuInstancePlacement_t = Placement  # type: ignore[attr-defined]
    mod.c_nvmlGpuInstance_t = ctypes.c_uint64  # type: ignore[attr-defined]
    mod.c_nvmlComputeInstance_t = ctypes.c_uint64  # type: ignore[attr-defined]
    by_id = {v[0]: v for v in H200.values()}
    gis: dict[int, dict[str, Any]] = {}  # handle -> {gpu, id, profile, start, size, cis}
    cis: dict[int, dict[str, Any]] = {}  # handle -> {gi handle, id, mig uuid}
    handles = itertools.count(1000)
    mod.instances = gis  # type: ignore[attr-defined]

    def error(code: int) -> NVMLError:
        return NVMLError(code)

    def fill(arr: Any, count: Any, values: list[Any]) -> None:
        if type(count).__name__ != "CArgObject":
            raise TypeError("count must be passed by reference")
        for i, v in enumerate(values):
            arr[i] = v
        count._obj.value = len(values)

    def setfn(f: Any) -> Any:
        setattr(mod, f.__name__, f)
        return f

    @setfn
    def nvmlDeviceGetGpuInstanceProfileInfo(h: Handle, p: int) -> Any:
        mod.gpus[h.uuid]  # type: ignore[attr-defined]
        if p == 17:
            raise error(2)
        if p not in H200:
            raise error(3)
        pid, name, slices, mem, ofa, _ = H200[p]
        sms, copy, dec, enc, jpeg = ENGINES[pid]
        return _Obj(
            id=pid,
            name=name.encode(),
            sliceCount=slices,
            memorySizeMB=mem,
            ofaCount=ofa,
            multiprocessorCount=sms,
            copyEngineCount=copy,
            decoderCount=dec,
            encoderCount=enc,
            jpegCount=jpeg,
        )

    @setfn
    def nvmlDeviceGetGpuInstancePossiblePlacements(
        h: Handle, pid: int, arr: Any, count: Any
    ) -> int:
        pls = []
        for start, size in by_id[pid][5]:
            pls.append(Placement(start, size))
        fill(arr, count, pls)
        return 0

    @setfn
    def nvmlDeviceCreateGpuInstanceWithPlacement(h: Handle, pid: int, placement: Any) -> int:
        if type(placement).__name__ != "CArgObject":
            raise TypeError("the placement is a pointer: passed by value, NVML crashes")
        g = mod.gpus[h.uuid]  # type: ignore[attr-defined]
        if g.mig_mode[0] != 1:
            raise error(3)
        pl = placement._obj
        if (pl.start, pl.size) not in by_id[pid][5]:
            raise error(2)
        mine = [gi for gi in gis.values() if gi["gpu"] == h.uuid]
        if any(
            set(range(pl.start, pl.start + pl.size))
            & set(range(gi["start"], gi["start"] + gi["size"]))
            for gi in mine
        ):
            raise error(23)
        gi_id = next(i for i in range(1, 15) if i not in {gi["id"] for gi in mine})
        handle = next(handles)
        gis[handle] = {
            "gpu": h.uuid,
            "id": gi_id,
            "profile": pid,
            "start": pl.start,
            "size": pl.size,
            "cis": [],
        }
        return handle

    @setfn
    def nvmlGpuInstanceGetInfo(gi: int) -> Any:
        i = gis[int(gi)]
        return _Obj(
            id=i["id"], profileId=i["profile"], placement=_Obj(start=i["start"], size=i["size"])
        )

    @setfn
    def nvmlGpuInstanceGetComputeInstanceProfileInfo(gi: int, profile: int, engine: int) -> Any:
        return _Obj(id=profile)

    @setfn
    def nvmlGpuInstanceCreateComputeInstance(gi: int, ci_profile: int) -> int:
        i = gis[int(gi)]
        handle = next(handles)
        mig = MigSpec(
            f"MIG-{uuidlib.uuid4()}",
            i["id"],
            len(i["cis"]),
            by_id[i["profile"]][2],
            by_id[i["profile"]][2],
            by_id[i["profile"]][3],
        )
        g = mod.gpus[i["gpu"]]  # type: ignore[attr-defined]
        g.mig.append(mig)
        mod.mig_by_uuid[mig.uuid] = (g, mig)  # type: ignore[attr-defined]
        cis[handle] = {"gi": int(gi), "id": mig.ci, "uuid": mig.uuid, "profile": ci_profile}
        i["cis"].append(handle)
        return handle

    @setfn
    def nvmlComputeInstanceGetInfo(ci: int) -> Any:
        return _Obj(id=cis[int(ci)]["id"])

    @setfn
    def nvmlDeviceGetGpuInstances(h: Handle, pid: int, arr: Any, count: Any) -> int:
        fill(
            arr, count, [k for k, gi in gis.items() if gi["gpu"] == h.uuid and gi["profile"] == pid]
        )
        return 0

    @setfn
    def nvmlDeviceGetGpuInstanceById(h: Handle, gi_id: int) -> int:
        for k, gi in gis.items():
            if gi["gpu"] == h.uuid and gi["id"] == gi_id:
                return k
        raise error(6)

    @setfn
    def nvmlGpuInstanceGetComputeInstances(gi: int, ci_profile: int, arr: Any, count: Any) -> int:
        fill(arr, count, [c for c in gis[int(gi)]["cis"] if cis[c]["profile"] == ci_profile])
        return 0

    @setfn
    def nvmlComputeInstanceDestroy(ci: int) -> int:
        c = cis.pop(int(ci))
        gis[c["gi"]]["cis"].remove(int(ci))
        g = mod.gpus[gis[c["gi"]]["gpu"]]  # type: ignore[attr-defined]
        g.mig[:] = [m for m in g.mig if m.uuid != c["uuid"]]
        mod.mig_by_uuid.pop(c["uuid"])  # type: ignore[attr-defined]
        return 0

    @setfn
    def nvmlGpuInstanceDestroy(gi: int) -> int:
        if gis[int(gi)]["cis"]:
            raise error(19)
        del gis[int(gi)]
        return 0

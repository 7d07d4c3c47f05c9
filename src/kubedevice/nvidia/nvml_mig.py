"""MIG devices made and destroyed through nvidia-ml-py: the real backend's MigPartitioning.

A mixin of :class:`~kubedevice.nvidia.nvml_real.RealNvml` (kept apart: one job). The
calls are NVML's: ``nvmlDeviceGetGpuInstanceProfileInfo`` for every
``NVML_GPU_INSTANCE_PROFILE_*`` (NotSupported / InvalidArgument: the GPU has no such
profile), ``nvmlDeviceGetGpuInstancePossiblePlacements``,
``nvmlDeviceCreateGpuInstanceWithPlacement`` then ``nvmlGpuInstanceCreateComputeInstance``
with the compute profile of the same slice count (the GPU instance is destroyed again
when that fails), ``nvmlDeviceGetGpuInstances`` / ``nvmlGpuInstanceGetInfo`` to list, and
``nvmlComputeInstanceDestroy`` + ``nvmlGpuInstanceDestroy`` to destroy. Errors keep NVML's
names (``InsufficientResources``, ``InUse``, ``NotFound`` ...).

Checked on a real H200 (driver 580.159.04, MIG mode off, so nothing made): the profile and
placement queries answer as the fake's table says, and the create call answers
NotSupported. Making and destroying instances has run only against a stand-in ``pynvml``.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from kubedevice.errors import NvmlError
from kubedevice.nvidia.backend import (
    GpuInstance,
    GpuInstanceProfile,
    MigDeviceInfo,
    MigEngines,
    MigPlacement,
)

__all__ = ["RealMigPartitioning", "engines_of"]

_MAX_PLACEMENTS: Final = 32
_MAX_INSTANCES: Final = 16
#: Compute slices -> NVML_COMPUTE_INSTANCE_PROFILE_* taking a whole GPU instance of it.
_COMPUTE_PROFILE: Final = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4, 8: 5, 6: 6}
_ABSENT: Final = frozenset({"NotSupported", "InvalidArgument", "FunctionNotFound"})


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace").rstrip("\x00")
    return str(value)


def engines_of(info: Any) -> MigEngines:
    """The engine and multiprocessor counts of an ``nvmlGpuInstanceProfileInfo_t``."""
    return MigEngines(
        multiprocessors=int(info.multiprocessorCount),
        copy_engines=int(info.copyEngineCount),
        decoders=int(info.decoderCount),
        encoders=int(info.encoderCount),
        jpeg_engines=int(info.jpegCount),
        ofa_engines=int(info.ofaCount),
    )


class RealMigPartitioning:
    """:class:`~kubedevice.nvidia.backend.MigPartitioning` on a RealNvml (a mixin)."""

    if TYPE_CHECKING:

        def _require(self) -> Any: ...
        def _handle(self, uuid: str) -> Any: ...
        def _call(
            self,
            fn: Callable[..., Any],
            *args: Any,
            uuid: str | None = None,
            optional: bool = False,
        ) -> Any: ...
        def mig_devices(self, gpu_uuid: str) -> list[MigDeviceInfo]: ...

    def gpu_instance_profiles(self, gpu_uuid: str) -> list[GpuInstanceProfile]:
        """Every GPU instance profile NVML knows on this GPU, with its placements."""
        nv = self._require()
        h = self._handle(gpu_uuid)
        out: list[GpuInstanceProfile] = []
        for enum_value in range(int(getattr(nv, "NVML_GPU_INSTANCE_PROFILE_COUNT", 0x12))):
            try:
                info = self._call(
                    nv.nvmlDeviceGetGpuInstanceProfileInfo, h, enum_value, uuid=gpu_uuid
                )
            except NvmlError as exc:
                if exc.code in _ABSENT:
                    continue
                raise
            slices = int(info.sliceCount)
            name = _text(getattr(info, "name", b"")).removeprefix("MIG ").strip()
            out.append(
                GpuInstanceProfile(
                    id=int(info.id),
                    name=name or f"{slices}g.{int(info.memorySizeMB) // 1024}gb",
                    slices=slices,
                    memory_mib=int(info.memorySizeMB),
                    placements=self._placements(nv, h, gpu_uuid, int(info.id)),
                    media_extensions=int(getattr(info, "ofaCount", 0)) > 0,
                    compute_profile=_COMPUTE_PROFILE.get(slices, 0),
                    engines=engines_of(info),
                )
            )
        return out

    def _placements(
        self, nv: Any, h: Any, gpu_uuid: str, profile_id: int
    ) -> tuple[MigPlacement, ...]:
        array = (nv.c_nvmlGpuInstancePlacement_t * _MAX_PLACEMENTS)()
        count = ctypes.c_uint(_MAX_PLACEMENTS)
        self._call(
            nv.nvmlDeviceGetGpuInstancePossiblePlacements,
            h,
            profile_id,
            array,
            ctypes.byref(count),
            uuid=gpu_uuid,
        )
        return tuple(MigPlacement(int(p.start), int(p.size)) for p in array[: count.value])

    def _instance_handles(self, nv: Any, h: Any, gpu_uuid: str, profile_id: int) -> list[Any]:
        array = (nv.c_nvmlGpuInstance_t * _MAX_INSTANCES)()
        count = ctypes.c_uint(_MAX_INSTANCES)
        self._call(
            nv.nvmlDeviceGetGpuInstances, h, profile_id, array, ctypes.byref(count), uuid=gpu_uuid
        )
        return list(array[: count.value])

    def gpu_instances(self, gpu_uuid: str) -> list[GpuInstance]:
        """The GPU instances on the GPU now, each with its MIG devices."""
        nv = self._require()
        h = self._handle(gpu_uuid)
        mode = self._call(nv.nvmlDeviceGetMigMode, h, uuid=gpu_uuid, optional=True)
        if mode is None or int(mode[0]) != 1:
            return []
        devices = self.mig_devices(gpu_uuid)
        out: list[GpuInstance] = []
        for profile in self.gpu_instance_profiles(gpu_uuid):
            for gi in self._instance_handles(nv, h, gpu_uuid, profile.id):
                info = self._call(nv.nvmlGpuInstanceGetInfo, gi, uuid=gpu_uuid)
                gi_id = int(info.id)
                out.append(
                    GpuInstance(
                        gpu_uuid,
                        gi_id,
                        profile.id,
                        MigPlacement(int(info.placement.start), int(info.placement.size)),
                        tuple(d for d in devices if d.gi_id == gi_id),
                    )
                )
        return sorted(out, key=lambda g: g.gi_id)

    def create_mig_device(
        self, gpu_uuid: str, profile_id: int, placement: MigPlacement
    ) -> MigDeviceInfo:
        """A GPU instance at ``placement`` and one compute instance taking all of it."""
        nv = self._require()
        h = self._handle(gpu_uuid)
        profile = next(
            (p for p in self.gpu_instance_profiles(gpu_uuid) if p.id == profile_id), None
        )
        if profile is None:
            raise NvmlError("NotSupported", f"no GPU instance profile {profile_id}", gpu_uuid)
        where = nv.c_nvmlGpuInstancePlacement_t()
        where.start, where.size = placement.start, placement.size
        # NVML takes the placement by pointer; passed by value, the call crashes the process.
        gi = self._call(
            nv.nvmlDeviceCreateGpuInstanceWithPlacement,
            h,
            profile_id,
            ctypes.byref(where),
            uuid=gpu_uuid,
        )
        try:
            gi_id = int(self._call(nv.nvmlGpuInstanceGetInfo, gi, uuid=gpu_uuid).id)
            engine = int(getattr(nv, "NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED", 0))
            ci_profile = self._call(
                nv.nvmlGpuInstanceGetComputeInstanceProfileInfo,
                gi,
                profile.compute_profile,
                engine,
                uuid=gpu_uuid,
            )
            ci = self._call(
                nv.nvmlGpuInstanceCreateComputeInstance, gi, int(ci_profile.id), uuid=gpu_uuid
            )
            ci_id = int(self._call(nv.nvmlComputeInstanceGetInfo, ci, uuid=gpu_uuid).id)
        except NvmlError:
            self._call(nv.nvmlGpuInstanceDestroy, gi, uuid=gpu_uuid)
            raise
        for device in self.mig_devices(gpu_uuid):
            if device.gi_id == gi_id and device.ci_id == ci_id:
                return device
        raise NvmlError(
            "Unknown", f"GPU instance {gi_id} made but its MIG device not listed", gpu_uuid
        )

    def destroy_mig_device(self, gpu_uuid: str, gi_id: int) -> None:
        """Destroy every compute instance of GPU instance ``gi_id``, then the instance."""
        nv = self._require()
        h = self._handle(gpu_uuid)
        gi = self._call(nv.nvmlDeviceGetGpuInstanceById, h, gi_id, uuid=gpu_uuid)
        engine = int(getattr(nv, "NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED", 0))
        for enum_value in sorted(set(_COMPUTE_PROFILE.values())):
            try:
                ci_profile = self._call(
                    nv.nvmlGpuInstanceGetComputeInstanceProfileInfo,
                    gi,
                    enum_value,
                    engine,
                    uuid=gpu_uuid,
                )
            except NvmlError as exc:
                if exc.code in _ABSENT:
                    continue
                raise
            array = (nv.c_nvmlComputeInstance_t * _MAX_INSTANCES)()
            count = ctypes.c_uint(_MAX_INSTANCES)
            self._call(
                nv.nvmlGpuInstanceGetComputeInstances,
                gi,
                int(ci_profile.id),
                array,
                ctypes.byref(count),
                uuid=gpu_uuid,
            )
            for ci in array[: count.value]:
                self._call(nv.nvmlComputeInstanceDestroy, ci, uuid=gpu_uuid)
        self._call(nv.nvmlGpuInstanceDestroy, gi, uuid=gpu_uuid)

"""MIG devices made and destroyed on a fake GPU, with NVML's placement rules.

The GPU instance profiles of an H100 80GB and an H200 141GB: NVIDIA's profile list (MIG
user guide: 1g, 1g+me, 1g with twice the memory, 2g, 3g, 4g, 7g), NVML's profile IDs and
the placements ``nvmlDeviceGetGpuInstancePossiblePlacements`` reports for each (in memory
slices, 8 per GPU; profile IDs as ``nvidia-smi mig -lgip`` shows them, the IDs NVML's create
call takes). The H200's memory sizes, IDs and placements are what NVML answered on a real
H200 (driver 580.159.04); the H100's IDs and placements are NVIDIA's, its memory sizes
plausible, not measured.

Rules kept, as NVML keeps them: a placement must be one of the profile's; a GPU instance
must not share a memory slice with another (``InsufficientResources``); one GPU has one
set of media extensions (a ``+me`` instance and a 7g both need it); MIG mode must be on
(``NotSupported``). GPU instance IDs are the lowest free from 1; each GPU instance holds
one compute instance (ID 0) taking all of it; its ``nvidia-caps`` minors follow the
driver's numbering (the ones the ``mig-mixed`` machine lists).

What exists is kept in a JSON file when one is given (``KUBEDEVICE_FAKE_NVML_STATE``), as
instances on a real GPU outlive the process that made them: a restarted driver finds them;
so are the GPUs' time-slice levels. A reboot destroys both: :meth:`FakePartitions.reboot`
(or removing the file while no process uses it).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import stat
import threading
import uuid as uuidlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from kubedevice.errors import NvmlError
from kubedevice.nvidia.backend import (
    GpuInfo,
    GpuInstance,
    GpuInstanceProfile,
    MigDeviceInfo,
    MigPlacement,
)
from kubedevice.nvidia.fake.migprofiles import engines

__all__ = ["CRASH_ENV", "HOLD_ENV", "STATE_ENV", "FakePartitions", "cap_minors", "profiles_for"]

log = logging.getLogger(__name__)

#: A file the fake keeps its GPU instances in (so they outlive the process).
STATE_ENV: Final = "KUBEDEVICE_FAKE_NVML_STATE"
#: A path: while a file is there, the next GPU instance made ends the process (status 137,
#: as SIGKILL) right after it is made, and the file is removed: a crash between making an
#: instance and recording it, for tests.
CRASH_ENV: Final = "KUBEDEVICE_FAKE_NVML_CRASH_AFTER_CREATE"
#: A path: while a named pipe (FIFO) is there, the next GPU instance made waits until
#: something is written to it (then it is removed): an NVML call slower than the caller's
#: deadline, for tests.
HOLD_ENV: Final = "KUBEDEVICE_FAKE_NVML_HOLD_CREATE"
_MIB: Final = 1024 * 1024


def _p(*pairs: tuple[int, int]) -> tuple[MigPlacement, ...]:
    return tuple(MigPlacement(s, n) for s, n in pairs)


_ONE = _p(*((i, 1) for i in range(7)))
_ONE_2X = _p((0, 2), (2, 2), (4, 2), (6, 2))
_TWO = _p((0, 2), (2, 2), (4, 2))
_THREE = _p((0, 4), (4, 4))
_FOUR = _p(
    (0, 4),
)
_SEVEN = _p(
    (0, 8),
)


def _profile(
    pid: int,
    name: str,
    slices: int,
    memory_mib: int,
    placements: tuple[MigPlacement, ...],
    media: bool = False,
    *,
    compute_profile: int,
) -> GpuInstanceProfile:
    size = placements[0].size
    return GpuInstanceProfile(
        pid,
        name,
        slices,
        memory_mib,
        placements,
        media,
        compute_profile=compute_profile,
        engines=engines(slices, size, media=media),
    )


def _table(
    one: int, two: int, four: int, full: int, gb: tuple[int, int, int, int]
) -> tuple[GpuInstanceProfile, ...]:
    g1, g2, g4, g7 = gb
    return (
        _profile(19, f"1g.{g1}gb", 1, one, _ONE, compute_profile=0),
        _profile(20, f"1g.{g1}gb+me", 1, one, _ONE, True, compute_profile=0),
        _profile(15, f"1g.{g2}gb", 1, two, _ONE_2X, compute_profile=0),
        _profile(14, f"2g.{g2}gb", 2, two, _TWO, compute_profile=1),
        _profile(9, f"3g.{g4}gb", 3, four, _THREE, compute_profile=2),
        _profile(5, f"4g.{g4}gb", 4, four, _FOUR, compute_profile=3),
        _profile(0, f"7g.{g7}gb", 7, full, _SEVEN, True, compute_profile=4),
    )


_H100_80GB: Final = _table(9984, 20096, 40448, 80896, (10, 20, 40, 80))
#: Measured: NVML's profile info on an H200 (driver 580.159.04).
_H200: Final = _table(16384, 33280, 71424, 143360, (18, 35, 71, 141))


def profiles_for(gpu: GpuInfo) -> tuple[GpuInstanceProfile, ...]:
    """The GPU instance profiles of a fake GPU (none but for an H100 80GB or an H200)."""
    if not gpu.mig_capable:
        return ()
    if "H200" in gpu.name:
        return _H200
    if "H100" in gpu.name and "80GB" in gpu.name:
        return _H100_80GB
    return ()


def cap_minors(gpu_minor: int, gi_id: int, ci_id: int) -> tuple[int, int]:
    """The ``nvidia-cap`` minors of a GPU instance and its compute instance."""
    gi = gpu_minor * 135 + 3 + gi_id * 9
    return gi, gi + 1 + ci_id


def _crash_if_asked() -> None:
    marker = os.environ.get(CRASH_ENV)
    if not marker:
        return
    try:
        os.unlink(marker)
    except OSError:
        return
    log.warning("fake NVML: %s was there: the process ends now (as if killed)", marker)
    logging.shutdown()
    os._exit(137)


def _hold_if_asked() -> None:
    path = os.environ.get(HOLD_ENV)
    if not path:
        return
    try:
        if not stat.S_ISFIFO(os.stat(path).st_mode):
            return
    except OSError:
        return
    log.warning("fake NVML: creating a GPU instance: held until %s is written", path)
    with open(path, "rb") as fifo:  # blocks until a writer opens it
        fifo.read(1)
    with contextlib.suppress(OSError):
        os.unlink(path)
    log.warning("fake NVML: %s written: the GPU instance is made now", path)


class FakePartitions:
    """The GPU instances of a fake machine's GPUs (thread-safe; persisted if ``path``)."""

    def __init__(self, gpus: Mapping[str, GpuInfo], path: Path | None = None) -> None:
        self._gpus = dict(gpus)
        self._path = path
        self._lock = threading.Lock()
        self._made: dict[str, dict[int, GpuInstance]] = {u: {} for u in gpus}
        self._parent: dict[str, str] = {}
        self._time_slices: dict[str, int] = {}
        if path is not None:
            self._load(path)

    # ---- queries

    def instances(self, gpu_uuid: str) -> list[GpuInstance]:
        with self._lock:
            return sorted(self._made[gpu_uuid].values(), key=lambda g: g.gi_id)

    def devices(self, gpu_uuid: str) -> list[MigDeviceInfo]:
        return [d for gi in self.instances(gpu_uuid) for d in gi.devices]

    def parent_of(self, mig_uuid: str) -> str | None:
        with self._lock:
            return self._parent.get(mig_uuid)

    def device(self, mig_uuid: str) -> MigDeviceInfo | None:
        parent = self.parent_of(mig_uuid)
        if parent is None:
            return None
        return next((d for d in self.devices(parent) if d.uuid == mig_uuid), None)

    def time_slice(self, gpu_uuid: str) -> int:
        """A GPU's time-slice level (0, Default, until set)."""
        with self._lock:
            return self._time_slices.get(gpu_uuid, 0)

    # ---- changes

    def set_time_slice(self, gpu_uuid: str, level: int) -> None:
        with self._lock:
            self._time_slices[gpu_uuid] = level
            self._save()

    def reboot(self) -> None:
        """What a reboot does: every GPU instance gone, every time-slice level Default."""
        with self._lock:
            self._made = {u: {} for u in self._gpus}
            self._parent = {}
            self._time_slices = {}
            self._save()
        log.info("fake NVML: rebooted (no GPU instance, time slices Default)")

    def create(
        self, gpu_uuid: str, profile_id: int, placement: MigPlacement, static_count: int
    ) -> MigDeviceInfo:
        gpu = self._gpus[gpu_uuid]
        if not gpu.mig_enabled:
            raise NvmlError("NotSupported", "MIG mode is not enabled", gpu_uuid)
        _hold_if_asked()
        profiles = {p.id: p for p in profiles_for(gpu)}
        profile = profiles.get(profile_id)
        if profile is None:
            raise NvmlError("NotSupported", f"no GPU instance profile {profile_id}", gpu_uuid)
        if placement not in profile.placements:
            raise NvmlError(
                "InvalidArgument",
                f"{profile.name} cannot be placed at {{{placement.start},{placement.size}}}",
                gpu_uuid,
            )
        with self._lock:
            made = self._made[gpu_uuid]
            if static_count:
                raise NvmlError(
                    "InsufficientResources", "the GPU has MIG devices of its file", gpu_uuid
                )
            wanted = set(placement.memory_slices)
            for gi in made.values():
                taken = profiles[gi.profile_id]
                if wanted & set(gi.placement.memory_slices) or (
                    profile.media_extensions and taken.media_extensions
                ):
                    raise NvmlError(
                        "InsufficientResources",
                        f"{profile.name} at {{{placement.start},{placement.size}}} overlaps "
                        f"GPU instance {gi.gi_id} ({taken.name} at "
                        f"{{{gi.placement.start},{gi.placement.size}}})",
                        gpu_uuid,
                    )
            gi_id = next(i for i in range(1, 64) if i not in made)
            mig = MigDeviceInfo(
                parent_uuid=gpu_uuid,
                parent_index=gpu.index,
                uuid=f"MIG-{uuidlib.uuid4()}",
                index=0,
                profile=profile.name,
                gi_id=gi_id,
                ci_id=0,
                memory_total=profile.memory_mib * _MIB,
                cap_minors=cap_minors(gpu.minor, gi_id, 0),
            )
            made[gi_id] = GpuInstance(gpu_uuid, gi_id, profile_id, placement, (mig,))
            self._reindex(gpu_uuid)
            self._parent[mig.uuid] = gpu_uuid
            self._save()
        log.info(
            "fake NVML: GPU instance %d (%s at {%d,%d}) created on %s",
            gi_id,
            profile.name,
            placement.start,
            placement.size,
            gpu_uuid,
        )
        _crash_if_asked()
        return next(d for d in self.devices(gpu_uuid) if d.uuid == mig.uuid)

    def destroy(self, gpu_uuid: str, gi_id: int) -> None:
        with self._lock:
            gi = self._made[gpu_uuid].pop(gi_id, None)
            if gi is None:
                raise NvmlError("NotFound", f"no GPU instance {gi_id}", gpu_uuid)
            for d in gi.devices:
                self._parent.pop(d.uuid, None)
            self._reindex(gpu_uuid)
            self._save()
        log.info("fake NVML: GPU instance %d destroyed on %s", gi_id, gpu_uuid)

    def _reindex(self, gpu_uuid: str) -> None:
        """Number the GPU's MIG devices in GPU instance order (as NVML's index does)."""
        made = self._made[gpu_uuid]
        for n, gi_id in enumerate(sorted(made)):
            gi = made[gi_id]
            devices = tuple(
                MigDeviceInfo(
                    d.parent_uuid,
                    d.parent_index,
                    d.uuid,
                    n,
                    d.profile,
                    d.gi_id,
                    d.ci_id,
                    d.memory_total,
                    d.cap_minors,
                )
                for d in gi.devices
            )
            made[gi_id] = GpuInstance(gi.gpu_uuid, gi.gi_id, gi.profile_id, gi.placement, devices)

    # ---- the state file

    def _save(self) -> None:
        if self._path is None:
            return
        doc = {
            "instances": [
                {
                    "gpu": g,
                    "gi": gi.gi_id,
                    "profile": gi.profile_id,
                    "placement": [gi.placement.start, gi.placement.size],
                    "uuid": gi.devices[0].uuid,
                    "name": gi.devices[0].profile,
                }
                for g, made in self._made.items()
                for gi in made.values()
            ],
            "timeSlices": dict(sorted(self._time_slices.items())),
        }
        tmp = self._path.with_name(f".{self._path.name}.tmp")
        tmp.write_text(json.dumps(doc, indent=1))
        os.replace(tmp, self._path)

    def _load(self, path: Path) -> None:
        try:
            doc: Any = json.loads(path.read_text())
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            aside = path.with_name(f"{path.name}.corrupt")
            with contextlib.suppress(OSError):
                os.replace(path, aside)
            log.warning("fake NVML: state file %s unreadable (%s); set aside", path, exc)
            return
        slices = doc.get("timeSlices") if isinstance(doc, dict) else None
        for gpu_uuid, level in (slices or {}).items() if isinstance(slices, dict) else ():
            if gpu_uuid in self._gpus and level in (0, 1, 2, 3):
                self._time_slices[gpu_uuid] = level
        for item in doc.get("instances", []) if isinstance(doc, dict) else []:
            try:
                gpu = self._gpus[item["gpu"]]
                gi_id, start_size = int(item["gi"]), item["placement"]
                profile = {p.id: p for p in profiles_for(gpu)}[int(item["profile"])]
                mig = MigDeviceInfo(
                    gpu.uuid,
                    gpu.index,
                    str(item["uuid"]),
                    0,
                    profile.name,
                    gi_id,
                    0,
                    profile.memory_mib * _MIB,
                    cap_minors(gpu.minor, gi_id, 0),
                )
                placement = MigPlacement(int(start_size[0]), int(start_size[1]))
            except (KeyError, TypeError, ValueError, IndexError) as exc:
                log.warning("fake NVML: state file %s: entry %r skipped (%s)", path, item, exc)
                continue
            self._made[gpu.uuid][gi_id] = GpuInstance(
                gpu.uuid, gi_id, profile.id, placement, (mig,)
            )
            self._parent[mig.uuid] = gpu.uuid
        for g in self._made:
            self._reindex(g)

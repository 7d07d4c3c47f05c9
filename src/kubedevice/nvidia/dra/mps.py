"""MPS behind the GPU DRA driver's memory shares (``dra.mps``): enforced shares.

With ``dra.mps`` every share of a whole GPU (:mod:`kubedevice.nvidia.dra.shares`) is
prepared as a client of that GPU's MPS control daemon (:class:`~kubedevice.nvidia.mps.MpsDaemons`,
started at the GPU's first prepared share, stopped at its last unprepare). Each share's
container gets:

* the daemon's pipe directory mounted at ``/run/nvidia-mps`` and
  ``CUDA_MPS_PIPE_DIRECTORY=/run/nvidia-mps``;
* ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=<MiB>M``: the claim's memory on that GPU as the
  scheduler counted it (after the request policy's rounding), the GPU being device ``0``
  to the daemon's clients;
* ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=<n>`` where the claim asked for ``compute`` (a
  consumable capacity of 100, percent of the SMs; a share that names none consumes 0 and
  has no SM limit);
* ``/dev/shm`` shared with the daemon (where the MPS server and its clients meet).

What a claim holds is its devices' ``data`` (``"mps": true``), so a restarted driver adopts
the daemons its claims hold and stops the others.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from kubedevice.dra import ClaimError, Mount, RequestPolicy
from kubedevice.dra.model.capacity import quantity_value
from kubedevice.dra.model.types import AllocatedDevice, Claim, PreparedClaim
from kubedevice.errors import ConfigError
from kubedevice.nvidia.backend import MpsControlProgram, NvmlBackend
from kubedevice.nvidia.dra.shares import share_bytes
from kubedevice.nvidia.dra.timeslice import find_tool
from kubedevice.nvidia.mps import CONTAINER_PIPE_DIR, MpsDaemons, MpsError, MpsPaths, client_env

__all__ = [
    "COMPUTE",
    "COMPUTE_POLICY",
    "control_command",
    "holders",
    "share_compute",
    "share_edits",
    "shm_source",
]

#: The capacity a share asks SMs with (percent).
COMPUTE: Final = "compute"
#: ``compute``'s policy: whole percents; a share naming none takes 0 (no SM limit).
COMPUTE_POLICY: Final = RequestPolicy(default=0, min=0, max=100, step=1)
_TOOL: Final = "nvidia-cuda-mps-control"


def control_command(backend: NvmlBackend, driver_root: str) -> list[str]:
    """The MPS control program: the backend's own (the fake), else the driver root's
    ``nvidia-cuda-mps-control`` (run under ``chroot`` when the root is not ``/``, so it
    finds the driver's libraries).

    Raises:
        ConfigError: No control program in the driver root.
    """
    if isinstance(backend, MpsControlProgram):
        return backend.mps_control_command()
    path = find_tool(driver_root, _TOOL)
    if path is not None:
        if os.path.abspath(driver_root) == "/":
            return [path]
        return ["chroot", driver_root, "/" + os.path.relpath(path, driver_root)]
    raise ConfigError(
        f"dra.mps: no {_TOOL} under {driver_root} (usr/bin, usr/local/bin, bin); "
        "the driver's MPS control program is needed to run MPS"
    )


def shm_source(root: Path) -> str:
    """The host directory client containers get as ``/dev/shm``: the one the daemon has.

    ``<root>/shm`` when it is this process's ``/dev/shm`` (the chart mounts it there), else
    ``/dev/shm`` (the driver runs on the host).
    """
    shm = root / "shm"
    try:
        if os.path.samefile(shm, "/dev/shm"):
            return str(shm)
    except OSError:
        pass
    return "/dev/shm"


def share_compute(allocated: AllocatedDevice) -> int:
    """The percent of SMs a share consumed (0: none asked)."""
    value = allocated.consumed_capacity.get(COMPUTE)
    if not value:
        return 0
    try:
        size = quantity_value(value)
    except ConfigError:
        return 0
    return min(100, -(-size.numerator // size.denominator))


def share_edits(
    paths: MpsPaths, memory: int, compute: int, shm: str
) -> tuple[dict[str, str], list[Mount]]:
    """The env and mounts of one share's containers (the claim's totals on its GPU)."""
    env = client_env(paths, memory, compute or None)
    mounts = [
        Mount(container_path=CONTAINER_PIPE_DIR, host_path=str(paths.pipe), read_only=False),
        Mount(container_path="/dev/shm", host_path=shm, read_only=False),
    ]
    return env, mounts


def plan_gpu(shares: Sequence[tuple[AllocatedDevice, str]]) -> str | None:
    """The one GPU of a claim's MPS shares (``None``: the claim has none).

    Raises:
        ClaimError: Its shares are of two GPUs (a process talks to one control daemon).
    """
    gpus = sorted({uuid for _, uuid in shares})
    if len(gpus) > 1:
        raise ClaimError(
            f"MPS: the claim's shares are of {len(gpus)} GPUs ({', '.join(gpus)}); a process "
            "is a client of one GPU's MPS daemon: ask for shares of one GPU per claim"
        )
    return gpus[0] if gpus else None


async def hold(daemons: MpsDaemons, claim: Claim, gpus: Sequence[str | None]) -> str | None:
    """Start (or join) the daemon of the GPU ``claim`` has shares of; that GPU's UUID.

    ``gpus``: each device's whole GPU (``None`` for a MIG device: never an MPS share).

    Raises:
        ClaimError: Shares of two GPUs, or the daemon cannot start.
    """
    shares = [
        (allocated, uuid)
        for allocated, uuid in zip(claim.devices, gpus, strict=True)
        if uuid is not None and share_bytes(allocated) is not None
    ]
    gpu = plan_gpu(shares)
    if gpu is not None:
        try:
            await daemons.hold(gpu, claim.ref.uid)
        except MpsError as exc:
            raise ClaimError(str(exc)) from None
    return gpu


def claim_edits(
    daemons: MpsDaemons, claim: Claim, gpus: Sequence[str], env: Mapping[str, str]
) -> tuple[dict[str, str], list[Mount]]:
    """A share's env (``env`` and the client's) and mounts: the claim's totals on its GPU.

    ``gpus``: each device's GPU UUID; the claim's shares are all of one (:func:`hold`).
    """
    gpu = next(g for a, g in zip(claim.devices, gpus, strict=True) if share_bytes(a))
    mine = [a for a, g in zip(claim.devices, gpus, strict=True) if g == gpu]
    memory = sum(share_bytes(a) or 0 for a in mine)
    compute = min(100, sum(share_compute(a) for a in mine))
    more, mounts = share_edits(daemons.paths(gpu), memory, compute, shm_source(daemons.root))
    return {**env, **more}, mounts


def holders(claims: Sequence[PreparedClaim]) -> dict[str, set[str]]:
    """GPU UUID -> the claims (UIDs) whose prepared shares hold its daemon."""
    out: dict[str, set[str]] = {}
    for claim in claims:
        for record in claim.data:
            if _is_mps(record):
                out.setdefault(str(record["gpu"]), set()).add(claim.ref.uid)
    return out


def held_gpus(claim: PreparedClaim) -> list[str]:
    """The GPUs ``claim``'s recorded shares hold a daemon of."""
    return sorted({str(r["gpu"]) for r in claim.data if _is_mps(r)})


def _is_mps(record: Mapping[str, Any]) -> bool:
    return record.get("mps") is True and isinstance(record.get("gpu"), str)

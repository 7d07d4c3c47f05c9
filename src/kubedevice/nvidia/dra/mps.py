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

from collections.abc import Mapping, Sequence
from typing import Any, Final

from kubedevice.dra import ClaimError, Mount, RequestPolicy
from kubedevice.dra.model.capacity import quantity_value
from kubedevice.dra.model.types import AllocatedDevice, Claim, PreparedClaim
from kubedevice.errors import ConfigError
from kubedevice.nvidia.dra.shares import share_bytes
from kubedevice.nvidia.mps import MpsDaemons, MpsError
from kubedevice.nvidia.mpsclient import MpsPaths, client_env, client_mounts, shm_source

__all__ = [
    "COMPUTE",
    "COMPUTE_POLICY",
    "holders",
    "share_compute",
    "share_edits",
]

#: The capacity a share asks SMs with (percent).
COMPUTE: Final = "compute"
#: ``compute``'s policy: whole percents; a share naming none takes 0 (no SM limit).
COMPUTE_POLICY: Final = RequestPolicy(default=0, min=0, max=100, step=1)


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
        Mount(container_path=inside, host_path=host, read_only=False)
        for inside, host in client_mounts(paths, shm)
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


async def release(daemons: MpsDaemons, claim: PreparedClaim, known: Mapping[str, Any]) -> None:
    """Let go of the daemons ``claim`` holds (those of all its GPUs after a prepare cut
    short, which recorded nothing); ``known``: the published devices by name."""
    gpus = held_gpus(claim)
    if claim.devices and not any(claim.data):
        gpus = sorted({gd.gpu.uuid for *_, n in claim.devices if (gd := known.get(n))})
    for gpu in gpus:
        await daemons.release(gpu, claim.ref.uid)


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

"""What makes a container's processes clients of a GPU's MPS control daemon: its env (the
pipe directory, the pinned memory limit, the thread percentage) and mounts (the pipe
directory, the daemon's ``/dev/shm``), and the limits of a share or of replicas.

Values only; the daemons themselves are :mod:`kubedevice.nvidia.mps`'s.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Final

__all__ = [
    "ACTIVE_THREAD_ENV",
    "CONTAINER_PIPE_DIR",
    "PINNED_MEMORY_ENV",
    "PIPE_ENV",
    "MpsPaths",
    "client_env",
    "client_mounts",
    "pinned_limit",
    "replica_limits",
    "shm_source",
]

PIPE_ENV: Final = "CUDA_MPS_PIPE_DIRECTORY"
PINNED_MEMORY_ENV: Final = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
ACTIVE_THREAD_ENV: Final = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
#: Where a client container finds the pipe directory (mounted from the host's).
CONTAINER_PIPE_DIR: Final = "/run/nvidia-mps"
_MIB: Final = 1 << 20


@dataclass(frozen=True, slots=True)
class MpsPaths:
    """A GPU's daemon directories on the host."""

    pipe: Path
    log: Path


def pinned_limit(size: int) -> str:
    """``size`` bytes as MPS takes a pinned memory limit: whole MiB (``20480M``).

    Shares are whole MiB (their step is ``Mi`` or ``Gi``), so this is exact for them; a
    size that is not is rounded down (a limit never above what was given).
    """
    return f"{size // _MIB}M"


def client_env(paths: MpsPaths, memory: int | None, percent: int | None) -> dict[str, str]:
    """The env of a container whose processes are clients of ``paths``' daemon.

    The daemon serves one GPU, which its clients see as device ``0``: the memory limit is
    ``0=<MiB>M``; the thread percentage is left out when ``percent`` is ``None`` (all SMs).
    """
    env = {PIPE_ENV: CONTAINER_PIPE_DIR}
    if memory is not None:
        env[PINNED_MEMORY_ENV] = f"0={pinned_limit(memory)}"
    if percent is not None:
        env[ACTIVE_THREAD_ENV] = str(percent)
    return env


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


def client_mounts(paths: MpsPaths, shm: str) -> list[tuple[str, str]]:
    """``(container path, host path)`` of a client's mounts: the pipe dir, ``/dev/shm``."""
    return [(CONTAINER_PIPE_DIR, str(paths.pipe)), ("/dev/shm", shm)]


def replica_limits(memory: int, replicas: int, count: int) -> tuple[int, int]:
    """``(bytes, percent)`` of ``count`` of a GPU's ``replicas`` (``sharing.mps``): each
    replica ``memory / replicas`` (whole MiB, rounded down) and ``100 / replicas`` percent
    (rounded down, at least 1)."""
    one = memory // replicas // _MIB * _MIB
    return one * count, min(100, max(1, 100 // replicas) * count)

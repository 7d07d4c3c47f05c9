"""``sharing.mps`` in the device plugin: each replica of a GPU an MPS client limited to its part.

A GPU of ``nvidia.com/gpu`` shared with ``sharing.mps.resources[].replicas: N`` has an MPS
control daemon (:class:`~kubedevice.nvidia.mps.MpsDaemons`, the DRA driver's supervisor)
for as long as the plugin serves it: started (or adopted, after a restart of the plugin) at
start and at a reload, stopped when a reload stops sharing that GPU, left running when the
plugin stops (its pods still use it; the next start adopts it). Its defaults are one
replica's part (``set_default_device_pinned_mem_limit``,
``set_default_active_thread_percentage``), and a container given ``k`` replicas is told
``k`` parts in its env (``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``,
``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``), with the pipe directory and ``/dev/shm`` mounted.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from kubedevice.nvidia.backend import NvmlBackend
from kubedevice.nvidia.config import GPU_RESOURCE, Config
from kubedevice.nvidia.devices import GpuUnit
from kubedevice.nvidia.mps import (
    MpsDaemons,
    client_env,
    client_mounts,
    control_command,
    pinned_limit,
    replica_limits,
    shm_source,
)

__all__ = ["HOLDER", "ReplicaMps"]

#: Who holds the plugin's daemons.
HOLDER = "device-plugin"


class ReplicaMps:
    """The device plugin's MPS daemons (``sharing.mps``), by GPU UUID."""

    def __init__(self, backend: NvmlBackend) -> None:
        self.backend = backend
        self.daemons: MpsDaemons | None = None
        self._parts: dict[str, tuple[int, int]] = {}  # GPU UUID -> (memory, replicas)

    async def sync(self, config: Config, units: Sequence[GpuUnit]) -> bool:
        """Run a daemon for each whole GPU of ``units`` when ``config`` shares them by MPS;
        stop the others. Whether MPS is in force.

        Raises:
            ConfigError: No MPS control program in the driver root.
            MpsError: A daemon cannot be started.
        """
        replicas = config.sharing.mps.replicas_of(GPU_RESOURCE)
        gpus = [u for u in units if u.uuid == u.parent_uuid and u.resource == GPU_RESOURCE]
        if replicas < 2:
            gpus = []
        if not gpus and self.daemons is None:
            return False
        root = Path(config.flags.mps_root)
        cgroups = config.flags.host_cgroup_root
        cgroup_root = None if cgroups is None else Path(cgroups)
        if (
            self.daemons is None
            or self.daemons.root != root
            or self.daemons.cgroup_root != cgroup_root
        ):
            command = control_command(self.backend, config.flags.nvidia_driver_root)
            if self.daemons is not None:
                await self.daemons.close()
            self.daemons = MpsDaemons(root, command, setup=self._setup, cgroup_root=cgroup_root)
        self._parts = {u.uuid: (u.memory, replicas) for u in gpus}
        await self.daemons.adopt({u.uuid: {HOLDER} for u in gpus})
        return bool(gpus)

    def edits(self, unit: GpuUnit, count: int) -> tuple[dict[str, str], list[tuple[str, str]]]:
        """The env and mounts of a container given ``count`` replicas of ``unit``."""
        assert self.daemons is not None
        memory, replicas = self._parts[unit.uuid]
        size, percent = replica_limits(memory, replicas, count)
        paths = self.daemons.paths(unit.uuid)
        env = client_env(paths, size, percent)
        return env, client_mounts(paths, shm_source(self.daemons.root))

    async def close(self) -> None:
        """Stop watching the daemons (they keep running for the pods using them)."""
        if self.daemons is not None:
            await self.daemons.close()

    def _setup(self, uuid: str) -> list[str]:
        memory, replicas = self._parts[uuid]
        size, percent = replica_limits(memory, replicas, 1)
        return [
            f"set_default_device_pinned_mem_limit 0 {pinned_limit(size)}",
            f"set_default_active_thread_percentage {percent}",
        ]

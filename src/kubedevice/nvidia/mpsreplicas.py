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

A daemon that dies is started again at once by the supervisor, but the processes that were
its clients lost their MPS server: every replica of that GPU is then Unhealthy in
ListAndWatch (the reason logged), so the kubelet tells the pods holding one (their
container's device health) and places no new container on it. It is Healthy again once
the daemon runs and no container that held a replica of that GPU at the death (as the
kubelet's PodResources ``List`` names them: pod, container, device) holds one any more,
as the DRA driver keeps its ``mps-daemon`` taint until every share prepared before the
death is unprepared. PodResources is asked once when the daemon dies and every
:data:`RECHECK_S` seconds until then. While it does not answer (the socket not mounted),
nobody can tell when those clients are gone, so the replicas stay Unhealthy: a period that
ends on its own would look healthy while pods that lost their server may still run.
Restarting the plugin clears it when the new plugin finds the daemon running (it adopts
it), an operator's word that the pods concerned were dealt with; a daemon that ended with
the plugin's container is found dead, which is a death of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Final

from kubedevice.nvidia.backend import NvmlBackend
from kubedevice.nvidia.config import GPU_RESOURCE, Config
from kubedevice.nvidia.devices import GpuUnit, Inventory
from kubedevice.nvidia.mps import MpsDaemons, control_command
from kubedevice.nvidia.mpsclient import (
    client_env,
    client_mounts,
    pinned_limit,
    replica_limits,
    shm_source,
)
from kubedevice.nvidia.podresources import ContainerRef, PodResourcesClient

__all__ = ["HOLDER", "RECHECK_S", "ReplicaMps"]

log = logging.getLogger(__name__)

_ADVICE: Final = (
    "the processes that were its clients lost their MPS server; restart them (the GPU's "
    "replicas are Unhealthy until no container that held one then still does)"
)

#: Who holds the plugin's daemons.
HOLDER = "device-plugin"
#: How often PodResources is asked while a GPU's replicas are Unhealthy for a dead daemon.
RECHECK_S: Final = 5.0

_Held = tuple[str, str, ContainerRef]  # (resource, device id, container)


class ReplicaMps:
    """The device plugin's MPS daemons (``sharing.mps``), by GPU UUID.

    Args:
        backend: The NVML backend (its MPS control program, for the fake).
        on_change: Called on the loop when a GPU's replicas turn Unhealthy or Healthy
            because of its daemon (:meth:`fault`).
    """

    def __init__(self, backend: NvmlBackend, on_change: Callable[[], None] = lambda: None) -> None:
        self.backend = backend
        self.daemons: MpsDaemons | None = None
        self.recheck_s = RECHECK_S
        """Seconds between two PodResources readings while a GPU is Unhealthy."""
        self._on_change = on_change
        self._parts: dict[str, tuple[int, int]] = {}  # GPU UUID -> (memory, replicas)
        self._replicas: dict[str, frozenset[tuple[str, str]]] = {}  # -> (resource, device id)
        self._lost: dict[str, frozenset[_Held]] = {}  # GPU UUID -> held at its daemon's death
        self._known: dict[str, str] = {}  # the faults last seen (logged, told on_change)
        self._client: PodResourcesClient | None = None
        self._socket: Path | None = None  # the client's, as configured
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def sync(self, config: Config, inventory: Inventory) -> bool:
        """Run a daemon for each whole GPU of ``inventory`` when ``config`` shares them by
        MPS; stop the others. Whether MPS is in force.

        Raises:
            ConfigError: No MPS control program in the driver root.
            MpsError: A daemon cannot be started.
        """
        replicas = config.sharing.mps.replicas_of(GPU_RESOURCE)
        units = inventory.units.values()
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
            self.daemons = MpsDaemons(
                root, command, on_change=self._changed, setup=self._setup,
                cgroup_root=cgroup_root, advice=_ADVICE,
            )  # fmt: skip
        await self._sync_client(Path(config.flags.pod_resources_socket) if gpus else None)
        self._parts = {u.uuid: (u.memory, replicas) for u in gpus}
        self._replicas = {
            u.uuid: frozenset(
                (name, e.id)
                for name, entries in inventory.resources.items()
                for e in entries
                if e.unit.uuid == u.uuid
            )
            for u in gpus
        }
        await self.daemons.adopt({u.uuid: {HOLDER} for u in gpus})
        self._changed()  # a reload that stopped sharing a GPU ends its fault
        return bool(gpus)

    def fault(self, uuid: str) -> str | None:
        """Why the GPU's replicas are Unhealthy (its daemon died), ``None`` when they are not."""
        return self.faults().get(uuid)

    def faults(self) -> dict[str, str]:
        """GPU UUID -> why its replicas are Unhealthy, for each GPU whose daemon died."""
        return {} if self.daemons is None else self.daemons.faults()

    def edits(self, unit: GpuUnit, count: int) -> tuple[dict[str, str], list[tuple[str, str]]]:
        """The env and mounts of a container given ``count`` replicas of ``unit``."""
        assert self.daemons is not None
        memory, replicas = self._parts[unit.uuid]
        size, percent = replica_limits(memory, replicas, count)
        paths = self.daemons.paths(unit.uuid)
        env = client_env(paths, size, percent)
        return env, client_mounts(paths, shm_source(self.daemons.root))

    async def check(self) -> dict[str, str]:
        """Ask PodResources now; make Healthy again each GPU whose daemon runs again and
        whose replicas no container that held one at the death still holds. The GPUs
        still Unhealthy (as :meth:`faults`)."""
        faults = self.faults()
        self._lost = {u: held for u, held in self._lost.items() if u in faults}
        client = self._client
        if not faults or client is None or self.daemons is None:
            return faults
        resources = {name for pairs in self._replicas.values() for name, _ in pairs}
        listed = await asyncio.to_thread(client.holders, resources)
        if listed is None:  # logged by the client; nobody can tell: they stay Unhealthy
            return self.faults()
        now = {(res, dev, ref) for (res, dev), refs in listed.items() for ref in refs}
        for uuid in faults:
            if uuid not in self.faults():  # a reload meanwhile
                continue
            mine = self._replicas.get(uuid, frozenset())
            lost = self._lost.setdefault(uuid, frozenset(h for h in now if h[:2] in mine))
            if lost & now or self.daemons.pid(uuid) is None:
                continue
            del self._lost[uuid]
            log.info(
                "MPS replicas of %s Healthy again: the daemon runs and the %d containers "
                "that held a replica when it died have gone",
                uuid,
                len({ref for _, _, ref in lost}),
            )
            self.daemons.clear_fault(uuid, HOLDER)  # calls _changed
        return self.faults()

    async def close(self) -> None:
        """Stop watching the daemons (they keep running for the pods using them)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self._sync_client(None)
        if self.daemons is not None:
            await self.daemons.close()

    # ------------------------------------------------------------------ internals

    async def _sync_client(self, socket: Path | None) -> None:
        old = self._client
        if old is not None and socket == self._socket:
            return
        self._client, self._socket = None, socket
        if old is not None:
            await asyncio.to_thread(old.close)
        if socket is not None:
            self._client = PodResourcesClient(
                socket,
                meanwhile="a GPU whose MPS daemon died keeps its replicas Unhealthy until it "
                "answers (or the plugin restarts)",
            )

    def _changed(self) -> None:
        """A GPU's daemon died or its fault cleared (the supervisor calls this on the loop)."""
        faults = self.faults()
        for uuid in sorted(faults):
            if self._known.get(uuid) != faults[uuid]:
                log.warning(
                    "MPS replicas of %s Unhealthy until the containers given them before "
                    "are gone: %s",
                    uuid,
                    faults[uuid],
                )
        changed = set(faults) != set(self._known)
        self._known = faults
        if faults:
            self._wake.set()
            if self._task is None or self._task.done():
                self._task = asyncio.get_running_loop().create_task(
                    self._follow(), name="nvidia: MPS faults"
                )
        if changed:
            self._on_change()

    async def _follow(self) -> None:
        """Check at once, then every :attr:`recheck_s` (or when woken) while a GPU is faulty."""
        while self.faults():
            self._wake.clear()
            try:
                await self.check()
            except Exception:  # never lose the watch: the next round asks again
                log.exception("MPS: cannot check who holds the replicas of a faulty GPU")
            if not self.faults():
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.recheck_s)

    def _setup(self, uuid: str) -> list[str]:
        memory, replicas = self._parts[uuid]
        size, percent = replica_limits(memory, replicas, 1)
        return [
            f"set_default_device_pinned_mem_limit 0 {pinned_limit(size)}",
            f"set_default_active_thread_percentage {percent}",
        ]

"""A minimal kubelet double for the generic plugin's tests: Registration + ListAndWatch client.

Real gRPC over a real Unix socket. It records every ListAndWatch message per resource and
lets tests wait for one that satisfies a predicate; Allocate and GetPreferredAllocation go
straight to the plugin. The full emulator lives in :mod:`kubedevice.kubelet`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from kubedevice._api import KUBELET_SOCKET, dp, dp_grpc

Snapshot = dict[str, str]  # device id -> health


@dataclass
class _Plugin:
    endpoint: str
    channel: grpc.aio.Channel
    stub: Any
    options: Any
    snapshots: list[tuple[float, Snapshot, Any]] = field(default_factory=list)
    task: asyncio.Task[None] | None = None


class KubeletDouble:
    """Serves ``kubelet.sock`` in ``directory``; dials back every plugin that registers."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.plugins: dict[str, _Plugin] = {}
        self.registrations: list[str] = []
        self._changed = asyncio.Event()
        self._server: grpc.aio.Server | None = None

    async def __aenter__(self) -> KubeletDouble:
        server = grpc.aio.server()
        double = self

        class _Reg(dp_grpc.RegistrationServicer):  # type: ignore[misc]
            async def Register(self, request: Any, context: Any) -> Any:
                await double._connect(request.resource_name, request.endpoint)
                return dp.Empty()

        dp_grpc.add_RegistrationServicer_to_server(_Reg(), server)
        server.add_insecure_port(f"unix:{self.directory / KUBELET_SOCKET}")
        await server.start()
        self._server = server
        return self

    async def __aexit__(self, *exc: object) -> None:
        for plugin in self.plugins.values():
            if plugin.task is not None:
                plugin.task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await plugin.task
            await plugin.channel.close()
        if self._server is not None:
            await self._server.stop(0)

    async def _connect(self, resource: str, endpoint: str) -> None:
        old = self.plugins.pop(resource, None)
        if old is not None and old.task is not None:
            old.task.cancel()
        channel = grpc.aio.insecure_channel(f"unix:{self.directory / endpoint}")
        stub = dp_grpc.DevicePluginStub(channel)
        options = await stub.GetDevicePluginOptions(dp.Empty(), timeout=5)
        plugin = _Plugin(endpoint, channel, stub, options)
        plugin.task = asyncio.create_task(self._watch(resource, plugin))
        self.plugins[resource] = plugin
        self.registrations.append(resource)
        self._notify()

    async def _watch(self, resource: str, plugin: _Plugin) -> None:
        with contextlib.suppress(grpc.aio.AioRpcError):
            async for resp in plugin.stub.ListAndWatch(dp.Empty()):
                snap = {d.ID: d.health for d in resp.devices}
                plugin.snapshots.append((time.monotonic(), snap, resp))
                self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def latest(self, resource: str) -> Snapshot:
        plugin = self.plugins.get(resource)
        if plugin is None or not plugin.snapshots:
            return {}
        return plugin.snapshots[-1][1]

    def latest_devices(self, resource: str) -> list[Any]:
        plugin = self.plugins[resource]
        return list(plugin.snapshots[-1][2].devices)

    async def wait(self, resource: str, predicate: Callable[[Snapshot], bool]) -> Snapshot:
        """Wait (bounded by the caller's ``asyncio.timeout``) for a matching message."""
        while True:
            plugin = self.plugins.get(resource)
            if plugin is not None and plugin.snapshots and predicate(plugin.snapshots[-1][1]):
                return plugin.snapshots[-1][1]
            await self._changed.wait()

    async def wait_registered(self, resource: str) -> None:
        while resource not in self.plugins:
            await self._changed.wait()

    async def allocate(self, resource: str, ids: list[str]) -> Any:
        req = dp.AllocateRequest(container_requests=[dp.ContainerAllocateRequest(devices_ids=ids)])
        resp = await self.plugins[resource].stub.Allocate(req, timeout=5)
        return resp.container_responses[0]

    async def preferred(
        self, resource: str, available: list[str], must: list[str], size: int
    ) -> list[str]:
        req = dp.PreferredAllocationRequest(
            container_requests=[
                dp.ContainerPreferredAllocationRequest(
                    available_deviceIDs=available,
                    must_include_deviceIDs=must,
                    allocation_size=size,
                )
            ]
        )
        resp = await self.plugins[resource].stub.GetPreferredAllocation(req, timeout=5)
        return list(resp.container_responses[0].deviceIDs)

"""A small kubelet-side test double: Registration server + DevicePlugin client.

Uses only ``kubedevice._api`` (never the SDK internals). Like the kubelet, its Register
handler dials the plugin's socket, calls GetDevicePluginOptions and opens ListAndWatch
(and reads the first list) before it answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from kubedevice._api import KUBELET_SOCKET, dp


@dataclass
class Registration:
    """One Register call the double accepted."""

    request: Any
    options: Any
    first_list: list[tuple[str, str]]


@dataclass
class _Client:
    channel: grpc.aio.Channel
    stream: Any
    reader: asyncio.Task[None] | None = None
    lists: list[list[tuple[str, str]]] = field(default_factory=list)


class KubeletDouble:
    """Serves ``/v1beta1.Registration/Register`` on ``<dir>/kubelet.sock``."""

    def __init__(self, directory: Path, *, dial_back: bool = True, accept: bool = True) -> None:
        self.directory = directory
        self.dial_back = dial_back
        self.accept = accept
        self.registrations: list[Registration] = []
        #: Called in each accepted Register, before the answer.
        self.on_register: Callable[[], None] = lambda: None
        self.clients: dict[str, _Client] = {}
        self.changed = asyncio.Condition()
        self._server: grpc.aio.Server | None = None

    @property
    def socket(self) -> Path:
        return self.directory / KUBELET_SOCKET

    async def start(self) -> None:
        server = grpc.aio.server()
        handler = grpc.method_handlers_generic_handler(
            "v1beta1.Registration",
            {
                "Register": grpc.unary_unary_rpc_method_handler(
                    self._register,
                    request_deserializer=dp.RegisterRequest.FromString,
                    response_serializer=dp.Empty.SerializeToString,
                )
            },
        )
        server.add_generic_rpc_handlers((handler,))
        server.add_insecure_port(f"unix:{self.socket}")
        await server.start()
        self._server = server

    async def stop(self) -> None:
        for client in list(self.clients.values()):
            await self._drop(client)
        self.clients.clear()
        if self._server is not None:
            await self._server.stop(None)
            self._server = None

    async def restart(self) -> None:
        """Like a kubelet restart: stop, delete every socket in the directory, serve again."""
        await self.stop()
        for entry in self.directory.iterdir():
            if stat.S_ISSOCK(entry.lstat().st_mode):
                entry.unlink()
        await self.start()

    async def _drop(self, client: _Client) -> None:
        if client.reader is not None:
            client.reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await client.reader
        await client.channel.close()

    async def close_stream(self, resource: str) -> None:
        """End our ListAndWatch stream for ``resource`` (as a kubelet disconnect does)."""
        client = self.clients.pop(resource)
        await self._drop(client)

    async def _register(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        if not self.accept:
            await context.abort(grpc.StatusCode.UNKNOWN, "not accepting registrations")
        if not self.dial_back:
            async with self.changed:
                self.registrations.append(Registration(request, None, []))
                self.changed.notify_all()
            return dp.Empty()
        channel = grpc.aio.insecure_channel(f"unix://{self.directory / request.endpoint}")
        try:
            await asyncio.wait_for(channel.channel_ready(), 10)
            options = await channel.unary_unary(
                "/v1beta1.DevicePlugin/GetDevicePluginOptions",
                request_serializer=dp.Empty.SerializeToString,
                response_deserializer=dp.DevicePluginOptions.FromString,
            )(dp.Empty())
            stream = channel.unary_stream(
                "/v1beta1.DevicePlugin/ListAndWatch",
                request_serializer=dp.Empty.SerializeToString,
                response_deserializer=dp.ListAndWatchResponse.FromString,
            )(dp.Empty())
            first = await stream.read()
        except (grpc.aio.AioRpcError, TimeoutError) as exc:
            await channel.close()
            await context.abort(grpc.StatusCode.UNKNOWN, f"failed to dial device plugin: {exc}")
        first_list = [(d.ID, d.health) for d in first.devices]
        old = self.clients.pop(request.resource_name, None)
        if old is not None:
            await self._drop(old)
        client = _Client(channel, stream, lists=[first_list])
        client.reader = asyncio.create_task(self._read(request.resource_name, client))
        self.clients[request.resource_name] = client
        async with self.changed:
            self.registrations.append(Registration(request, options, first_list))
            self.changed.notify_all()
        self.on_register()
        return dp.Empty()

    async def _read(self, resource: str, client: _Client) -> None:
        with contextlib.suppress(grpc.aio.AioRpcError):
            while True:
                msg = await client.stream.read()
                if msg is grpc.aio.EOF:
                    return
                async with self.changed:
                    client.lists.append([(d.ID, d.health) for d in msg.devices])
                    self.changed.notify_all()

    async def wait_registrations(self, count: int, timeout: float = 10) -> list[Registration]:
        async with asyncio.timeout(timeout), self.changed:
            await self.changed.wait_for(lambda: len(self.registrations) >= count)
        return self.registrations

    async def wait_list(
        self, resource: str, predicate: Any, timeout: float = 10
    ) -> list[tuple[str, str]]:
        """Wait until the latest list received for ``resource`` satisfies ``predicate``."""

        def ok() -> bool:
            client = self.clients.get(resource)
            return client is not None and bool(client.lists) and predicate(client.lists[-1])

        async with asyncio.timeout(timeout), self.changed:
            await self.changed.wait_for(ok)
        return self.clients[resource].lists[-1]

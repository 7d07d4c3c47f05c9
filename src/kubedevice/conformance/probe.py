"""The kit's own raw client to a plugin socket, for answers the emulator would normalise.

The emulator collapses duplicate device IDs of a ListAndWatch message (as the kubelet
does); the device-list check needs the message as sent. Also used to ask a plugin socket
whether it answers at all. Built on ``kubedevice._api`` only; protobuf stays inside.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import TracebackType

import grpc
from grpc import aio

from kubedevice._api import KUBELET_MAX_RECV_MESSAGE_BYTES, dp, dp_grpc

__all__ = ["ProbeClient", "rpc_error_text"]


def rpc_error_text(exc: BaseException) -> str:
    """``CODE: details`` for a gRPC error, else the exception text."""
    if isinstance(exc, aio.AioRpcError):
        return f"{exc.code().name}: {exc.details() or ''}".rstrip(": ")
    if isinstance(exc, TimeoutError):
        return "no answer (timed out)"
    return f"{type(exc).__name__}: {exc}"


class ProbeClient:
    """A short-lived channel to one plugin socket (async context manager)."""

    def __init__(self, socket_path: Path, *, rpc_timeout: float) -> None:
        self.socket_path = socket_path
        self.rpc_timeout = rpc_timeout
        self.calls: list[str] = []
        self._channel = aio.insecure_channel(
            f"unix://{socket_path}",
            options=[
                ("grpc.max_receive_message_length", KUBELET_MAX_RECV_MESSAGE_BYTES),
                ("grpc.default_authority", "localhost"),
                ("grpc.use_local_subchannel_pool", 1),
            ],
        )
        self._stub = dp_grpc.DevicePluginStub(self._channel)

    async def __aenter__(self) -> ProbeClient:
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._channel.close()

    async def options(self) -> dp.DevicePluginOptions:
        """GetDevicePluginOptions."""
        self.calls.append("GetDevicePluginOptions")
        return await self._stub.GetDevicePluginOptions(dp.Empty(), timeout=self.rpc_timeout)

    async def first_list(self, limit: float) -> list[tuple[str, str]]:
        """Open a new ListAndWatch stream, return its first message as ``(ID, health)``.

        Waits at most ``limit`` seconds (``TimeoutError``).
        """
        self.calls.append("ListAndWatch")
        call = self._stub.ListAndWatch(dp.Empty())
        try:
            msg = await asyncio.wait_for(call.read(), limit)
        finally:
            call.cancel()
        if msg is grpc.aio.EOF:
            raise EOFError("ListAndWatch ended before its first message")
        assert isinstance(msg, dp.ListAndWatchResponse)
        return [(d.ID, d.health) for d in msg.devices]

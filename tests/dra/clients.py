"""Test-side kubelet clients for a DRA driver: the plugin watcher's calls and the DRA calls.

Written against the generated API only (never the kit's own helpers), as the kubelet would.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import grpc

from kubedevice._api.dra.v1 import api_pb2 as v1, api_pb2_grpc as v1_grpc
from kubedevice._api.dra.v1beta1 import api_pb2 as v1beta1, api_pb2_grpc as v1beta1_grpc
from kubedevice._api.drahealth.v1alpha1 import api_pb2 as hpb, api_pb2_grpc as hpb_grpc
from kubedevice._api.pluginregistration.v1 import api_pb2 as reg, api_pb2_grpc as reg_grpc

ClaimTuple = tuple[str, str, str]  # namespace, name, uid


def channel(path: Path) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(f"unix:{path}")


async def get_info(reg_socket: Path) -> reg.PluginInfo:
    async with channel(reg_socket) as ch:
        return await reg_grpc.RegistrationStub(ch).GetInfo(reg.InfoRequest(), timeout=10)


async def notify(reg_socket: Path, registered: bool, error: str = "") -> None:
    async with channel(reg_socket) as ch:
        await reg_grpc.RegistrationStub(ch).NotifyRegistrationStatus(
            reg.RegistrationStatus(plugin_registered=registered, error=error), timeout=10
        )


async def register(reg_socket: Path) -> reg.PluginInfo:
    """What the kubelet's plugin watcher does: GetInfo, then a successful notification."""
    info = await get_info(reg_socket)
    await notify(reg_socket, True)
    return info


async def prepare(
    dra_socket: Path, claims: Sequence[ClaimTuple], version: str = "v1", timeout: float = 30
) -> Any:
    """``NodePrepareResources`` with a deadline ``timeout`` seconds away (the kubelet's: 45)."""
    async with channel(dra_socket) as ch:
        if version == "v1":
            return await v1_grpc.DRAPluginStub(ch).NodePrepareResources(
                v1.NodePrepareResourcesRequest(
                    claims=[v1.Claim(namespace=n, name=m, uid=u) for n, m, u in claims]
                ),
                timeout=timeout,
            )
        return await v1beta1_grpc.DRAPluginStub(ch).NodePrepareResources(
            v1beta1.NodePrepareResourcesRequest(
                claims=[v1beta1.Claim(namespace=n, name=m, uid=u) for n, m, u in claims]
            ),
            timeout=timeout,
        )


async def unprepare(
    dra_socket: Path, claims: Sequence[ClaimTuple], version: str = "v1", timeout: float = 30
) -> Any:
    async with channel(dra_socket) as ch:
        if version == "v1":
            return await v1_grpc.DRAPluginStub(ch).NodeUnprepareResources(
                v1.NodeUnprepareResourcesRequest(
                    claims=[v1.Claim(namespace=n, name=m, uid=u) for n, m, u in claims]
                ),
                timeout=timeout,
            )
        return await v1beta1_grpc.DRAPluginStub(ch).NodeUnprepareResources(
            v1beta1.NodeUnprepareResourcesRequest(
                claims=[v1beta1.Claim(namespace=n, name=m, uid=u) for n, m, u in claims]
            ),
            timeout=timeout,
        )


async def health_stream(dra_socket: Path) -> AsyncIterator[hpb.NodeWatchResourcesResponse]:
    async with channel(dra_socket) as ch:
        stream = hpb_grpc.DRAResourceHealthStub(ch).NodeWatchResources(
            hpb.NodeWatchResourcesRequest()
        )
        async for message in stream:
            yield message


async def next_message(stream: AsyncIterator[Any], timeout: float = 10) -> Any:
    return await asyncio.wait_for(anext(stream), timeout)

"""Fixtures for the SDK tests: a kubelet double in a short socket directory, plugin clients."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from kubelet_double import KubeletDouble

import kubedevice
from kubedevice._api import dp_grpc


@pytest.fixture
async def kubelet(sock_dir: Path) -> AsyncIterator[KubeletDouble]:
    double = KubeletDouble(sock_dir)
    await double.start()
    try:
        yield double
    finally:
        await double.stop()


@pytest.fixture
async def server(sock_dir: Path) -> AsyncIterator[kubedevice.PluginServer]:
    async with kubedevice.PluginServer(
        sock_dir, stream_grace=0.2, backoff_initial=0.01, backoff_max=0.2
    ) as srv:
        yield srv


@pytest.fixture
async def stub_for(server: kubedevice.PluginServer) -> AsyncIterator[object]:
    channels: list[grpc.aio.Channel] = []

    def make(resource: str) -> dp_grpc.DevicePluginStub:
        channel = grpc.aio.insecure_channel(f"unix://{server.socket_path(resource)}")
        channels.append(channel)
        return dp_grpc.DevicePluginStub(channel)

    yield make
    for channel in channels:
        await channel.close()


@pytest.fixture(autouse=True)
async def _no_leaked_tasks() -> AsyncIterator[None]:
    """Every task a test's servers and plugins started is gone when the test ends."""
    before = asyncio.all_tasks()
    yield
    left = [
        t for t in asyncio.all_tasks() - before if t is not asyncio.current_task() and not t.done()
    ]
    assert not left, f"leaked tasks: {[t.get_name() for t in left]}"

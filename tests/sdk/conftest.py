"""Fixtures for the SDK tests: a kubelet double in a short socket directory, plugin clients."""

from __future__ import annotations

import asyncio
import stat
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
    # Stopped: none of its sockets, final or temporary, is left behind.
    left = [
        p.name
        for p in sock_dir.iterdir()
        if stat.S_ISSOCK(p.lstat().st_mode) and p.name.startswith((".kd-", "example.com-"))
    ]
    assert not left, f"sockets left behind: {left}"


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


def _grpc_status_waiter(task: asyncio.Task[object]) -> bool:
    """grpcio's own client-side status task, which channel.close() can leave pending.

    A known grpcio bug (grpc/grpc#41875): the task waits for a status the closed
    channel never delivers. It belongs to grpcio, not to the code under test, and
    nothing outside grpcio can end it; it was seen once in about 1,200 tests.
    """
    coro = task.get_coro()
    return getattr(coro, "__qualname__", "") == "_AioCall._handle_status_once_received"


@pytest.fixture(autouse=True)
async def _no_leaked_tasks() -> AsyncIterator[None]:
    """Every task a test's servers and plugins started is gone when the test ends.

    gRPC finishes its own per-RPC tasks a moment after a server stops or a channel
    closes, so pending tasks get a bounded wait to end on their own; one still pending
    after it is a leak.
    """
    before = asyncio.all_tasks()
    yield
    left = {
        t
        for t in asyncio.all_tasks() - before
        if t is not asyncio.current_task() and not t.done() and not _grpc_status_waiter(t)
    }
    if left:
        _, left = await asyncio.wait(left, timeout=5)
    assert not left, f"leaked tasks: {[t.get_name() for t in left]}"

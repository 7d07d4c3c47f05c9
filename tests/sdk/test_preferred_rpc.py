"""GetPreferredAllocation over gRPC with arbitrary (mis)behaving hooks, property-based."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import grpc
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import kubedevice
from kubedevice._api import dp, dp_grpc

POOL = [f"d{i}" for i in range(8)]


class Scripted(kubedevice.DevicePlugin):
    resource_name = "example.com/scripted"
    answer: Sequence[object] | Exception = ()

    async def preferred_allocation(
        self,
        available: Sequence[kubedevice.Device],
        must_include: Sequence[kubedevice.Device],
        size: int,
    ) -> Sequence[str]:
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer  # type: ignore[return-value]


@pytest.fixture(scope="module")
def live() -> Iterator[tuple[Scripted, dp_grpc.DevicePluginStub]]:
    directory = Path(tempfile.mkdtemp(prefix="kd-", dir="/tmp"))
    plugin = Scripted()
    plugin.update([kubedevice.Device(id=i, numa_nodes=(int(i[1:]) % 2,)) for i in POOL])
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    stop = asyncio.Event()

    async def main() -> None:
        up = asyncio.Event()
        task = asyncio.create_task(
            kubedevice.serve(plugin, device_plugin_dir=directory, stop=stop, ready=up)
        )
        await up.wait()
        ready.set()
        await task

    thread = threading.Thread(target=loop.run_until_complete, args=(main(),))
    thread.start()
    assert ready.wait(30)
    channel = grpc.insecure_channel(f"unix://{directory / 'example.com-scripted.sock'}")
    try:
        yield plugin, dp_grpc.DevicePluginStub(channel)
    finally:
        channel.close()
        loop.call_soon_threadsafe(stop.set)
        thread.join(30)
        loop.close()
        shutil.rmtree(directory, ignore_errors=True)


ids = st.sampled_from([*POOL, "zz", "yy"])


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    available=st.lists(st.sampled_from(POOL), unique=True),
    must_pick=st.lists(st.integers(0, 7), unique=True, max_size=4),
    size=st.integers(0, 10),
    answer=st.one_of(
        st.lists(ids, max_size=12),
        st.just(RuntimeError("hook failed")),
        st.just([1, 2]),
    ),
)
def test_answer_keeps_invariants(
    live: tuple[Scripted, dp_grpc.DevicePluginStub],
    available: list[str],
    must_pick: list[int],
    size: int,
    answer: list[str] | Exception,
) -> None:
    plugin, stub = live
    must = [available[i] for i in must_pick if i < len(available)]
    plugin.answer = answer
    req = dp.PreferredAllocationRequest()
    req.container_requests.add(
        available_deviceIDs=available, must_include_deviceIDs=must, allocation_size=size
    )
    resp = stub.GetPreferredAllocation(req, timeout=10)
    got = list(resp.container_responses[0].deviceIDs)
    assert set(must) <= set(got)
    assert set(got) <= set(available)
    assert len(got) == len(set(got))
    assert len(got) == min(max(size, len(must)), len(available))

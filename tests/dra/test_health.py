"""The v1alpha1.DRAResourceHealth stream: the full list at once, then on every change."""

from __future__ import annotations

from pathlib import Path

import pytest

from dra import clients
from dra.fakes import DRIVER, FakeDriver, gpus, server
from kubedevice._api.drahealth.v1alpha1 import api_pb2 as hpb

pytestmark = pytest.mark.timeout(60)


def _states(message: hpb.NodeWatchResourcesResponse) -> dict[str, int]:
    return {d.device.device_name: d.health for d in message.devices}


async def test_health_stream_sends_the_list_then_every_change(
    kdir: Path, kubeconfig: Path, node_name: str
) -> None:
    driver = FakeDriver(gpus(3))
    async with server(driver, kdir, kubeconfig, node_name, publish=False):
        stream = clients.health_stream(kdir / "plugins" / DRIVER / "dra.sock")
        first = await clients.next_message(stream)
        assert _states(first) == {f"gpu-{i}": hpb.HealthStatus.HEALTHY for i in range(3)}
        assert {d.device.pool_name for d in first.devices} == {node_name}
        assert all(d.last_updated_time > 0 for d in first.devices)
        driver.snapshots.put_nowait(gpus(3, unhealthy=[1]))
        second = await clients.next_message(stream)
        assert _states(second) == {
            "gpu-0": hpb.HealthStatus.HEALTHY,
            "gpu-1": hpb.HealthStatus.UNHEALTHY,
            "gpu-2": hpb.HealthStatus.HEALTHY,
        }
        await stream.aclose()


async def test_unchanged_list_is_sent_again_before_the_kubelet_times_it_out(
    kdir: Path, kubeconfig: Path, node_name: str
) -> None:
    from kubedevice.dra.health import RESEND_S

    assert RESEND_S * 2 < 30  # the kubelet's DefaultHealthTimeout
    async with server(FakeDriver(gpus(2)), kdir, kubeconfig, node_name, publish=False) as srv:
        srv.health.resend_s = 0.05
        stream = clients.health_stream(kdir / "plugins" / DRIVER / "dra.sock")
        first = await clients.next_message(stream)
        again = await clients.next_message(stream)  # no change in between
        assert again == first
        await stream.aclose()

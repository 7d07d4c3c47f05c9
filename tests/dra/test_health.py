"""The v1alpha1.DRAResourceHealth stream: the full list at once, then on every change."""

from __future__ import annotations

from pathlib import Path

import pytest

from dra import clients
from dra.fakes import DRIVER, FakeDriver, gpus, server
from kubedevice import dra
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
    from kubedevice.dra.node.health import RESEND_S

    assert RESEND_S * 2 < 30  # the kubelet's DefaultHealthTimeout
    async with server(FakeDriver(gpus(2)), kdir, kubeconfig, node_name, publish=False) as srv:
        srv.health.resend_s = 0.05
        stream = clients.health_stream(kdir / "plugins" / DRIVER / "dra.sock")
        first = await clients.next_message(stream)
        again = await clients.next_message(stream)  # no change in between
        assert again == first
        await stream.aclose()


async def test_each_device_carries_why_it_is_unhealthy_and_how_long_to_trust_it(
    kdir: Path, kubeconfig: Path, node_name: str
) -> None:
    from kubedevice.dra.node.health import TIMEOUT_S

    devices = gpus(3)
    devices[1] = dra.Device(
        "gpu-1",
        health=dra.Health.UNHEALTHY,
        fault=dra.Fault("xid", "79", "XID 79: GPU has fallen off the bus"),
    )
    devices[2] = dra.Device("gpu-2", health=dra.Health.UNHEALTHY)  # no reason given
    driver = FakeDriver(gpus(3))
    async with server(driver, kdir, kubeconfig, node_name, publish=False):
        stream = clients.health_stream(kdir / "plugins" / DRIVER / "dra.sock")
        first = await clients.next_message(stream)
        assert {d.message for d in first.devices} == {""}  # healthy: nothing to say
        assert {d.health_check_timeout_seconds for d in first.devices} == {TIMEOUT_S}
        driver.snapshots.put_nowait(devices)
        second = await clients.next_message(stream)
        by_name = {d.device.device_name: d for d in second.devices}
        assert by_name["gpu-1"].message == "XID 79: GPU has fallen off the bus"
        assert by_name["gpu-1"].health == hpb.HealthStatus.UNHEALTHY
        assert by_name["gpu-2"].message == "unhealthy (no reason given)"
        assert by_name["gpu-0"].message == ""
        # a new reason on a device that stays Unhealthy is a change: sent, with a new time
        devices[1] = dra.Device("gpu-1", health=dra.Health.UNHEALTHY, fault=dra.Fault("gpu-lost"))
        driver.snapshots.put_nowait(devices)
        third = await clients.next_message(stream)
        assert {d.device.device_name: d.message for d in third.devices}["gpu-1"] == "gpu-lost"
        await stream.aclose()


def test_a_fault_is_checked_like_a_taint_and_its_message_cut_as_the_kubelet_does() -> None:
    from kubedevice.errors import ConfigError

    for kind in ("", "-xid", "xid/79", "x" * 64, "a b"):
        with pytest.raises(ConfigError, match="not a label name"):
            dra.Fault(kind)
    with pytest.raises(ConfigError, match="not a label value"):
        dra.Fault("xid", "79 80")
    with pytest.raises(ConfigError, match="a Healthy device has no fault"):
        dra.Device("gpu-0", fault=dra.Fault("xid", "79"))
    long = dra.Fault("xid", "79", "x" * 2000)
    assert len(long.message) == 1024
    assert long.message.endswith("...")

"""Allocate answers built once per device list: always the answer of the list in force.

The default answer (the union of what the devices declare) is a function of the devices
alone, so the servicer keeps it per ID list until the plugin publishes a new list. These
tests change the devices between identical requests and check the answer follows.
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc
import pytest
from sdk_helpers import StaticPlugin

import kubedevice
from kubedevice._api import dp

RES = "example.com/dev"


def _req(*containers: list[str]) -> dp.AllocateRequest:
    req = dp.AllocateRequest()
    for ids in containers:
        req.container_requests.add(devices_ids=ids)
    return req


def _dev(
    i: int, value: str, health: kubedevice.Health = kubedevice.Health.HEALTHY
) -> kubedevice.Device:
    return kubedevice.Device(
        id=f"d{i}",
        health=health,
        envs={"V": value},
        device_specs=(kubedevice.DeviceSpec(f"/dev/x{i}", f"/dev/x{i}"),),
    )


async def test_the_default_answer_follows_new_device_metadata(
    server: kubedevice.PluginServer, stub_for: object
) -> None:
    plugin = StaticPlugin([_dev(0, "old"), _dev(1, "old")])
    await server.add(plugin)
    stub = stub_for(RES)  # type: ignore[operator]
    for _ in range(2):  # the second answer comes from what the first one built
        resp = await stub.Allocate(_req(["d0", "d1"]))
        assert dict(resp.container_responses[0].envs) == {"V": "old"}
    # Same IDs, same health: the ListAndWatch list is unchanged, the devices are not.
    plugin.update([_dev(0, "new"), _dev(1, "new")])
    resp = await stub.Allocate(_req(["d0", "d1"]))
    assert dict(resp.container_responses[0].envs) == {"V": "new"}


async def test_an_answer_given_before_is_refused_once_the_device_is_unhealthy(
    server: kubedevice.PluginServer, stub_for: object
) -> None:
    plugin = StaticPlugin([_dev(0, "x")])
    await server.add(plugin)
    stub = stub_for(RES)  # type: ignore[operator]
    await stub.Allocate(_req(["d0"]))
    plugin.update([_dev(0, "x", kubedevice.Health.UNHEALTHY)])
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Allocate(_req(["d0"]))
    assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "unhealthy" in (err.value.details() or "")


async def test_several_containers_get_each_their_own_answer_every_time(
    server: kubedevice.PluginServer, stub_for: object
) -> None:
    await server.add(StaticPlugin([_dev(i, f"v{i}") for i in range(3)]))
    stub = stub_for(RES)  # type: ignore[operator]
    first = await stub.Allocate(_req(["d2"], ["d0", "d1"]))
    again = await stub.Allocate(_req(["d2"], ["d0", "d1"]))
    swapped = await stub.Allocate(_req(["d0", "d1"], ["d2"]))
    assert first == again
    assert [dict(c.envs) for c in first.container_responses] == [{"V": "v2"}, {"V": "v0,v1"}]
    assert [[d.host_path for d in c.devices] for c in first.container_responses] == [
        ["/dev/x2"],
        ["/dev/x0", "/dev/x1"],
    ]
    assert list(swapped.container_responses) == list(reversed(first.container_responses))


class CountingPlugin(StaticPlugin):
    """An allocate hook that answers DEFAULT and counts its calls."""

    calls = 0

    async def allocate(self, devices: Sequence[kubedevice.Device]) -> kubedevice.AllocateResult:
        self.calls += 1
        if self.calls == 3:
            return kubedevice.ContainerAllocation(envs={"V": "own"})
        return kubedevice.DEFAULT


async def test_an_allocate_hook_is_asked_on_every_call(
    server: kubedevice.PluginServer, stub_for: object
) -> None:
    plugin = CountingPlugin([_dev(0, "x")])
    await server.add(plugin)
    stub = stub_for(RES)  # type: ignore[operator]
    answers = [dict((await stub.Allocate(_req(["d0"]))).container_responses[0].envs)]
    answers += [dict((await stub.Allocate(_req(["d0"]))).container_responses[0].envs)]
    answers += [dict((await stub.Allocate(_req(["d0"]))).container_responses[0].envs)]
    answers += [dict((await stub.Allocate(_req(["d0"]))).container_responses[0].envs)]
    assert plugin.calls == 4
    assert answers == [{"V": "x"}, {"V": "x"}, {"V": "own"}, {"V": "x"}]

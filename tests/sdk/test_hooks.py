"""Hooks written as plain functions work; hooks the server could not call are refused at add()."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any

import grpc
import pytest
from kubelet_double import KubeletDouble

import kubedevice
from kubedevice._api import dp, dp_grpc

RES = "example.com/dev"
MAIN = threading.get_ident()


class SyncPlugin(kubedevice.DevicePlugin):
    """Every hook a plain function; devices() a plain generator."""

    resource_name = RES

    def __init__(self) -> None:
        self.threads: dict[str, int] = {}
        self.more = threading.Event()
        self.started: list[Sequence[kubedevice.Device]] = []

    def devices(self) -> Iterator[Sequence[kubedevice.Device]]:  # type: ignore[override]
        self.threads["devices"] = threading.get_ident()
        yield [kubedevice.Device(id=f"d{i}", envs={"N": str(i)}) for i in range(3)]
        self.more.wait()  # blocks its thread, never the event loop
        yield [kubedevice.Device(id="d9")]
        time.sleep(3600)  # blocked at shutdown: must not hold the server up

    def allocate(self, devices: Sequence[kubedevice.Device]) -> kubedevice.AllocateResult:  # type: ignore[override]
        self.threads["allocate"] = threading.get_ident()
        return kubedevice.ContainerAllocation(envs={"IDS": ",".join(d.id for d in devices)})

    def preferred_allocation(  # type: ignore[override]
        self,
        available: Sequence[kubedevice.Device],
        must_include: Sequence[kubedevice.Device],
        size: int,
    ) -> Sequence[str]:
        self.threads["preferred_allocation"] = threading.get_ident()
        return [d.id for d in reversed(available)][:size]

    def pre_start(self, devices: Sequence[kubedevice.Device]) -> None:  # type: ignore[override]
        self.threads["pre_start"] = threading.get_ident()


async def test_plain_function_hooks_and_a_plain_generator_run_off_the_loop(
    kubelet: KubeletDouble,
    server: kubedevice.PluginServer,
    stub_for: Callable[[str], dp_grpc.DevicePluginStub],
) -> None:
    plugin = SyncPlugin()
    await server.add(plugin)
    (reg,) = await kubelet.wait_registrations(1, timeout=10)
    assert [i for i, _ in reg.first_list] == ["d0", "d1", "d2"]
    assert reg.options.pre_start_required
    assert reg.options.get_preferred_allocation_available
    stub = stub_for(RES)
    req = dp.AllocateRequest()
    req.container_requests.add(devices_ids=["d0", "d2"])
    resp = await stub.Allocate(req, timeout=10)
    assert dict(resp.container_responses[0].envs) == {"IDS": "d0,d2"}
    pref = dp.PreferredAllocationRequest()
    pref.container_requests.add(available_deviceIDs=["d0", "d1", "d2"], allocation_size=2)
    got = await stub.GetPreferredAllocation(pref, timeout=10)
    assert list(got.container_responses[0].deviceIDs) == ["d2", "d1"]
    await stub.PreStartContainer(dp.PreStartContainerRequest(devices_ids=["d1"]), timeout=10)
    plugin.more.set()
    assert await kubelet.wait_list(RES, lambda lst: [i for i, _ in lst] == ["d9"])
    assert set(plugin.threads) == {"devices", "allocate", "preferred_allocation", "pre_start"}
    assert MAIN not in plugin.threads.values()
    # The generator is now blocked in time.sleep(3600): removing the plugin does not wait.
    async with asyncio.timeout(5):
        await server.remove(RES)


class _Base(kubedevice.DevicePlugin):
    resource_name = RES

    async def devices(self) -> AsyncIterator[Sequence[kubedevice.Device]]:
        yield [kubedevice.Device(id="d0")]


class NoArgAllocate(_Base):
    async def allocate(self) -> kubedevice.AllocateResult:  # type: ignore[override]
        return kubedevice.DEFAULT


class TwoArgPreferred(_Base):
    async def preferred_allocation(self, available: Any, size: int) -> Sequence[str]:  # type: ignore[override]
        return []


class KeywordOnlyPreStart(_Base):
    async def pre_start(self, *, devices: Any) -> None:  # type: ignore[override]
        return None


class DevicesWithArgument(kubedevice.DevicePlugin):
    resource_name = RES

    async def devices(self, which: str) -> AsyncIterator[Sequence[kubedevice.Device]]:  # type: ignore[override]
        yield []


class DevicesReturnsAList(kubedevice.DevicePlugin):
    resource_name = RES

    async def devices(self) -> Sequence[kubedevice.Device]:  # type: ignore[override]
        return [kubedevice.Device(id="d0")]


class AllocateNotCallable(_Base):
    allocate = "default"  # type: ignore[assignment]


@pytest.mark.parametrize(
    ("plugin_cls", "message"),
    [
        (NoArgAllocate, "NoArgAllocate.allocate(self) cannot be called as allocate(devices)"),
        (
            TwoArgPreferred,
            "TwoArgPreferred.preferred_allocation(self, available, size) cannot be called as "
            "preferred_allocation(available, must_include, size): too many positional "
            "arguments; its signature must be preferred_allocation(self, available, must_include, "
            "size)",
        ),
        (KeywordOnlyPreStart, "cannot be called as pre_start(devices)"),
        (DevicesWithArgument, "cannot be called as devices()"),
        (DevicesReturnsAList, "DevicesReturnsAList.devices is 'async def' without 'yield'"),
        (AllocateNotCallable, "AllocateNotCallable.allocate is not callable"),
    ],
)
async def test_hooks_the_server_cannot_call_are_refused_when_added(
    server: kubedevice.PluginServer, plugin_cls: type[kubedevice.DevicePlugin], message: str
) -> None:
    with pytest.raises(kubedevice.ConfigError) as info:
        await server.add(plugin_cls())
    assert message in str(info.value)
    assert server.resource_names == ()


async def test_a_plain_allocate_that_raises_is_internal_and_the_daemon_stays_up(
    kubelet: KubeletDouble,
    server: kubedevice.PluginServer,
    stub_for: Callable[[str], dp_grpc.DevicePluginStub],
) -> None:
    class Failing(_Base):
        def allocate(self, devices: Sequence[kubedevice.Device]) -> kubedevice.AllocateResult:  # type: ignore[override]
            raise OSError("no such device")

    await server.add(Failing())
    await kubelet.wait_registrations(1, timeout=10)
    req = dp.AllocateRequest()
    req.container_requests.add(devices_ids=["d0"])
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub_for(RES).Allocate(req, timeout=10)
    assert err.value.code() is grpc.StatusCode.INTERNAL
    assert "no such device" in (err.value.details() or "")
    opts = await stub_for(RES).GetDevicePluginOptions(dp.Empty(), timeout=10)
    assert not opts.pre_start_required

"""Registration, ListAndWatch handling, stream end, grace period, re-registration."""

from __future__ import annotations

import asyncio
import os
import socket
import stat
import time
from pathlib import Path

import grpc
import pytest
from kubelet_helpers import PluginFactory
from rawplugin import Dev, RawPlugin, devs

from kubedevice.kubelet import (
    Emulator,
    KubeletStartedEvent,
    ListAndWatchEvent,
    RegistrationEvent,
    ResourceRemovedEvent,
    StreamEndEvent,
)
from kubedevice.kubelet.registration import is_extended_resource_name

R = "example.com/foo"


def coarse_now_ns() -> int:
    """Linux's CLOCK_REALTIME_COARSE, the clock file times may lag behind (by a tick)."""
    return time.clock_gettime_ns(5)


def _bind(path: Path) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    return s


async def test_startup_removes_only_sockets(dp_dir: Path) -> None:
    stale = _bind(dp_dir / "stale.sock")
    odd = _bind(dp_dir / "no-suffix")
    (dp_dir / "keep.txt").write_text("x")
    (dp_dir / "sub").mkdir()
    sub_sock = _bind(dp_dir / "sub" / "inner.sock")
    try:
        async with Emulator(dp_dir, control_socket=False) as emu:
            names = sorted(p.name for p in dp_dir.iterdir())
            assert names == ["keep.txt", "kubelet.sock", "kubelet_internal_checkpoint", "sub"]
            assert (dp_dir / "sub" / "inner.sock").exists()  # not recursive
            mode = stat.S_IMODE(os.stat(emu.kubelet_socket).st_mode)
            assert mode == 0o600
            assert stat.S_ISSOCK(os.stat(emu.kubelet_socket).st_mode)
            assert isinstance(emu.events[0], KubeletStartedEvent)
    finally:
        for s in (stale, odd, sub_sock):
            s.close()


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("example.com/gpu", True),
        ("nvidia.com/GPU", True),
        ("Example.com/gpu", False),
        ("gpu", False),
        ("a/b/c", False),
        ("kubernetes.io/foo", False),
        ("foo.kubernetes.io/x", False),
        ("requests.example.com/x", False),
        ("example.com/-x", False),
        ("example.com/" + "x" * 64, False),
        ("example.com/" + "x" * 63, True),
    ],
)
def test_resource_name_rule(name: str, ok: bool) -> None:
    assert is_extended_resource_name(name) is ok


@pytest.mark.parametrize(
    ("version", "resource", "message"),
    [
        (
            "v1alpha",
            R,
            'requested API version "v1alpha" is not supported by kubelet. '
            'Supported version is ["v1beta1"]',
        ),
        ("v1beta1", "gpu", 'the ResourceName "gpu" is invalid'),
        ("v1beta1", "Example.com/gpu", 'the ResourceName "Example.com/gpu" is invalid'),
    ],
)
async def test_registration_errors(
    emu: Emulator, plugin: PluginFactory, version: str, resource: str, message: str
) -> None:
    p = await plugin(R, devs(1), register=False)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await p.register(version=version, resource=resource)
    assert err.value.code() == grpc.StatusCode.UNKNOWN
    assert err.value.details() == message
    ev = emu.events.of_type(RegistrationEvent)[-1]
    assert (ev.error, ev.dialed, ev.version, ev.resource) == (message, False, version, resource)
    assert p.calls.options == 0


async def test_dial_failure(emu: Emulator, plugin: PluginFactory) -> None:
    p = await plugin(R, devs(1), register=False)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await p.register(endpoint="missing.sock")
    assert err.value.code() == grpc.StatusCode.UNKNOWN
    assert err.value.details() == "failed to dial device plugin: context deadline exceeded"
    ev = emu.events.of_type(RegistrationEvent)[-1]
    assert ev.dialed is False
    assert emu.node().resources == {}


async def test_options_failure(emu: Emulator, plugin: PluginFactory) -> None:
    p = await plugin(R, devs(1), register=False)
    p.options_error = "nope"
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await p.register()
    assert err.value.details() == (
        "failed to get device plugin options: rpc error: code = Unknown desc = nope"
    )
    assert emu.events.of_type(RegistrationEvent)[-1].dialed is True


async def test_capacity_allocatable_and_health_strings(
    emu: Emulator, plugin: PluginFactory
) -> None:
    d = [
        Dev("a"),
        Dev("b", "Unhealthy"),
        Dev("c", "healthy"),
        Dev("d", ""),
        Dev("e", "Unknown"),
        Dev("a"),  # duplicate id collapses
    ]
    p = await plugin(R, d, pre_start_required=True)
    s = await emu.wait_for_resource(R)
    assert (s.capacity, s.allocatable, s.connected) == (5, 1, True)
    assert s.options.pre_start_required is True
    assert [x.id for x in s.devices if x.healthy] == ["a"]
    reg = emu.events.of_type(RegistrationEvent)[-1]
    assert reg.ok
    assert reg.dialed
    assert reg.endpoint == p.endpoint
    # every message replaces the set
    p.devices = [Dev("x"), Dev("y")]
    p.push()
    s = await emu.wait_for_resource(R, allocatable=2)
    assert [x.id for x in s.devices] == ["x", "y"]
    assert emu.events.of_type(ListAndWatchEvent)[-1].devices == 2


async def test_absent_until_first_message(emu: Emulator, plugin: PluginFactory) -> None:
    p = await plugin(R, devs(2), register=False)
    p.devices = []
    await p.register()
    await emu.wait_until(lambda: len(emu.events.of_type(ListAndWatchEvent)) == 1, 5)
    assert emu.node().resources[R].capacity == 0


async def test_stream_end_then_grace_period(dp_dir: Path) -> None:
    async with Emulator(dp_dir, control_socket=False, grace_period_s=0.3) as emu:
        p = RawPlugin(dp_dir, R, devs(3))
        await p.start()
        await emu.wait_for_resource(R, allocatable=3)
        p.end_streams()
        s = await emu.wait_for_resource(R, allocatable=0)
        assert (s.capacity, s.connected) == (3, False)
        end = emu.events.of_type(StreamEndEvent)[-1]
        assert end.disconnected
        await emu.wait_until(lambda: R not in emu.node().resources, 5)
        removed = emu.events.of_type(ResourceRemovedEvent)[-1]
        assert removed.t - end.t >= 0.29
        await p.stop()


async def test_reregistration_within_grace_restores(emu: Emulator, dp_dir: Path) -> None:
    p = RawPlugin(dp_dir, R, devs(2))
    await p.start()
    await emu.wait_for_resource(R, allocatable=2)
    await p.stop()
    await emu.wait_for_resource(R, allocatable=0)
    p2 = RawPlugin(dp_dir, R, devs(4))
    await p2.start()
    s = await emu.wait_for_resource(R, allocatable=4)
    assert s.connected
    await p2.stop()


async def test_second_registration_replaces(emu: Emulator, plugin: PluginFactory) -> None:
    await plugin(R, devs(2, "a"), name="a.sock")
    await emu.wait_for_resource(R, allocatable=2)
    b = await plugin(R, devs(3, "b"), name="b.sock")
    s = await emu.wait_for_resource(R, allocatable=3)
    assert s.endpoint == str(b.socket_path)
    assert emu.endpoint(R).socket_path == b.socket_path


async def test_old_stream_end_disconnects_new_kubernetes_121994(
    emu: Emulator, plugin: PluginFactory
) -> None:
    a = await plugin(R, devs(2, "a"), name="a.sock")
    await emu.wait_for_resource(R, allocatable=2)
    b = await plugin(R, devs(3, "b"), name="b.sock")
    await emu.wait_for_resource(R, allocatable=3)
    a.end_streams()
    s = await emu.wait_for_resource(R, allocatable=0)
    assert not s.connected
    await b.stream_closed.wait()  # the new plugin's stream was closed by the emulator


async def test_per_socket_clients_keep_new_plugin(dp_dir: Path, plugin: PluginFactory) -> None:
    async with Emulator(dp_dir, control_socket=False, per_socket_clients=True) as emu:
        a = await plugin(R, devs(2, "a"), name="a.sock")
        await emu.wait_for_resource(R, allocatable=2)
        await plugin(R, devs(3, "b"), name="b.sock")
        await emu.wait_for_resource(R, allocatable=3)
        a.end_streams()
        await emu.wait_until(lambda: len(emu.events.of_type(StreamEndEvent)) == 1, 5)
        end = emu.events.of_type(StreamEndEvent)[0]
        assert end.socket == str(a.socket_path)
        assert not end.disconnected
        s = emu.node().resources[R]
        assert (s.allocatable, s.connected) == (3, True)


async def test_kill_stream_and_endpoint_wrappers(emu: Emulator, plugin: PluginFactory) -> None:
    p = await plugin(R, devs(3), preferred_available=True)
    await emu.wait_for_resource(R, allocatable=3)
    ep = emu.endpoint(R)
    assert ep.options.get_preferred_allocation_available
    res = await ep.allocate(["d0"], ["d1", "d2"])
    assert [c.envs for c in res.containers] == [{"DEVICES": "d0"}, {"DEVICES": "d1,d2"}]
    p.preferred_fn = lambda avail, must, size: avail[:size]
    assert await ep.get_preferred_allocation(["d2", "d1"], ["d1"], 1) == ("d2",)
    assert p.calls.preferred[-1] == (["d2", "d1"], ["d1"], 1)
    await ep.pre_start(["d0"])
    assert p.calls.pre_start == [["d0"]]
    async with ep.list_and_watch() as stream:
        first = await stream.next()
        assert [d.id for d in first] == ["d0", "d1", "d2"]
    rpcs = [e.rpc for e in emu.events if e.kind == "rpc"]
    assert rpcs[:1] == ["GetDevicePluginOptions"]
    assert {"Allocate", "GetPreferredAllocation", "PreStartContainer", "ListAndWatch"} <= set(rpcs)
    ep.kill_stream()
    await emu.wait_for_resource(R, allocatable=0)


async def test_restart_wipes_sockets_and_serves_again(emu: Emulator, plugin: PluginFactory) -> None:
    p = await plugin(R, devs(2))
    await emu.wait_for_resource(R, allocatable=2)
    await emu.restart()
    assert not p.socket_path.exists()
    s = emu.node().resources[R]  # known from the checkpoint, allocatable 0
    assert (s.capacity, s.allocatable, s.connected) == (0, 0, False)
    started = emu.events.of_type(KubeletStartedEvent)
    assert [e.restart for e in started] == [False, True]
    await p.stop()
    p2 = RawPlugin(p.socket_dir, R, devs(2))
    await p2.start()
    await emu.wait_for_resource(R, allocatable=2)
    await p2.stop()


async def test_absolute_endpoint_joined_under_dir(emu: Emulator, plugin: PluginFactory) -> None:
    p = await plugin(R, devs(1), register=False)
    with pytest.raises(grpc.aio.AioRpcError):  # "/x.sock" is <dir>/x.sock, which is absent
        await p.register(endpoint=f"/{p.endpoint}x")
    await p.register(endpoint=f"sub/../{p.endpoint}")  # cleaned like filepath.Join
    s = await emu.wait_for_resource(R, allocatable=1)
    assert s.endpoint == str(p.socket_path)


async def test_message_over_4mib_ends_stream(emu: Emulator, plugin: PluginFactory) -> None:
    # contract.md#listandwatch: the kubelet keeps grpc-go's 4 MiB receive limit
    p = await plugin(R, devs(2))
    await emu.wait_for_resource(R, allocatable=2)
    p.devices = [Dev(f"{i:040d}") for i in range(80_000)]
    p.push()
    await emu.wait_for_resource(R, allocatable=0)
    end = emu.events.of_type(StreamEndEvent)[-1]
    assert end.reason.startswith("RESOURCE_EXHAUSTED")
    assert emu.node().resources[R].capacity == 2


async def test_stopped_endpoint_rpcs_raise_plugin_rpc_error(
    emu: Emulator, plugin: PluginFactory
) -> None:
    from kubedevice.errors import PluginRpcError
    from kubedevice.kubelet import RpcEvent

    p = await plugin(R, devs(2))
    await emu.wait_for_resource(R, allocatable=2)
    ep = emu.endpoint(R)
    p.end_streams()
    await emu.wait_for_resource(R, allocatable=0)
    assert ep.stopped
    for call in (
        lambda: ep.allocate(["d0"]),
        lambda: ep.get_preferred_allocation(["d0"], [], 1),
        lambda: ep.pre_start(["d0"]),
        ep.get_options,
    ):
        with pytest.raises(PluginRpcError) as err:
            await call()
        assert err.value.code == "UNAVAILABLE"
        assert err.value.details == f"endpoint {p.socket_path} has been stopped"
    with pytest.raises(PluginRpcError, match="has been stopped"):
        ep.list_and_watch()
    last = emu.events.of_type(RpcEvent)[-1]
    assert (last.rpc, last.error is not None) == ("GetDevicePluginOptions", True)


async def test_non_socket_at_kubelet_sock_is_kept(dp_dir: Path) -> None:
    (dp_dir / "kubelet.sock").write_text("not a socket")
    emu = Emulator(dp_dir, control_socket=False)
    with pytest.raises(OSError, match="exists and is not a socket"):
        await emu.start()
    assert (dp_dir / "kubelet.sock").read_text() == "not a socket"
    await emu.stop()  # nothing to stop: idempotent


async def test_restart_drops_replaced_connections_too(emu: Emulator, plugin: PluginFactory) -> None:
    # a replaced plugin's stream keeps running (contract.md#second-registration) until the
    # kubelet process goes away;
    # left running across a simulated restart, its end would disconnect a newer plugin
    a = await plugin(R, devs(2, "a"), name="a.sock")
    await emu.wait_for_resource(R, allocatable=2)
    ep_a = emu.endpoint(R)
    await plugin(R, devs(3, "b"), name="b.sock")
    await emu.wait_for_resource(R, allocatable=3)
    assert ep_a.connected
    await emu.restart()
    assert not ep_a.connected
    await asyncio.wait_for(a.stream_closed.wait(), 5)
    await plugin(R, devs(4, "c"), name="c.sock")
    s = await emu.wait_for_resource(R, allocatable=4)
    assert s.connected
    assert not any(e.disconnected for e in emu.events.of_type(StreamEndEvent))


async def test_startup_cleanup_spares_sockets_made_after_the_emulator_started(
    dp_dir: Path,
) -> None:
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(dp_dir / "stale.sock"))
    # file times have a clock tick's resolution: let one pass (a few ms at most) on
    # either side of the emulator's start
    made = (dp_dir / "stale.sock").lstat().st_ctime_ns
    while coarse_now_ns() <= made:
        time.sleep(0.001)
    emu = Emulator(dp_dir, control_socket=False, dial_timeout_s=2.0)
    while coarse_now_ns() <= emu.started_ns:
        time.sleep(0.001)
    # a plugin that started a moment after the emulator process: its socket is not stale
    p = RawPlugin(dp_dir, "example.com/race", devs(1))
    await p.serve()
    try:
        await emu.start()
        try:
            assert p.socket_path.is_socket()
            assert not (dp_dir / "stale.sock").exists()  # left by an earlier generation
            await p.register()
            s = await emu.wait_for_resource("example.com/race", allocatable=1)
            assert s.connected
            # a simulated kubelet restart still wipes every socket, as the kubelet does
            await emu.restart()
            assert not p.socket_path.exists()
        finally:
            await emu.stop()
    finally:
        stale.close()
        await p.stop()

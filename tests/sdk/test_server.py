"""PluginServer over real sockets against the kubelet double: registration, RPCs, streams."""

from __future__ import annotations

import asyncio
import logging
import os
import stat
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import grpc
import pytest
from kubelet_double import KubeletDouble
from sdk_helpers import StaticPlugin, log_event

import kubedevice
from kubedevice._api import KUBELET_SOCKET, VERSION, dp, dp_grpc

RES = "example.com/dev"


def devs(n: int, **kw: object) -> list[kubedevice.Device]:
    return [kubedevice.Device(id=f"d{i}", **kw) for i in range(n)]  # type: ignore[arg-type]


async def test_serves_before_register_and_sends_options(
    kubelet: KubeletDouble, server: kubedevice.PluginServer
) -> None:
    await server.add(StaticPlugin(devs(3)))
    await server.wait_registered(RES, timeout=10)
    (reg,) = kubelet.registrations
    assert reg.request.version == VERSION == "v1beta1"
    assert reg.request.endpoint == "example.com-dev.sock"
    assert reg.request.resource_name == RES
    # The double called GetDevicePluginOptions and read the first list inside Register.
    assert reg.options.pre_start_required is False
    assert reg.options.get_preferred_allocation_available is False
    assert reg.first_list == [("d0", "Healthy"), ("d1", "Healthy"), ("d2", "Healthy")]
    assert server.registration_count(RES) == 1
    assert server.registered(RES).is_set()


class HookedPlugin(StaticPlugin):
    async def pre_start(self, devices: Sequence[kubedevice.Device]) -> None:
        self.started = [d.id for d in devices]

    async def preferred_allocation(
        self,
        available: Sequence[kubedevice.Device],
        must_include: Sequence[kubedevice.Device],
        size: int,
    ) -> Sequence[str]:
        return ["nope", "d0", "d0"]


async def test_options_follow_overridden_hooks(
    kubelet: KubeletDouble, server: kubedevice.PluginServer, stub_for: object
) -> None:
    plugin = HookedPlugin(devs(4))
    await server.add(plugin)
    await server.wait_registered(RES, timeout=10)
    reg = kubelet.registrations[0]
    assert reg.options.pre_start_required is True
    assert reg.options.get_preferred_allocation_available is True
    assert reg.request.options == reg.options
    stub = stub_for(RES)  # type: ignore[operator]
    await stub.PreStartContainer(dp.PreStartContainerRequest(devices_ids=["d1", "d2"]))
    assert plugin.started == ["d1", "d2"]
    req = dp.PreferredAllocationRequest()
    req.container_requests.add(
        available_deviceIDs=["d0", "d1", "d2", "d3"],
        must_include_deviceIDs=["d3"],
        allocation_size=2,
    )
    resp = await stub.GetPreferredAllocation(req)
    assert list(resp.container_responses[0].deviceIDs) == ["d3", "d0"]


async def test_unadvertised_rpcs_are_unimplemented(
    kubelet: KubeletDouble, server: kubedevice.PluginServer, stub_for: object
) -> None:
    await server.add(StaticPlugin(devs(2)))
    stub = stub_for(RES)  # type: ignore[operator]
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.PreStartContainer(dp.PreStartContainerRequest(devices_ids=["d0"]))
    assert err.value.code() is grpc.StatusCode.UNIMPLEMENTED
    req = dp.PreferredAllocationRequest()
    req.container_requests.add(available_deviceIDs=["d0"], allocation_size=1)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.GetPreferredAllocation(req)
    assert err.value.code() is grpc.StatusCode.UNIMPLEMENTED


def _alloc_req(*containers: list[str]) -> dp.AllocateRequest:
    req = dp.AllocateRequest()
    for ids in containers:
        req.container_requests.add(devices_ids=ids)
    return req


async def test_default_allocate_merges_declared_artefacts(
    server: kubedevice.PluginServer, stub_for: object
) -> None:
    devices = [
        kubedevice.Device(
            id=f"d{i}",
            device_specs=(kubedevice.DeviceSpec(f"/dev/x{i}", f"/dev/x{i}", "rw"),),
            mounts=(kubedevice.Mount("/opt/lib", "/usr/lib/x", read_only=True),),
            envs={"X_VISIBLE": f"d{i}"},
            annotations={"a": "b"},
            cdi_devices=(f"example.com/dev=d{i}",),
        )
        for i in range(3)
    ]
    await server.add(StaticPlugin(devices))
    stub = stub_for(RES)  # type: ignore[operator]
    resp = await stub.Allocate(_alloc_req(["d2", "d0"], ["d1"]))
    assert len(resp.container_responses) == 2
    first = resp.container_responses[0]
    assert dict(first.envs) == {"X_VISIBLE": "d2,d0"}
    assert [d.host_path for d in first.devices] == ["/dev/x2", "/dev/x0"]
    assert [(m.container_path, m.read_only) for m in first.mounts] == [("/opt/lib", True)]
    assert dict(first.annotations) == {"a": "b"}
    assert [c.name for c in first.cdi_devices] == ["example.com/dev=d2", "example.com/dev=d0"]
    assert dict(resp.container_responses[1].envs) == {"X_VISIBLE": "d1"}


class AllocPlugin(StaticPlugin):
    async def allocate(self, devices: Sequence[kubedevice.Device]) -> kubedevice.AllocateResult:
        if devices[0].id == "d0":
            return kubedevice.DEFAULT
        if devices[0].id == "d1":
            raise RuntimeError("boom")
        return kubedevice.ContainerAllocation(envs={"IDS": ",".join(d.id for d in devices)})


async def test_allocate_hook_default_and_failure(
    server: kubedevice.PluginServer, stub_for: object
) -> None:
    await server.add(
        AllocPlugin([kubedevice.Device(id=f"d{i}", envs={"E": "v"}) for i in range(3)])
    )
    stub = stub_for(RES)  # type: ignore[operator]
    resp = await stub.Allocate(_alloc_req(["d2"]))
    assert dict(resp.container_responses[0].envs) == {"IDS": "d2"}
    resp = await stub.Allocate(_alloc_req(["d0"]))
    assert dict(resp.container_responses[0].envs) == {"E": "v"}
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Allocate(_alloc_req(["d1"]))
    assert err.value.code() is grpc.StatusCode.INTERNAL
    assert "boom" in (err.value.details() or "")
    # The daemon stays up.
    resp = await stub.Allocate(_alloc_req(["d2"]))
    assert dict(resp.container_responses[0].envs) == {"IDS": "d2"}


@pytest.mark.parametrize(
    ("containers", "needles"),
    [
        ([["d0", "zz", "yy"]], ["unknown", "'zz'", "'yy'"]),
        ([["d0", "bad"]], ["unhealthy", "'bad'"]),
        ([[]], ["no devices"]),
        ([["d0", "d1", "d0"]], ["duplicate", "'d0'"]),
        ([], ["no container requests"]),
        ([["d0"], ["zz"]], ["container request 1", "unknown", "'zz'"]),
    ],
    ids=["unknown", "unhealthy", "empty", "duplicate", "no-containers", "second-container"],
)
async def test_allocate_invalid_argument(
    server: kubedevice.PluginServer,
    stub_for: object,
    containers: list[list[str]],
    needles: list[str],
) -> None:
    devices = [*devs(2), kubedevice.Device(id="bad", health=kubedevice.Health.UNHEALTHY)]
    await server.add(StaticPlugin(devices))
    stub = stub_for(RES)  # type: ignore[operator]
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Allocate(_alloc_req(*containers))
    assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    for needle in needles:
        assert needle in (err.value.details() or "")


async def _read_until(stream: object, predicate: object, limit: int = 100) -> list[str]:
    for _ in range(limit):
        msg = await stream.read()  # type: ignore[attr-defined]
        ids = [d.ID for d in msg.devices]
        if predicate(ids):  # type: ignore[operator]
            return ids
    raise AssertionError("stream never showed the expected list")


async def test_streams_get_every_update_and_bursts_coalesce(
    server: kubedevice.PluginServer, stub_for: object
) -> None:
    plugin = StaticPlugin(devs(1))
    await server.add(plugin)
    stubs = [stub_for(RES) for _ in range(3)]  # type: ignore[operator]
    streams = [s.ListAndWatch(dp.Empty()) for s in stubs]
    for stream in streams:
        first = await stream.read()
        assert [d.ID for d in first.devices] == ["d0"]
    plugin.update(devs(2))
    for stream in streams:
        assert [d.ID for d in (await stream.read()).devices] == ["d0", "d1"]
    # A burst: every stream ends on the last list, possibly skipping some in between.
    for n in range(3, 40):
        plugin.update(devs(n))
    for stream in streams:
        assert len(await _read_until(stream, lambda ids: len(ids) == 39)) == 39
    # Health changes are sent too.
    plugin.update([kubedevice.Device(id="d0", health=kubedevice.Health.UNHEALTHY)])
    for stream in streams:
        msg = await stream.read()
        assert [(d.ID, d.health) for d in msg.devices] == [("d0", "Unhealthy")]


async def test_slow_stream_does_not_block_others(
    server: kubedevice.PluginServer, stub_for: object
) -> None:
    # Big lists so that a stream nobody reads fills its flow-control window.
    plugin = StaticPlugin([kubedevice.Device(id=f"dev-{i:058d}") for i in range(2000)])
    await server.add(plugin)
    slow = stub_for(RES).ListAndWatch(dp.Empty())  # type: ignore[operator]
    await slow.read()  # then never read again
    fast = stub_for(RES).ListAndWatch(dp.Empty())  # type: ignore[operator]
    await fast.read()
    for round_ in range(30):
        plugin.update([kubedevice.Device(id=f"r{round_}-{i:055d}") for i in range(2000)])
        ids = await asyncio.wait_for(fast.read(), 10)
        assert ids.devices[0].ID.startswith(f"r{round_}-")
    resp = await asyncio.wait_for(stub_for(RES).Allocate(_alloc_req(["r29-" + "0" * 55])), 10)  # type: ignore[operator]
    assert len(resp.container_responses) == 1
    slow.cancel()


async def test_oversize_list_is_refused_loudly(
    sock_dir: Path, caplog: pytest.LogCaptureFixture, stub_for: object
) -> None:
    async with kubedevice.PluginServer(sock_dir, max_message_bytes=2000) as server:
        plugin = StaticPlugin(devs(3))
        await server.add(plugin)
        channel = grpc.aio.insecure_channel(f"unix://{server.socket_path(RES)}")
        stream = dp_grpc.DevicePluginStub(channel).ListAndWatch(dp.Empty())
        assert len((await stream.read()).devices) == 3
        with caplog.at_level(logging.ERROR, logger="kubedevice"):
            plugin.update(devs(200))
        assert any("NOT sending the device list" in r.getMessage() for r in caplog.records)
        plugin.update(devs(4))
        assert len((await stream.read()).devices) == 4  # the oversize list was skipped
        stream.cancel()
        await channel.close()


async def test_kubelet_restart_reregisters(
    kubelet: KubeletDouble, server: kubedevice.PluginServer
) -> None:
    await server.add(StaticPlugin(devs(2)))
    await server.wait_registered(RES, timeout=10)
    await kubelet.restart()  # deletes every socket, then re-creates kubelet.sock
    await server.wait_registered(RES, count=2, timeout=10)
    regs = await kubelet.wait_registrations(2)
    assert regs[1].first_list == [("d0", "Healthy"), ("d1", "Healthy")]
    assert server.registered(RES).is_set()


async def test_kubelet_socket_recreated_only(
    kubelet: KubeletDouble, server: kubedevice.PluginServer
) -> None:
    await server.add(StaticPlugin(devs(1)))
    await server.wait_registered(RES, timeout=10)
    # A new kubelet.sock appears while our socket stays: register again.
    await kubelet.stop()
    await kubelet.start()
    await server.wait_registered(RES, count=2, timeout=10)
    assert len(await kubelet.wait_registrations(2)) == 2


async def test_a_kubelet_sock_replaced_during_the_register_is_not_a_second_kubelet(
    kubelet: KubeletDouble, server: kubedevice.PluginServer, caplog: pytest.LogCaptureFixture
) -> None:
    """As when a kubelet starts: the plugin reads the dead kubelet's stale kubelet.sock, the
    starting kubelet replaces it and answers the Register. The kubelet.sock there after the
    call is the one registered with, not a kubelet that came since (one Register, not two:
    a second one makes the kubelet drop the first stream and mark every device Unhealthy)."""
    sock = kubelet.socket

    def replaced() -> None:  # the identity read before the call is no longer there
        st = sock.stat()
        os.utime(sock, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))

    kubelet.on_register = replaced
    await server.add(StaticPlugin(devs(1)))
    await server.wait_registered(RES, timeout=10)
    # the check after the call runs before the registration is seen here
    assert not [r for r in caplog.records if "re-created" in r.getMessage()]
    assert server.registered(RES).is_set()
    kubelet.on_register = lambda: None
    # a later re-creation is still one: registered again
    await kubelet.stop()
    await kubelet.start()
    await server.wait_registered(RES, count=2, timeout=10)
    regs = await kubelet.wait_registrations(2)
    assert len(regs) == 2, regs


async def test_waits_for_missing_kubelet(sock_dir: Path, server: kubedevice.PluginServer) -> None:
    with log_event("waiting for the kubelet socket") as waiting:
        await server.add(StaticPlugin(devs(1)))
        await asyncio.wait_for(waiting.wait(), 10)
        assert not server.registered(RES).is_set()
        double = KubeletDouble(sock_dir)
        await double.start()
        try:
            await server.wait_registered(RES, timeout=10)
            assert len(await double.wait_registrations(1)) == 1
        finally:
            await double.stop()


async def test_stale_kubelet_socket(sock_dir: Path, server: kubedevice.PluginServer) -> None:
    # A socket file nobody listens on, as a killed kubelet leaves behind.
    import socket

    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(sock_dir / KUBELET_SOCKET))
    stale.close()
    with log_event("retrying in") as failed:
        await server.add(StaticPlugin(devs(1)))
        await asyncio.wait_for(failed.wait(), 10)
    assert not server.registered(RES).is_set()
    # The new kubelet wipes the directory's sockets and serves again.
    double = KubeletDouble(sock_dir)
    for entry in sock_dir.iterdir():
        entry.unlink()
    await double.start()
    try:
        await server.wait_registered(RES, timeout=10)
        assert len(await double.wait_registrations(1)) == 1
    finally:
        await double.stop()


async def test_registered_with_old_kubelet_then_wiped(
    sock_dir: Path, kubelet: KubeletDouble, server: kubedevice.PluginServer
) -> None:
    # Register with a kubelet that does not dial back, then the "new" kubelet wipes us.
    kubelet.dial_back = False
    await server.add(StaticPlugin(devs(1)))
    await server.wait_registered(RES, timeout=10)
    kubelet.dial_back = True
    await kubelet.restart()
    await server.wait_registered(RES, count=2, timeout=10)
    regs = await kubelet.wait_registrations(2)
    assert regs[1].first_list == [("d0", "Healthy")]


async def test_failed_registration_is_retried(
    kubelet: KubeletDouble, server: kubedevice.PluginServer
) -> None:
    kubelet.accept = False
    with log_event("retrying in") as failed:
        await server.add(StaticPlugin(devs(1)))
        await asyncio.wait_for(failed.wait(), 10)
    assert not server.registered(RES).is_set()
    kubelet.accept = True
    await server.wait_registered(RES, timeout=10)
    assert server.registration_count(RES) == 1


async def test_stream_closed_and_not_reopened_reregisters(
    kubelet: KubeletDouble, server: kubedevice.PluginServer
) -> None:
    await server.add(StaticPlugin(devs(1)))
    await server.wait_registered(RES, timeout=10)
    await kubelet.close_stream(RES)
    await server.wait_registered(RES, count=2, timeout=10)
    assert len(await kubelet.wait_registrations(2)) == 2


async def test_socket_mode_and_cleanup(sock_dir: Path) -> None:
    async with kubedevice.PluginServer(sock_dir) as server:
        await server.add(StaticPlugin(devs(1)))
        path = server.socket_path(RES)
        st = path.lstat()
        assert stat.S_ISSOCK(st.st_mode)
        assert stat.S_IMODE(st.st_mode) == 0o600
        await server.remove(RES)
        assert not path.exists()
        await server.add(StaticPlugin(devs(1)))
    assert not path.exists()


async def test_non_socket_path_is_refused(sock_dir: Path, server: kubedevice.PluginServer) -> None:
    path = sock_dir / "example.com-dev.sock"
    path.write_text("precious")
    with pytest.raises(kubedevice.PluginServerError, match="not a socket"):
        await server.add(StaticPlugin(devs(1)))
    assert path.read_text() == "precious"


async def test_invalid_name_refused_before_network(sock_dir: Path) -> None:
    async with kubedevice.PluginServer(sock_dir) as server:
        with pytest.raises(kubedevice.InvalidResourceNameError, match="no domain"):
            await server.add(StaticPlugin(devs(1), resource_name="gpu"))
    assert list(sock_dir.iterdir()) == []


async def test_several_plugins_add_and_remove_at_run_time(
    kubelet: KubeletDouble, server: kubedevice.PluginServer
) -> None:
    await server.add(StaticPlugin(devs(1), resource_name="example.com/a"))
    await server.add(StaticPlugin(devs(2), resource_name="example.com/b"))
    await server.wait_registered("example.com/a", timeout=10)
    await server.wait_registered("example.com/b", timeout=10)
    assert sorted(r.request.endpoint for r in kubelet.registrations) == [
        "example.com-a.sock",
        "example.com-b.sock",
    ]
    with pytest.raises(kubedevice.ConfigError, match="already served"):
        await server.add(StaticPlugin(devs(1), resource_name="example.com/a"))
    await server.remove("example.com/a")
    assert not (kubelet.directory / "example.com-a.sock").exists()
    assert server.resource_names == ("example.com/b",)
    with pytest.raises(kubedevice.ConfigError):
        await server.remove("example.com/a")
    await server.add(StaticPlugin(devs(3), resource_name="example.com/a"))
    await server.wait_registered("example.com/a", timeout=10)
    assert len(await kubelet.wait_registrations(3)) == 3


class PushPlugin(kubedevice.DevicePlugin):
    resource_name = RES


async def test_update_only_plugin(kubelet: KubeletDouble, server: kubedevice.PluginServer) -> None:
    plugin = PushPlugin()
    await server.add(plugin)
    assert not server.registered(RES).is_set()  # no list yet: not registered
    plugin.update(devs(2))
    await server.wait_registered(RES, timeout=10)
    assert kubelet.registrations[0].first_list == [("d0", "Healthy"), ("d1", "Healthy")]
    plugin.update(devs(5))
    assert len(await kubelet.wait_list(RES, lambda lst: len(lst) == 5)) == 5


async def test_metrics(kubelet: KubeletDouble, sock_dir: Path) -> None:
    metrics = kubedevice.PluginMetrics()
    async with kubedevice.PluginServer(sock_dir, metrics=metrics) as server:
        await server.add(
            StaticPlugin([*devs(2), kubedevice.Device(id="u", health=kubedevice.Health.UNHEALTHY)])
        )
        await server.wait_registered(RES, timeout=10)
        channel = grpc.aio.insecure_channel(f"unix://{server.socket_path(RES)}")
        stub = dp_grpc.DevicePluginStub(channel)
        await stub.Allocate(_alloc_req(["d0"]))
        with pytest.raises(grpc.aio.AioRpcError):
            await stub.Allocate(_alloc_req(["u"]))
        await channel.close()
        reg = metrics.registry
        lbl = {"resource": RES}
        assert reg.get_sample_value("kubedevice_plugin_registrations_total", lbl) == 1
        assert reg.get_sample_value("kubedevice_plugin_allocate_total", lbl) == 2
        assert (
            reg.get_sample_value(
                "kubedevice_plugin_allocate_errors_total", {**lbl, "code": "INVALID_ARGUMENT"}
            )
            == 1
        )
        assert reg.get_sample_value("kubedevice_plugin_allocate_seconds_count", lbl) == 2
        assert reg.get_sample_value("kubedevice_plugin_devices", {**lbl, "health": "Healthy"}) == 2
        assert (
            reg.get_sample_value("kubedevice_plugin_devices", {**lbl, "health": "Unhealthy"}) == 1
        )
        assert reg.get_sample_value("kubedevice_plugin_listandwatch_streams", lbl) == 1


async def test_device_plugin_dir_from_env(sock_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DP_DEVICE_PLUGIN_DIR", str(sock_dir))
    async with kubedevice.PluginServer() as server:
        await server.add(StaticPlugin(devs(1)))
        assert server.socket_path(RES) == sock_dir / "example.com-dev.sock"
        assert os.path.exists(sock_dir / "example.com-dev.sock")


async def test_serve_stops_cleanly(kubelet: KubeletDouble, sock_dir: Path) -> None:
    stop = asyncio.Event()
    ready = asyncio.Event()
    task = asyncio.create_task(
        kubedevice.serve(StaticPlugin(devs(1)), device_plugin_dir=sock_dir, stop=stop, ready=ready)
    )
    await ready.wait()
    await kubelet.wait_registrations(1)
    stop.set()
    await task
    assert not (sock_dir / "example.com-dev.sock").exists()


class FailingHooks(StaticPlugin):
    async def preferred_allocation(
        self,
        available: Sequence[kubedevice.Device],
        must_include: Sequence[kubedevice.Device],
        size: int,
    ) -> Sequence[str]:
        raise RuntimeError("no preference today")

    async def pre_start(self, devices: Sequence[kubedevice.Device]) -> None:
        raise RuntimeError("cannot prepare")


async def test_failing_hooks(server: kubedevice.PluginServer, stub_for: object) -> None:
    devices = [
        kubedevice.Device(id="a", numa_nodes=(0,)),
        kubedevice.Device(id="b", numa_nodes=(1,)),
        kubedevice.Device(id="c", numa_nodes=(1,)),
    ]
    await server.add(FailingHooks(devices))
    stub = stub_for(RES)  # type: ignore[operator]
    req = dp.PreferredAllocationRequest()
    req.container_requests.add(
        available_deviceIDs=["a", "b", "c"], must_include_deviceIDs=["c"], allocation_size=2
    )
    resp = await stub.GetPreferredAllocation(req)  # falls back to the default policy
    assert list(resp.container_responses[0].deviceIDs) == ["c", "b"]
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.PreStartContainer(dp.PreStartContainerRequest(devices_ids=["a"]))
    assert err.value.code() is grpc.StatusCode.INTERNAL
    assert "cannot prepare" in (err.value.details() or "")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.PreStartContainer(dp.PreStartContainerRequest(devices_ids=["a", "zz"]))
    assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "'zz'" in (err.value.details() or "")


class BrokenSource(kubedevice.DevicePlugin):
    resource_name = RES

    async def devices(self) -> AsyncIterator[Sequence[kubedevice.Device]]:
        yield devs(2)
        yield [kubedevice.Device(id="x"), kubedevice.Device(id="x")]  # duplicate: refused
        raise RuntimeError("source broke")


async def test_bad_snapshots_and_failing_source_keep_last_list(
    kubelet: KubeletDouble, server: kubedevice.PluginServer, stub_for: object
) -> None:
    with log_event("the device source failed") as failed:
        await server.add(BrokenSource())
        await asyncio.wait_for(failed.wait(), 10)
    await server.wait_registered(RES, timeout=10)
    assert kubelet.registrations[0].first_list == [("d0", "Healthy"), ("d1", "Healthy")]
    resp = await stub_for(RES).Allocate(_alloc_req(["d1"]))  # type: ignore[operator]
    assert len(resp.container_responses) == 1


async def test_metrics_over_http(kubelet: KubeletDouble, sock_dir: Path) -> None:
    import urllib.request

    from kubedevice.ports import free_port

    port = free_port()
    async with kubedevice.PluginServer(sock_dir, metrics_address=f"127.0.0.1:{port}") as server:
        await server.add(StaticPlugin(devs(2)))
        await server.wait_registered(RES, timeout=10)
        body = await asyncio.to_thread(
            lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
        )
    text = body.decode()
    assert 'kubedevice_plugin_registrations_total{resource="example.com/dev"} 1.0' in text
    assert 'kubedevice_plugin_devices{health="Healthy",resource="example.com/dev"} 2.0' in text


async def test_readded_plugin_starts_with_latest_pushed_list(
    kubelet: KubeletDouble, server: kubedevice.PluginServer
) -> None:
    plugin = PushPlugin()
    plugin.update(devs(1))
    await server.add(plugin)
    await server.wait_registered(RES, timeout=10)
    plugin.update(devs(3))
    await server.remove(RES)
    await server.add(plugin)
    await server.wait_registered(RES, timeout=10)
    regs = await kubelet.wait_registrations(2)
    assert [i for i, _ in regs[1].first_list] == ["d0", "d1", "d2"]


class DuplicateFirst(kubedevice.DevicePlugin):
    resource_name = RES

    async def devices(self) -> AsyncIterator[Sequence[kubedevice.Device]]:
        yield [kubedevice.Device(id="x"), kubedevice.Device(id="x")]
        await asyncio.Event().wait()


async def test_a_refused_first_list_stops_serve_with_the_error(sock_dir: Path) -> None:
    """Nothing to serve: the plugin must not sit there running and never registered."""
    with pytest.raises(kubedevice.ConfigError) as err:
        await asyncio.wait_for(kubedevice.serve(DuplicateFirst(), device_plugin_dir=sock_dir), 10)
    assert str(err.value) == (
        "device list of example.com/dev refused: device ID 'x' appears twice; "
        "example.com/dev cannot be served"
    )
    assert not [p for p in sock_dir.iterdir() if p.name.startswith("example.com")]


async def test_a_refused_later_list_keeps_the_last_good_one(
    kubelet: KubeletDouble, server: kubedevice.PluginServer
) -> None:
    plugin = PushPlugin()
    plugin.update(devs(2))
    await server.add(plugin)
    await server.wait_registered(RES, timeout=10)
    with pytest.raises(kubedevice.ConfigError, match="device ID 'd0' appears twice"):
        plugin.update([*devs(1), *devs(1)])
    plugin.update(devs(3))
    assert len(await kubelet.wait_list(RES, lambda lst: len(lst) == 3)) == 3


async def test_metrics_url_brackets_an_ipv6_host(sock_dir: Path) -> None:
    import socket

    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError as exc:
        pytest.skip(f"no IPv6 loopback here: {exc}")
    async with kubedevice.PluginServer(sock_dir, metrics_address="[::1]:0") as server:
        url = server.metrics_url
    assert url is not None
    assert url.startswith("http://[::1]:")
    assert url.endswith("/metrics")
    int(url.removeprefix("http://[::1]:").removesuffix("/metrics"))


class BadDeviceFirst(kubedevice.DevicePlugin):
    resource_name = RES

    async def devices(self) -> AsyncIterator[Sequence[kubedevice.Device]]:
        yield [kubedevice.Device(id="a", numa_nodes=(2**63,))]


async def test_a_source_failing_before_its_first_list_stops_serve(sock_dir: Path) -> None:
    with pytest.raises(kubedevice.PluginServerError) as err:
        await asyncio.wait_for(kubedevice.serve(BadDeviceFirst(), device_plugin_dir=sock_dir), 10)
    assert str(err.value) == (
        "the device source of example.com/dev failed before its first list: device 'a': "
        "NUMA node 9223372036854775808 is out of range: the wire carries 0 to "
        "9223372036854775807 (int64)"
    )


def test_main_exits_2_with_one_line_for_a_bad_first_list(sock_dir: Path) -> None:
    import subprocess
    import sys

    code = (
        "import kubedevice\n"
        "class P(kubedevice.DevicePlugin):\n"
        "    resource_name = 'example.com/dev'\n"
        "    def devices(self):\n"
        "        yield [kubedevice.Device(id='x'), kubedevice.Device(id='x')]\n"
        "raise SystemExit(kubedevice.main(P()))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, "--device-plugin-dir", str(sock_dir)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "ERROR" in line]
    assert len(errors) == 1, proc.stderr
    assert errors[0].endswith(
        "device list of example.com/dev refused: device ID 'x' appears twice; "
        "example.com/dev cannot be served"
    )
    assert "Traceback" not in proc.stderr


async def test_stop_does_not_wait_out_the_metrics_servers_poll_interval(
    sock_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The HTTP server's ``serve_forever`` polls for shutdown every ``poll_interval``; with an
    interval of an hour, stop() still returns: it wakes the loop instead of waiting."""
    import functools
    import socketserver

    monkeypatch.setattr(
        socketserver.BaseServer,
        "serve_forever",
        functools.partialmethod(socketserver.BaseServer.serve_forever, poll_interval=3600),
    )
    server = kubedevice.PluginServer(sock_dir, metrics_address="127.0.0.1:0")
    await server.start()
    assert server.metrics_url is not None
    await asyncio.wait_for(server.stop(), 30)
    assert server.metrics_url is None

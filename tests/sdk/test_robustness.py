"""Review findings: directory loss, shutdown races, hung kubelets, symlinks, backoff bounds."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import socket
import stat
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest
from kubelet_double import KubeletDouble
from sdk_helpers import StaticPlugin, log_event

import kubedevice
from kubedevice._api import dp, dp_grpc
from kubedevice.plugin.registration import Backoff

RES = "example.com/dev"


def devs(n: int) -> list[kubedevice.Device]:
    return [kubedevice.Device(id=f"d{i}") for i in range(n)]


@pytest.mark.parametrize("how", ["deleted", "moved-away"])
async def test_device_plugin_dir_deleted_and_recreated(sock_dir: Path, how: str) -> None:
    dp_dir = sock_dir / "dp"
    dp_dir.mkdir()
    kubelet = KubeletDouble(dp_dir)
    await kubelet.start()
    try:
        async with kubedevice.PluginServer(
            dp_dir, stream_grace=0.2, backoff_initial=0.01, backoff_max=0.2
        ) as server:
            await server.add(StaticPlugin(devs(2)))
            await server.wait_registered(RES, timeout=10)
            await kubelet.stop()
            with log_event("watching it again") as rewatched, log_event("serving on") as serving:
                if how == "deleted":
                    shutil.rmtree(dp_dir)
                else:
                    dp_dir.rename(sock_dir / "old")
                dp_dir.mkdir()
                await asyncio.wait_for(rewatched.wait(), 10)
                # The plugin serves in the new directory before any kubelet is there...
                await asyncio.wait_for(serving.wait(), 10)
            assert stat.S_IMODE(server.socket_path(RES).lstat().st_mode) == 0o600
            # ...and registers as soon as the kubelet socket appears in it.
            await kubelet.start()
            await server.wait_registered(RES, count=2, timeout=10)
            assert len(await kubelet.wait_registrations(2)) == 2
            # The new directory is watched: a kubelet restart in it is noticed too.
            await kubelet.restart()
            await server.wait_registered(RES, count=3, timeout=10)
    finally:
        await kubelet.stop()


async def test_no_retry_at_all_while_the_directory_is_gone(sock_dir: Path) -> None:
    dp_dir = sock_dir / "dp"
    dp_dir.mkdir()
    kubelet = KubeletDouble(dp_dir)
    await kubelet.start()
    try:
        async with kubedevice.PluginServer(
            dp_dir, stream_grace=0.2, backoff_initial=0.05, backoff_max=60
        ) as server:
            await server.add(StaticPlugin(devs(1)))
            await server.wait_registered(RES, timeout=10)
            await kubelet.stop()
            counter = _Count("retrying in")
            with counter, log_event("waiting for it to be re-created") as gone:
                shutil.rmtree(dp_dir)
                await asyncio.wait_for(gone.wait(), 10)
                # No bind attempt while it is gone: the watcher says when it is back.
                with log_event("serving on") as serving:
                    dp_dir.mkdir()
                    await asyncio.wait_for(serving.wait(), 10)
            assert counter.times == []
            assert not dp_dir.joinpath("kubelet.sock").exists()
    finally:
        await kubelet.stop()


async def test_a_missing_device_plugin_dir_is_waited_for_never_created(
    sock_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    dp_dir = sock_dir / "kubelet" / "device-plugins"
    caplog.set_level(logging.INFO, logger="kubedevice")
    kubelet = KubeletDouble(dp_dir)
    try:
        async with kubedevice.PluginServer(
            dp_dir, stream_grace=0.2, backoff_initial=0.01, backoff_max=0.2
        ) as server:
            await server.add(StaticPlugin(devs(2)))
            await server.add(StaticPlugin(devs(1), resource_name="example.com/other"))
            assert not (sock_dir / "kubelet").exists()  # neither it nor its parent
            with log_event("serving on") as serving:
                (sock_dir / "kubelet").mkdir()
                dp_dir.mkdir()  # what the kubelet does
                await asyncio.wait_for(serving.wait(), 10)
            await kubelet.start()
            await server.wait_registered(RES, timeout=10)
            await server.wait_registered("example.com/other", timeout=10)
            assert stat.S_IMODE(server.socket_path(RES).lstat().st_mode) == 0o600
    finally:
        await kubelet.stop()
    waiting = [r for r in caplog.records if "waiting for the kubelet to create" in r.getMessage()]
    assert len(waiting) == 1
    assert str(dp_dir) in waiting[0].getMessage()


class _Count(logging.Handler):
    """Records when kubedevice logs a message containing ``needle``; waits for a count."""

    def __init__(self, needle: str) -> None:
        super().__init__(logging.DEBUG)
        self.needle = needle
        self.times: list[float] = []
        self._changed = asyncio.Event()
        self._logger = logging.getLogger("kubedevice")

    def emit(self, record: logging.LogRecord) -> None:
        if self.needle in record.getMessage():
            self.times.append(time.monotonic())
            self._changed.set()

    def __enter__(self) -> _Count:
        self._old = self._logger.level
        self._logger.setLevel(logging.DEBUG)
        self._logger.addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        self._logger.removeHandler(self)
        self._logger.setLevel(self._old)

    async def reached(self, n: int) -> None:
        while len(self.times) < n:
            self._changed.clear()
            await self._changed.wait()

    def elapsed(self) -> float:
        return self.times[-1] - self.times[0]


async def test_stop_racing_add_leaves_no_socket(sock_dir: Path) -> None:
    server = kubedevice.PluginServer(sock_dir)
    await server.start()
    add = asyncio.create_task(server.add(StaticPlugin(devs(1))))
    stop = asyncio.create_task(server.stop())
    results = await asyncio.gather(add, stop, return_exceptions=True)
    assert results[1] is None
    if results[0] is not None:
        assert isinstance(results[0], kubedevice.PluginServerError), results[0]
    assert server.state is kubedevice.ServerState.STOPPED
    assert server.resource_names == ()
    assert not (sock_dir / "example.com-dev.sock").exists()


class _HangingKubelet(KubeletDouble):
    """A kubelet double whose Register never answers."""

    def __init__(self, directory: Path) -> None:
        super().__init__(directory)
        self.called = asyncio.Event()
        self.cancelled = asyncio.Event()

    async def _register(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        self.called.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise


async def test_stop_while_register_is_outstanding(sock_dir: Path) -> None:
    hanging = _HangingKubelet(sock_dir)
    await hanging.start()
    try:
        stop = asyncio.Event()
        ready = asyncio.Event()
        task = asyncio.create_task(
            kubedevice.serve(
                StaticPlugin(devs(1)), device_plugin_dir=sock_dir, stop=stop, ready=ready
            )
        )
        await asyncio.wait_for(hanging.called.wait(), 10)
        stop.set()
        await asyncio.wait_for(task, 5)  # far below the 10 s Register deadline
        assert not (sock_dir / "example.com-dev.sock").exists()
        await asyncio.wait_for(hanging.cancelled.wait(), 5)  # the call was cancelled
    finally:
        await hanging.stop()


async def test_symlink_at_socket_path_is_refused_and_kept(
    sock_dir: Path, server: kubedevice.PluginServer
) -> None:
    target = sock_dir / "target.sock"
    real = socket.socket(socket.AF_UNIX)
    real.bind(str(target))
    real.close()
    link = sock_dir / "example.com-dev.sock"
    link.symlink_to(target)
    with pytest.raises(kubedevice.PluginServerError, match="not a socket"):
        await server.add(StaticPlugin(devs(1)))
    assert link.is_symlink()
    assert stat.S_ISSOCK(target.lstat().st_mode)


async def test_live_socket_of_another_process_is_not_fought_over(
    kubelet: KubeletDouble, server: kubedevice.PluginServer
) -> None:
    # Rolling update: a second instance takes our socket name over while we run. We must
    # neither delete its socket (gRPC's own unlink at shutdown goes by path) nor take
    # the name back while it answers; once it is gone, we serve and register again.
    await server.add(StaticPlugin(devs(1)))
    await server.wait_registered(RES, timeout=10)
    path = server.socket_path(RES)
    other = grpc.aio.server()
    with log_event("in use by another process") as refused:
        path.unlink()
        other.add_insecure_port(f"unix:{path}")
        await other.start()
        ino = path.lstat().st_ino
        try:
            await asyncio.wait_for(refused.wait(), 10)
            assert path.lstat().st_ino == ino
            assert not server.registered(RES).is_set()
        finally:
            await other.stop(None)  # removes its socket
    await server.wait_registered(RES, count=2, timeout=10)
    assert path.lstat().st_ino != ino
    assert stat.S_ISSOCK(path.lstat().st_mode)


async def test_second_instance_takes_over_without_a_fight(
    kubelet: KubeletDouble, sock_dir: Path
) -> None:
    opts: dict[str, Any] = {"stream_grace": 0.2, "backoff_initial": 0.01, "backoff_max": 0.2}
    async with kubedevice.PluginServer(sock_dir, **opts) as old:
        await old.add(StaticPlugin(devs(1)))
        await old.wait_registered(RES, timeout=10)
        with log_event("in use by another process") as old_backs_off:
            async with kubedevice.PluginServer(sock_dir, **opts) as new:
                with log_event("taking over") as took:
                    await new.add(StaticPlugin(devs(2)))
                assert took.is_set()
                await new.wait_registered(RES, timeout=10)
                path = new.socket_path(RES)
                ino = path.lstat().st_ino
                await asyncio.wait_for(old_backs_off.wait(), 10)
                await old.remove(RES)  # the old pod goes away
                # The new instance's socket survived both, and it is still registered.
                assert path.lstat().st_ino == ino
                assert new.registered(RES).is_set()
                assert new.registration_count(RES) == 1
                assert stat.S_IMODE(path.lstat().st_mode) == 0o600
                regs = await kubelet.wait_registrations(2)
                assert [len(r.first_list) for r in regs[:2]] == [1, 2]
        assert not path.exists()


async def test_stale_socket_is_replaced(sock_dir: Path, server: kubedevice.PluginServer) -> None:
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(sock_dir / "example.com-dev.sock"))
    stale.close()
    await server.add(StaticPlugin(devs(1)))
    st = server.socket_path(RES).lstat()
    assert stat.S_ISSOCK(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o600


async def test_socket_mode_after_reregistration(
    kubelet: KubeletDouble, server: kubedevice.PluginServer
) -> None:
    old_umask = os.umask(0)
    try:
        await server.add(StaticPlugin(devs(1)))
        await server.wait_registered(RES, timeout=10)
        await kubelet.restart()
        await server.wait_registered(RES, count=2, timeout=10)
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(server.socket_path(RES).lstat().st_mode) == 0o600


@pytest.mark.parametrize("seed", range(20))
def test_backoff_never_exceeds_its_maximum(seed: int) -> None:
    import random

    random.seed(seed)
    backoff = Backoff(initial=0.1, maximum=5.0)
    delays = [backoff.next_delay() for _ in range(20)]
    assert all(0 < d <= 5.0 for d in delays), delays
    assert delays[0] <= 0.1 * 1.2
    assert delays[-1] >= 5.0 * 0.8


class GeneratorSource(kubedevice.DevicePlugin):
    resource_name = RES

    def __init__(self) -> None:
        self.go = asyncio.Event()

    async def devices(self) -> AsyncIterator[Sequence[kubedevice.Device]]:
        # A lazy iterable instead of a list: it must still be sent in full.
        yield (kubedevice.Device(id=f"g{i}") for i in range(3))  # type: ignore[misc]
        await self.go.wait()
        yield None  # type: ignore[misc]  # not a snapshot at all: refused, the source goes on
        yield [kubedevice.Device(id="g9")]


async def test_snapshot_given_as_an_iterator_is_sent_whole(
    kubelet: KubeletDouble, server: kubedevice.PluginServer
) -> None:
    plugin = GeneratorSource()
    with log_event("still serving the last good list") as refused:
        await server.add(plugin)
        await server.wait_registered(RES, timeout=10)
        assert [i for i, _ in kubelet.registrations[0].first_list] == ["g0", "g1", "g2"]
        plugin.go.set()
        await asyncio.wait_for(refused.wait(), 10)
    assert await kubelet.wait_list(RES, lambda lst: [i for i, _ in lst] == ["g9"])


async def test_metrics_address_in_use_is_a_clear_error(sock_dir: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        server = kubedevice.PluginServer(sock_dir, metrics_address=f"127.0.0.1:{port}")
        with pytest.raises(kubedevice.PluginServerError) as err:
            await server.start()
    assert str(err.value) == f"cannot serve metrics on 127.0.0.1:{port}: Address already in use"
    await server.stop()
    assert server.state is kubedevice.ServerState.STOPPED


async def test_register_has_a_deadline_and_is_retried(sock_dir: Path) -> None:
    assert kubedevice.PluginServer(sock_dir).register_timeout == 10.0  # the default
    hanging = _HangingKubelet(sock_dir)
    await hanging.start()
    try:
        async with kubedevice.PluginServer(
            sock_dir, register_timeout=0.2, backoff_initial=0.01, backoff_max=0.05
        ) as server:
            with log_event("DEADLINE_EXCEEDED") as expired:
                await server.add(StaticPlugin(devs(1)))
                await asyncio.wait_for(expired.wait(), 10)
            assert not server.registered(RES).is_set()
    finally:
        await hanging.stop()


async def test_default_message_limit_is_the_kubelets() -> None:
    assert kubedevice.PluginServer("/tmp").max_message_bytes == 4 * 1024 * 1024


async def test_reregistrations_are_counted(kubelet: KubeletDouble, sock_dir: Path) -> None:
    metrics = kubedevice.PluginMetrics()
    async with kubedevice.PluginServer(sock_dir, metrics=metrics) as server:
        await server.add(StaticPlugin(devs(1)))
        await server.wait_registered(RES, timeout=10)
        lbl = {"resource": RES}
        assert (
            metrics.registry.get_sample_value("kubedevice_plugin_reregistrations_total", lbl) == 0
        )
        await kubelet.restart()
        await server.wait_registered(RES, count=2, timeout=10)
        assert metrics.registry.get_sample_value("kubedevice_plugin_registrations_total", lbl) == 2
        assert (
            metrics.registry.get_sample_value("kubedevice_plugin_reregistrations_total", lbl) == 1
        )


class ChmoddingKubelet(KubeletDouble):
    """Changes kubelet.sock's mode while a Register call is in flight (ctime changes)."""

    async def _register(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        os.chmod(self.socket, 0o660)
        return await super()._register(request, context)


async def test_kubelet_socket_chmod_is_not_a_kubelet_restart(
    sock_dir: Path, server: kubedevice.PluginServer
) -> None:
    kubelet = ChmoddingKubelet(sock_dir)
    await kubelet.start()
    try:
        plugin = StaticPlugin(devs(1))
        await server.add(plugin)
        await server.wait_registered(RES, timeout=10)
        plugin.update(devs(2))
        assert len(await kubelet.wait_list(RES, lambda lst: len(lst) == 2)) == 2
        # A second Register to the same kubelet would disconnect us on kubelets 1.25-1.36.
        assert server.registration_count(RES) == 1
        assert len(kubelet.registrations) == 1
    finally:
        await kubelet.stop()


class ExitingHooks(kubedevice.DevicePlugin):
    """Hooks that raise SystemExit, as a library called inside a hook might."""

    resource_name = RES

    async def devices(self) -> AsyncIterator[Sequence[kubedevice.Device]]:
        yield devs(2)
        raise SystemExit(3)

    async def allocate(self, devices: Sequence[kubedevice.Device]) -> kubedevice.AllocateResult:
        raise SystemExit(4)

    async def pre_start(self, devices: Sequence[kubedevice.Device]) -> None:
        raise SystemExit(5)

    async def preferred_allocation(
        self,
        available: Sequence[kubedevice.Device],
        must_include: Sequence[kubedevice.Device],
        size: int,
    ) -> Sequence[str]:
        raise SystemExit(6)


async def test_hooks_raising_system_exit_do_not_kill_the_daemon(
    server: kubedevice.PluginServer, stub_for: Any
) -> None:
    with log_event("the device source failed") as source_failed:
        await server.add(ExitingHooks())
        await asyncio.wait_for(source_failed.wait(), 10)
    stub = stub_for(RES)
    req = dp.AllocateRequest()
    req.container_requests.add(devices_ids=["d0"])
    for _ in range(2):  # the daemon answers again after a failure
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Allocate(req)
        assert err.value.code() is grpc.StatusCode.INTERNAL
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.PreStartContainer(dp.PreStartContainerRequest(devices_ids=["d0"]))
    assert err.value.code() is grpc.StatusCode.INTERNAL
    preq = dp.PreferredAllocationRequest()
    preq.container_requests.add(available_deviceIDs=["d0", "d1"], allocation_size=1)
    resp = await stub.GetPreferredAllocation(preq)
    assert list(resp.container_responses[0].deviceIDs) == ["d0"]


class BadPreference(StaticPlugin):
    async def preferred_allocation(
        self,
        available: Sequence[kubedevice.Device],
        must_include: Sequence[kubedevice.Device],
        size: int,
    ) -> Sequence[str]:
        return ["nope", "d0", "d0"]


async def test_repaired_preferred_answer_is_logged(
    server: kubedevice.PluginServer, stub_for: Any
) -> None:
    await server.add(BadPreference(devs(3)))
    req = dp.PreferredAllocationRequest()
    req.container_requests.add(
        available_deviceIDs=["d0", "d1", "d2"], must_include_deviceIDs=["d2"], allocation_size=2
    )
    with log_event("is invalid (it must include") as repaired:
        resp = await stub_for(RES).GetPreferredAllocation(req)
    assert list(resp.container_responses[0].deviceIDs) == ["d2", "d0"]
    assert repaired.is_set()


class MustLast(StaticPlugin):
    async def preferred_allocation(
        self,
        available: Sequence[kubedevice.Device],
        must_include: Sequence[kubedevice.Device],
        size: int,
    ) -> Sequence[str]:
        return ["d0", "d2"]  # valid: the must-include ID is there, only not first


async def test_a_valid_answer_in_another_order_is_not_an_error(
    server: kubedevice.PluginServer, stub_for: Any
) -> None:
    """The conformance kit fails a plugin that logs a repair: a mere order is not one."""
    await server.add(MustLast(devs(3)))
    req = dp.PreferredAllocationRequest()
    req.container_requests.add(
        available_deviceIDs=["d0", "d1", "d2"], must_include_deviceIDs=["d2"], allocation_size=2
    )
    with log_event("is invalid") as repaired:
        resp = await stub_for(RES).GetPreferredAllocation(req)
    assert set(resp.container_responses[0].deviceIDs) == {"d0", "d2"}
    assert not repaired.is_set()


async def test_kubelet_stream_closed_while_another_client_streams_reregisters(
    kubelet: KubeletDouble, server: kubedevice.PluginServer, stub_for: Any
) -> None:
    # A monitoring tool watching our socket must not hide that the kubelet dropped us.
    await server.add(StaticPlugin(devs(1)))
    await server.wait_registered(RES, timeout=10)
    monitor = stub_for(RES).ListAndWatch(dp.Empty())
    assert [d.ID for d in (await monitor.read()).devices] == ["d0"]
    await kubelet.close_stream(RES)
    await server.wait_registered(RES, count=2, timeout=10)
    assert len(await kubelet.wait_registrations(2)) == 2
    monitor.cancel()


async def test_a_probe_stream_closing_is_not_the_kubelet_leaving(
    kubelet: KubeletDouble, sock_dir: Path
) -> None:
    # Another client's stream ends while the kubelet's stays open: no re-registration.
    # With no grace at all, a watchdog that took the probe for the kubelet would restart
    # before the two update round trips below complete.
    async with kubedevice.PluginServer(sock_dir, stream_grace=0.0) as server:
        plugin = StaticPlugin(devs(1))
        await server.add(plugin)
        await server.wait_registered(RES, timeout=10)
        async with grpc.aio.insecure_channel(f"unix://{server.socket_path(RES)}") as channel:
            probe = dp_grpc.DevicePluginStub(channel).ListAndWatch(dp.Empty())
            await probe.read()
            with log_event("ListAndWatch stream closed") as closed:
                probe.cancel()
                await asyncio.wait_for(closed.wait(), 10)
        for n in (2, 3):
            plugin.update(devs(n))
            assert len(await kubelet.wait_list(RES, lambda lst, n=n: len(lst) == n)) == n
        assert server.registration_count(RES) == 1
        assert len(kubelet.registrations) == 1


@pytest.mark.parametrize("when", ["first-serve", "after-kubelet-restart"])
async def test_socket_removed_while_its_server_starts_is_not_lost(
    kubelet: KubeletDouble, sock_dir: Path, monkeypatch: pytest.MonkeyPatch, when: str
) -> None:
    """A kubelet restart storm: our fresh socket is deleted while its gRPC server starts.

    The removal's inotify event arrives before the server counts as serving; it used to
    be dropped, and the kubelet then dialled a socket that was gone on every Register
    (DEADLINE_EXCEEDED) forever. Here the removal is delivered at exactly that moment.
    """
    import kubedevice.plugin.server as server_mod

    seen: dict[str, asyncio.Event] = {}
    armed = when == "first-serve"

    async def starting(path: Path) -> None:
        nonlocal armed
        if not armed:
            return
        armed = False
        seen[path.name] = asyncio.Event()
        path.unlink()  # as a restarting kubelet does
        await asyncio.wait_for(seen[path.name].wait(), 10)  # the server was told, and ignored it

    monkeypatch.setattr(server_mod, "_starting", starting)
    server = kubedevice.PluginServer(
        sock_dir, stream_grace=0.2, backoff_initial=0.01, backoff_max=0.2, register_timeout=1
    )
    on_change = server._on_change

    def watched(name: str) -> None:
        on_change(name)
        if name in seen:
            seen[name].set()

    monkeypatch.setattr(server, "_on_change", watched)
    async with server:
        await server.add(StaticPlugin(devs(1)))
        count = 1
        if when == "after-kubelet-restart":
            await server.wait_registered(RES, timeout=10)
            armed = True
            await kubelet.restart()
            count = 2
        await server.wait_registered(RES, count=count, timeout=10)
        assert not armed  # the removal did happen during start-up
        assert stat.S_ISSOCK(server.socket_path(RES).lstat().st_mode)
        assert kubelet.registrations[-1].first_list == [("d0", "Healthy")]


class RefusingKubelet(KubeletDouble):
    """Refuses the first ``refusals`` Register calls of each instance, naming the instance."""

    def __init__(self, directory: Path, refusals: int) -> None:
        super().__init__(directory)
        self.refusals = refusals
        self.instance = 1
        self.refused = 0

    async def _register(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        if self.refused < self.refusals:
            self.refused += 1
            await context.abort(
                grpc.StatusCode.UNAVAILABLE, f"kubelet {self.instance} not ready ({self.refused})"
            )
        return await super()._register(request, context)


class _Lines(logging.Handler):
    def __init__(self, needle: str) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []
        self.needle = needle
        self.seen = asyncio.Event()  # the SDK logs on the loop's thread

    def emit(self, record: logging.LogRecord) -> None:
        line = record.getMessage()
        self.lines.append(line)
        if self.needle in line:
            self.seen.set()


async def test_a_new_kubelet_gets_a_fresh_backoff(sock_dir: Path) -> None:
    """Failures against one kubelet back off; the first failure against a new one does not
    inherit that delay (a restart storm grew it to seconds, so resources came back late)."""
    kubelet = RefusingKubelet(sock_dir, refusals=7)
    await kubelet.start()
    lines = _Lines("kubelet 1 not ready (7); retrying in")
    logger = logging.getLogger("kubedevice")
    old_level = logger.level
    logger.addHandler(lines)
    logger.setLevel(logging.DEBUG)
    try:
        async with kubedevice.PluginServer(
            sock_dir, backoff_initial=0.01, backoff_max=5.0
        ) as server:
            await server.add(StaticPlugin(devs(1)))
            # The SDK has taken the 7th refusal (and chosen its delay), not just been sent it.
            await asyncio.wait_for(lines.seen.wait(), 30)
            kubelet.instance, kubelet.refused, kubelet.refusals = 2, 0, 1
            await kubelet.restart()
            await server.wait_registered(RES, timeout=30)
    finally:
        logger.removeHandler(lines)
        logger.setLevel(old_level)
        await kubelet.stop()

    def delay_after(needle: str) -> float:
        line = next(x for x in lines.lines if needle in x and "retrying in" in x)
        return float(line.rsplit("retrying in ", 1)[1].split()[0])

    assert delay_after("kubelet 1 not ready (7)") >= 0.01 * 2**6 * 0.8  # it did back off
    assert delay_after("kubelet 2 not ready (1)") <= 0.01 * 1.2  # and started over


async def test_plugins_of_one_server_register_over_one_channel_per_kubelet(
    sock_dir: Path,
) -> None:
    """20 plugins re-registering after a kubelet restart make one connection, not 20."""
    dp_dir = sock_dir / "dp"
    dp_dir.mkdir()
    kubelet = KubeletDouble(dp_dir)
    await kubelet.start()
    names = [f"example.com/r{i}" for i in range(20)]
    try:
        async with kubedevice.PluginServer(dp_dir, stream_grace=0.2) as server:
            for name in names:
                await server.add(StaticPlugin(devs(1), resource_name=name))
            for name in names:
                await server.wait_registered(name, timeout=10)
            assert server._kubelet_channels.created == 1
            await kubelet.restart()
            for name in names:
                await server.wait_registered(name, count=2, timeout=10)
            assert server._kubelet_channels.created == 2  # one per kubelet
            assert len(await kubelet.wait_registrations(40)) == 40
    finally:
        await kubelet.stop()

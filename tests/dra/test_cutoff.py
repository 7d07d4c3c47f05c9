"""Calls cut off by the kubelet's deadline or by a stop while a plain-``def`` hook runs in its
thread: the hook's work runs to its end and is recorded, the locks are held until then, a
retry waits for it and answers from the record; on stop, the hooks in flight get the stop
grace. The kubelet's calls are made over the driver's real socket with a gRPC deadline."""

from __future__ import annotations

import asyncio
import fcntl
import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import grpc
import pytest

import kubedevice.dra as dra
from dra import clients
from dra.api import Api
from dra.conftest import create_claim, result
from dra.fakes import DRIVER, FakeDriver, gpus, server

pytestmark = pytest.mark.timeout(60)

NS = "default"
UID_A = "0a0a0a0a-1111-4222-8333-555555555555"
UID_B = "0b0b0b0b-1111-4222-8333-555555555555"
CUT = 0.5  # the cut-off call's deadline (the kubelet's is 45 s)
TESTS = Path(__file__).resolve().parents[1]


class _Held(FakeDriver):
    """Plain-``def`` hooks (each runs in a thread); the first ``holds`` hook calls wait at
    ``gate``. Counts how many hooks run at once."""

    def __init__(self, devices: Sequence[dra.Device]) -> None:
        super().__init__(devices)
        self.loop = asyncio.get_running_loop()
        self.gate = threading.Event()
        self.holds = 0
        self.entered = asyncio.Event()
        self.inside = 0
        self.most_inside = 0
        self._count = threading.Lock()

    def _enter(self) -> None:
        with self._count:
            self.inside += 1
            self.most_inside = max(self.most_inside, self.inside)
            hold, self.holds = self.holds > 0, max(self.holds - 1, 0)
        self.loop.call_soon_threadsafe(self.entered.set)
        if hold:
            assert self.gate.wait(30)

    def _leave(self) -> None:
        with self._count:
            self.inside -= 1

    def prepare(self, claim: dra.Claim) -> Sequence[dra.PreparedDevice]:  # type: ignore[override]
        self.prepared.append(claim)
        self._enter()
        try:
            return [
                dra.PreparedDevice(d, d.device.edits if d.device else None, {"by": "hook"})
                for d in claim.devices
            ]
        finally:
            self._leave()

    def unprepare(self, claim: dra.PreparedClaim) -> None:  # type: ignore[override]
        self.unprepared.append(claim)
        self._enter()
        self._leave()


def _claim(api: Api, name: str, node: str, device: str = "gpu-0") -> tuple[str, str, str]:
    claim = create_claim(api, NS, name, results=[result("gpu", DRIVER, node, device)])
    return (NS, name, claim["metadata"]["uid"])


async def _cut_off(call: asyncio.Future[object]) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED


async def _still_waiting(call: asyncio.Future[object], seconds: float = 0.3) -> bool:
    done, _ = await asyncio.wait({call}, timeout=seconds)
    return not done


def _lock_free(path: Path) -> bool:
    """Whether another process could take the node's claims lock now."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


async def test_a_retry_waits_for_the_hook_its_cut_off_prepare_left_running(
    kdir: Path, kubeconfig: Path, node_name: str, api: Api
) -> None:
    ref = _claim(api, f"cut-{node_name}", node_name)
    uid = ref[2]
    driver = _Held(gpus(2))
    driver.holds = 1
    async with server(driver, kdir, kubeconfig, node_name) as srv:
        sock = srv.settings.dra_socket
        first = asyncio.ensure_future(clients.prepare(sock, [ref], timeout=CUT))
        await asyncio.wait_for(driver.entered.wait(), 10)
        await _cut_off(first)  # the kubelet gave up; the hook still runs in its thread
        sent = time.monotonic()
        retry = asyncio.ensure_future(clients.prepare(sock, [ref], timeout=20))
        assert await _still_waiting(retry), "the retry did not wait for the cut-off hook"
        driver.gate.set()
        hook_done = time.monotonic()
        answer = (await retry).claims[uid]
        answered = time.monotonic()
        print(
            f"\nretry waited {answered - sent:.3f} s; answered {1000 * (answered - hook_done):.1f}"
            " ms after the cut-off hook was let go"
        )
        assert answered - hook_done < 0.5  # the retry goes on as soon as the hook is recorded
        assert answer.error == ""
        assert [d.device_name for d in answer.devices] == ["gpu-0"]
        assert driver.most_inside == 1  # never two hooks at once
        assert len(driver.prepared) == 1  # the retry answered from the record
        assert driver.unprepared == []  # nothing undone, nothing left over
        assert srv.claims is not None
        recorded = srv.claims.checkpoint.claims[uid]
        assert [dict(d) for d in recorded.data] == [{"by": "hook"}]
        assert uid not in srv.claims.checkpoint.preparing
        assert srv.claims.inflight.tasks == set()


async def test_an_unprepare_waits_for_the_cut_off_prepare_and_undoes_what_it_recorded(
    kdir: Path, kubeconfig: Path, node_name: str, api: Api
) -> None:
    ref = _claim(api, f"cutun-{node_name}", node_name)
    uid = ref[2]
    driver = _Held(gpus(2))
    driver.holds = 1
    async with server(driver, kdir, kubeconfig, node_name) as srv:
        sock = srv.settings.dra_socket
        first = asyncio.ensure_future(clients.prepare(sock, [ref], timeout=CUT))
        await asyncio.wait_for(driver.entered.wait(), 10)
        await _cut_off(first)
        gone = asyncio.ensure_future(clients.unprepare(sock, [ref], timeout=20))
        assert await _still_waiting(gone), "the unprepare did not wait for the cut-off hook"
        driver.gate.set()
        assert (await gone).claims[uid].error == ""
        assert driver.most_inside == 1
        (undone,) = driver.unprepared  # what the hook made, undone with what it recorded
        assert [dict(d) for d in undone.data] == [{"by": "hook"}]
        assert srv.claims is not None
        assert uid not in srv.claims.checkpoint.claims
        assert list((kdir / "cdi").glob(f"*{uid}*")) == []


async def test_a_retry_of_a_cut_off_unprepare_waits_and_runs_no_second_hook(
    kdir: Path, kubeconfig: Path, node_name: str, api: Api
) -> None:
    ref = _claim(api, f"cutunun-{node_name}", node_name)
    uid = ref[2]
    driver = _Held(gpus(2))
    async with server(driver, kdir, kubeconfig, node_name) as srv:
        sock = srv.settings.dra_socket
        assert (await clients.prepare(sock, [ref])).claims[uid].error == ""
        driver.holds = 1
        driver.entered.clear()
        first = asyncio.ensure_future(clients.unprepare(sock, [ref], timeout=CUT))
        await asyncio.wait_for(driver.entered.wait(), 10)
        await _cut_off(first)
        retry = asyncio.ensure_future(clients.unprepare(sock, [ref], timeout=20))
        assert await _still_waiting(retry), "the retry did not wait for the cut-off hook"
        driver.gate.set()
        assert (await retry).claims[uid].error == ""
        assert len(driver.unprepared) == 1
        assert driver.most_inside == 1
        assert srv.claims is not None
        assert uid not in srv.claims.checkpoint.claims


async def test_a_retry_on_the_other_instance_waits_for_the_cut_off_hook(
    kdir: Path, kubeconfig: Path, node_name: str, api: Api
) -> None:
    """A rolling upgrade: A's call is cut off in its hook, the kubelet retries through B. B
    answers from what A recorded, once A's hook has returned; it undoes nothing.

    Run in a process of its own (``cutoff_ab.py``, whose docstring says why): one event loop
    for gRPC's process-wide poller, and a hang is a failure with the program's output at
    45 s, never pytest's timeout."""
    ref = _claim(api, f"cutab-{node_name}", node_name)
    argv = [sys.executable, "-m", "dra.cutoff_ab", str(kdir), str(kubeconfig), node_name, *ref]
    try:
        done = await asyncio.to_thread(
            subprocess.run, argv, cwd=TESTS, capture_output=True, text=True, timeout=45
        )
    except subprocess.TimeoutExpired as exc:  # killed by subprocess.run
        out = "".join(
            d.decode(errors="replace") if isinstance(d, bytes) else d or ""
            for d in (exc.stdout, exc.stderr)
        )
        pytest.fail(f"the two-instance scenario still ran after 45 s:\n{out[-4000:]}")
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    assert done.stdout.strip().endswith("ok")


async def test_a_stop_waits_for_the_hook_in_flight_and_records_it(
    kdir: Path, kubeconfig: Path, node_name: str, api: Api
) -> None:
    ref = _claim(api, f"stop-{node_name}", node_name)
    uid = ref[2]
    driver = _Held(gpus(2))
    driver.holds = 1
    srv = server(driver, kdir, kubeconfig, node_name, pod_uid=UID_A, stop_grace=20)
    async with srv:
        call = asyncio.ensure_future(clients.prepare(srv.settings.dra_socket, [ref], timeout=20))
        await asyncio.wait_for(driver.entered.wait(), 10)
        stopping = asyncio.ensure_future(srv.stop())  # SIGTERM, as the runner does
        # well past the gRPC server's old grace of 1 s: still stopping, the lock still held
        assert await _still_waiting(stopping, 1.5), "the stop did not wait for the hook"
        assert not _lock_free(srv.settings.claims_lock)
        # still registered: the kubelet drops its connections to a driver that unregisters
        assert srv.settings.registration_socket.exists()
        assert srv.settings.dra_socket.exists()
        driver.gate.set()
        await asyncio.wait_for(stopping, 10)
        assert (await call).claims[uid].error == ""  # the kubelet got its answer
    assert _lock_free(srv.settings.claims_lock)
    assert srv.claims is not None
    assert uid in srv.claims.checkpoint.claims
    assert uid not in srv.claims.checkpoint.preparing


async def test_past_the_stop_grace_the_claims_lock_stays_held_while_the_hook_runs(
    kdir: Path, kubeconfig: Path, node_name: str, api: Api
) -> None:
    ref = _claim(api, f"grace-{node_name}", node_name)
    driver = _Held(gpus(2))
    driver.holds = 1
    srv = server(driver, kdir, kubeconfig, node_name, pod_uid=UID_A, stop_grace=0.2)
    await srv.start()
    call = asyncio.ensure_future(clients.prepare(srv.settings.dra_socket, [ref], timeout=20))
    await asyncio.wait_for(driver.entered.wait(), 10)
    await asyncio.wait_for(srv.stop(), 10)  # the grace is over; the hook still runs
    with pytest.raises(grpc.aio.AioRpcError):
        await call
    try:
        assert not _lock_free(srv.settings.claims_lock)  # no other instance meets the hook
    finally:
        driver.gate.set()
        assert srv.claims is not None
        await srv.claims.inflight.drain(10)
        fd = srv.claims_lock._fd
        if fd is not None:  # held for the process life: let it go for the next test
            os.close(fd)


def test_the_stop_grace_comes_from_the_flag_or_the_environment(
    kdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kubedevice.errors import ConfigError

    def grace(**options: object) -> float:
        opts = dra.DriverOptions(node_name="n1", kubelet_dir=kdir, **options)  # type: ignore[arg-type]
        return opts.resolved(FakeDriver(())).stop_grace

    monkeypatch.delenv(dra.ENV_STOP_GRACE, raising=False)
    assert grace() == 25.0
    monkeypatch.setenv(dra.ENV_STOP_GRACE, "58")  # terminationGracePeriodSeconds 60, less 2
    assert grace() == 58.0
    assert grace(stop_grace=3) == 3.0  # the flag wins
    assert dra.options_from_args(dra.argument_parser().parse_args(["--stop-grace", "7"])) == (
        dra.DriverOptions(stop_grace=7.0)
    )
    monkeypatch.setenv(dra.ENV_STOP_GRACE, "soon")
    with pytest.raises(ConfigError, match=r"\$KUBEDEVICE_STOP_GRACE='soon' is not a number"):
        grace()
    with pytest.raises(ConfigError, match="stop grace -1"):
        grace(stop_grace=-1)


async def test_prepare_cut_unprepare_cut_prepare_again_ends_prepared_once(
    kdir: Path, kubeconfig: Path, node_name: str, api: Api
) -> None:
    """The kubelet's calls for one claim, each cut off while the first hook runs: they run
    in the order they came, one hook at a time, and the last (a prepare) wins."""
    ref = _claim(api, f"cutseq-{node_name}", node_name)
    uid = ref[2]
    driver = _Held(gpus(2))
    driver.holds = 1
    async with server(driver, kdir, kubeconfig, node_name) as srv:
        sock = srv.settings.dra_socket
        first = asyncio.ensure_future(clients.prepare(sock, [ref], timeout=CUT))
        await asyncio.wait_for(driver.entered.wait(), 10)
        await _cut_off(first)
        await _cut_off(asyncio.ensure_future(clients.unprepare(sock, [ref], timeout=0.05)))
        await _cut_off(asyncio.ensure_future(clients.prepare(sock, [ref], timeout=0.05)))
        driver.gate.set()
        assert srv.claims is not None
        assert await srv.claims.inflight.drain(10) == 0
        answer = (await clients.prepare(sock, [ref], timeout=20)).claims[uid]
        assert answer.error == ""
        assert driver.most_inside == 1
        assert (len(driver.prepared), len(driver.unprepared)) == (2, 1)
        assert uid in srv.claims.checkpoint.claims
        assert uid not in srv.claims.checkpoint.preparing
        assert srv.claims.inflight.tasks == set()
        assert srv.claims._locks == {}

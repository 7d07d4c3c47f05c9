"""Health: the policy state machine on HealthEvent values, and the event thread on the fake NVML."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterator

import pytest

from kubedevice.errors import NvmlError
from kubedevice.nvidia.backend import EventKind, GpuSample, HealthEvent
from kubedevice.nvidia.config import HealthConfig, parse_config
from kubedevice.nvidia.fake import FakeNvml
from kubedevice.nvidia.health import MIN_RECHECK_S, HealthMonitor, HealthState

A, B = "GPU-a", "GPU-b"
MIG = "MIG-a0"


def _state(**health: object) -> HealthState:
    cfg = parse_config({"version": "v1", "health": health}).health
    return HealthState(cfg, {A: A, B: B, MIG: A})


def _xid(uuid: str, xid: int) -> HealthEvent:
    return HealthEvent(EventKind.XID, uuid, xid)


def test_application_xids_are_ignored() -> None:
    state = _state()
    for xid in (13, 31, 43, 45, 68, 109):
        assert state.on_event(_xid(A, xid), 0.0) is False
    assert state.unhealthy() == {}


def test_quiet_policy_recovers_after_a_quiet_period_and_a_probe() -> None:
    state = _state(quietPeriod="10s")
    assert state.on_event(_xid(A, 48), 100.0) is True
    assert not state.healthy(A)
    assert not state.healthy(MIG)  # a GPU's MIG devices follow it
    assert state.healthy(B)  # only that GPU
    assert state.unhealthy() == {A: "XID 48", MIG: "XID 48"}
    assert state.due(109.9) == []
    state.on_event(_xid(A, 48), 105.0)  # a new event restarts the quiet period
    assert state.due(114.9) == []
    assert state.due(115.0) == [A]
    assert state.on_probe(A, False, 115.0) is False  # does not answer: another period
    assert state.next_check() == 125.0
    assert state.on_probe(A, True, 125.0) is True
    assert state.healthy(A)
    assert state.healthy(MIG)


def test_reset_policy_needs_the_gpu_to_go_away_and_come_back() -> None:
    state = _state(resetCheckInterval="5s")
    assert state.on_event(_xid(A, 79), 0.0) is True
    assert state.due(5.0) == [A]
    assert state.on_probe(A, True, 5.0) is False  # still answering: not reset yet
    assert state.on_probe(A, False, 10.0) is False  # gone (being reset)
    assert state.on_probe(A, True, 15.0) is True  # back: Healthy
    assert state.healthy(A)


def test_lost_gpu_follows_the_reset_policy() -> None:
    state = _state(resetCheckInterval="1s", quietPeriod="1s")
    state.on_event(HealthEvent(EventKind.GPU_LOST, B), 0.0)
    assert state.unhealthy() == {B: "GPU lost (fell off the bus)"}
    assert state.on_probe(B, True, 1.0) is True  # lost counts as gone: answering again heals


def test_a_stronger_policy_wins_and_configured_policies_apply() -> None:
    state = _state(xidPolicies={48: "reset"}, doubleBitEccPolicy="ignore", defaultPolicy="ignore")
    assert state.on_event(HealthEvent(EventKind.ECC_DOUBLE_BIT, A), 0.0) is False
    assert state.on_event(_xid(A, 999), 0.0) is False  # default policy: ignore
    assert state.on_event(_xid(A, 48), 0.0) is True
    assert state.on_probe(A, True, 100.0) is False  # reset policy: must go away first


def test_mig_device_event_marks_only_that_mig_device() -> None:
    state = _state()
    state.on_event(_xid(MIG, 48), 0.0)
    assert not state.healthy(MIG)
    assert state.healthy(A)
    assert state.probe_target(MIG) == A


def test_unknown_device_is_ignored(caplog: pytest.LogCaptureFixture) -> None:
    state = _state()
    for _ in range(1000):
        assert state.on_event(_xid("GPU-unknown", 48), 0.0) is False
    assert len(caplog.records) == 1  # logged once, not once per event


# ------------------------------------------------------------------ the monitor on the fake


@pytest.fixture
def fake() -> Iterator[FakeNvml]:
    nvml = FakeNvml.from_file("dgx-8gpu")
    nvml.init()
    yield nvml
    nvml.close()


class _Sink:
    def __init__(self) -> None:
        self.xids: list[tuple[str, int]] = []
        self.health: dict[str, bool] = {}

    def record_xid(self, uuid: str, xid: int) -> None:
        self.xids.append((uuid, xid))

    def set_health(self, uuid: str, healthy: bool) -> None:
        self.health[uuid] = healthy


async def test_xid_wakes_the_event_wait_then_recovers(fake: FakeNvml) -> None:
    gpus = [g.uuid for g in fake.gpus()]
    cfg = HealthConfig.from_data({"quietPeriod": 0.2})
    state = HealthState(cfg, {u: u for u in gpus})
    changes: asyncio.Queue[None] = asyncio.Queue()
    sink = _Sink()
    monitor = HealthMonitor(
        fake, state, lambda: changes.put_nowait(None), sink=sink, wait_timeout_ms=60000
    )
    await monitor.start()
    try:
        fake.inject(HealthEvent(EventKind.XID, gpus[2], 48))
        # the wait is 60 s long: only the event itself can wake it this soon (the latency
        # is measured in bench/bench_nvidia.py, not here)
        async with asyncio.timeout(1):
            await changes.get()
        assert not state.healthy(gpus[2])
        assert all(state.healthy(u) for u in gpus if u != gpus[2])
        assert sink.xids == [(gpus[2], 48)]
        assert sink.health[gpus[2]] is False
        # quiet period (0.2 s) passes, the probe answers: Healthy again, by a timer, no event
        async with asyncio.timeout(2):
            await changes.get()
        assert state.healthy(gpus[2])
        assert sink.health[gpus[2]] is True
    finally:
        t_stop = time.monotonic()
        await monitor.stop()
    assert time.monotonic() - t_stop < 0.5  # interrupt() wakes the 60 s wait at once


class _CountingNvml(FakeNvml):
    """The fake, counting the probes that failed."""

    failed_probes = 0
    three_failed = threading.Event()

    def probe(self, uuid: str) -> None:
        try:
            super().probe(uuid)
        except NvmlError:
            self.failed_probes += 1
            if self.failed_probes >= 3:
                self.three_failed.set()
            raise


async def test_lost_gpu_comes_back_after_recover() -> None:
    fake = _CountingNvml.from_file("dgx-8gpu")
    fake.three_failed = threading.Event()
    fake.init()
    gpus = [g.uuid for g in fake.gpus()]
    state = HealthState(HealthConfig.from_data({"resetCheckInterval": 0.05}), {u: u for u in gpus})
    changed = asyncio.Event()
    monitor = HealthMonitor(fake, state, changed.set, wait_timeout_ms=60000)
    await monitor.start()
    try:
        fake.set_lost(gpus[0], True)
        async with asyncio.timeout(1):
            await changed.wait()
        changed.clear()
        assert state.unhealthy() == {gpus[0]: "GPU lost (fell off the bus)"}
        # several probes fail while it is gone: still Unhealthy, nothing published
        assert await asyncio.to_thread(fake.three_failed.wait, 2.0)
        assert not state.healthy(gpus[0])
        assert not changed.is_set()
        fake.set_lost(gpus[0], False)
        async with asyncio.timeout(1):
            await changed.wait()
        assert state.healthy(gpus[0])
    finally:
        await monitor.stop()
        fake.close()


class _FailingNvml(FakeNvml):
    """The fake, with wait_event failing the way real NVML can."""

    fail: list[BaseException]

    def wait_event(self, timeout_ms: int) -> HealthEvent | None:
        if self.fail:
            raise self.fail.pop(0)
        return super().wait_event(timeout_ms)


async def test_nvml_errors_never_kill_the_thread() -> None:
    nvml = _FailingNvml.from_file("dgx-8gpu")
    nvml.init()
    gpus = [g.uuid for g in nvml.gpus()]
    nvml.fail = [
        NvmlError("GpuIsLost", "fell off", gpus[5]),  # one GPU's failure: that GPU only
        NvmlError("Unknown", "odd", gpus[6]),  # another failure on one GPU: default policy
        RuntimeError("a bug"),  # anything else: logged, the thread goes on
    ]
    state = HealthState(HealthConfig(), {u: u for u in gpus})
    changed = asyncio.Event()
    monitor = HealthMonitor(nvml, state, changed.set, wait_timeout_ms=60000)
    await monitor.start()
    try:
        async with asyncio.timeout(2):
            while set(state.unhealthy()) != {gpus[5], gpus[6]}:
                await changed.wait()
                changed.clear()
        assert state.unhealthy() == {
            gpus[5]: "GPU lost (fell off the bus)",
            gpus[6]: "NVML error",
        }
        # after the RuntimeError (1 s pause) the thread still delivers events
        nvml.inject(HealthEvent(EventKind.ECC_DOUBLE_BIT, gpus[1]))
        async with asyncio.timeout(3):
            await changed.wait()
        assert set(state.unhealthy()) == {gpus[1], gpus[5], gpus[6]}
    finally:
        await monitor.stop()
        nvml.close()


class _SampledNvml(FakeNvml):
    """The fake, telling when a GPU's readings were taken twice (two recovery probes)."""

    sampled = 0
    twice = threading.Event()

    def sample(self, uuid: str) -> GpuSample:
        self.sampled += 1
        if self.sampled >= 2:
            self.twice.set()
        return super().sample(uuid)


async def test_a_gpu_with_row_remapping_pending_stays_unhealthy() -> None:
    fake = _SampledNvml.from_file("dgx-8gpu")
    fake.twice = threading.Event()
    fake.init()
    gpus = [g.uuid for g in fake.gpus()]
    state = HealthState(HealthConfig.from_data({"quietPeriod": 0.05}), {u: u for u in gpus})
    changed = asyncio.Event()
    monitor = HealthMonitor(fake, state, changed.set, wait_timeout_ms=60000)
    await monitor.start()
    try:
        fake.set_sample(gpus[3], remapped_rows_pending=True)
        fake.inject(HealthEvent(EventKind.ECC_DOUBLE_BIT, gpus[3]))
        async with asyncio.timeout(1):
            await changed.wait()
        changed.clear()
        # two quiet periods pass, the GPU answers, but its memory needs a reset
        assert await asyncio.to_thread(fake.twice.wait, 2.0)
        assert not state.healthy(gpus[3])
        assert not changed.is_set()
        fake.set_sample(gpus[3], remapped_rows_pending=False)  # the reset happened
        async with asyncio.timeout(2):
            await changed.wait()
        assert state.healthy(gpus[3])
    finally:
        await monitor.stop()
        fake.close()


def _set_timers(state: HealthState, quiet: float, reset: float) -> None:
    """Timers below what the config accepts: the runtime must be safe with any value."""
    object.__setattr__(state.config, "quiet_period", quiet)
    object.__setattr__(state.config, "reset_check_interval", reset)


def test_a_gpu_that_stays_bad_is_probed_at_a_bounded_rate() -> None:
    state = _state()
    _set_timers(state, 0.0, 1e-9)
    state.on_event(HealthEvent(EventKind.GPU_LOST, A), 100.0)
    state.on_event(_xid(B, 48), 100.0)
    now = 100.001
    for _ in range(50):  # every probe fails: the next one is MIN_RECHECK_S later
        assert sorted(state.due(now)) == [A, B]
        assert state.on_probe(A, False, now) is False
        assert state.on_probe(B, False, now) is False
        nxt = state.next_check()
        assert nxt is not None
        assert nxt >= now + MIN_RECHECK_S
        assert state.due(now + MIN_RECHECK_S / 2) == []
        now = nxt


def test_an_xid_flood_logs_one_line_per_state_change_and_a_summary(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="kubedevice.nvidia.health")
    state = _state()
    for n in range(20_000):  # 20 s of XIDs, alternating a quiet and a reset one
        state.on_event(_xid(A, 48 if n % 2 == 0 else 79), 10.0 + n / 1000)
    for _ in range(10_000):
        state.on_event(_xid(B, 13), 10.0)  # ignored by policy
    assert state.on_probe(A, False, 40.0) is False  # fell off the bus ...
    assert state.on_probe(A, True, 71.0) is True  # ... and came back: Healthy again
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 5, lines
    assert lines[0].startswith(f"XID 48 on {A}: Unhealthy")
    assert lines[1].startswith(f"XID 79 on {A}: Unhealthy until the GPU is reset")
    assert lines[2] == f"XID 13 on {B} ignored by policy"
    assert (
        lines[3]
        == f"{A}: 19998 more health event(s) while it was Unhealthy: XID 48 x9999, XID 79 x9999"
    )
    assert lines[4] == f"{A} answers again after a reset: Healthy again"


def test_a_long_flood_is_summed_up_once_a_minute(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="kubedevice.nvidia.health")
    state = _state()
    for second in range(600):  # ten minutes, ten events a second
        for _ in range(10):
            state.on_event(_xid(A, 79), float(second))
    summaries = [r.getMessage() for r in caplog.records if "more health event" in r.getMessage()]
    assert 9 <= len(summaries) <= 10, summaries

"""Per-pod GPU metrics against the kubelet emulator's real PodResources socket."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

import kubedevice
from kubedevice.kubelet import Emulator
from kubedevice.nvidia.fake import FakeNvml
from kubedevice.nvidia.metrics import MAX_XID_LABEL, GpuMetrics

RES = "nvidia.com/gpu"
P = "kubedevice_nvidia_gpu"


class GpuIds(kubedevice.DevicePlugin):
    """Serves the given IDs as nvidia.com/gpu (the device side is not under test here)."""

    def __init__(self, ids: Sequence[str]) -> None:
        self.resource_name = RES
        self.ids = list(ids)

    async def devices(self) -> AsyncIterator[Sequence[kubedevice.Device]]:
        yield [kubedevice.Device(id=i) for i in self.ids]


def _pod(name: str, n: int, namespace: str = "ml") -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "containers": [{"name": "worker", "image": "x", "resources": {"limits": {RES: n}}}]
        },
    }


@pytest.fixture
def fake() -> Iterator[FakeNvml]:
    f = FakeNvml.from_file("dgx-8gpu")
    f.init()
    yield f
    f.close()


def _to_gpu(fake: FakeNvml) -> Callable[[str], str | None]:
    known = {g.uuid for g in fake.gpus()}

    def to_gpu(dev_id: str) -> str | None:
        uuid = dev_id.split("::", 1)[0]
        return uuid if uuid in known else None

    return to_gpu


def _value(reg: CollectorRegistry, name: str, **labels: str) -> float | None:
    return reg.get_sample_value(f"{P}_{name}", labels)


def _series(reg: CollectorRegistry, name: str) -> list[dict[str, str]]:
    return [dict(s.labels) for fam in reg.collect() for s in fam.samples if s.name == f"{P}_{name}"]


async def test_gpus_held_by_a_pod_carry_its_labels(emu: Emulator, fake: FakeNvml) -> None:
    gpus = fake.gpus()
    async with kubedevice.PluginServer(emu.device_plugin_dir) as server:
        await server.add(GpuIds([g.uuid for g in gpus]))
        await emu.wait_for_resource(RES, allocatable=8, timeout=10)
        await emu.apply_pod(_pod("train", 2))
        reg = CollectorRegistry()
        m = GpuMetrics(
            fake,
            gpus,
            emu.pod_resources_socket,
            [RES],
            _to_gpu(fake),
            registry=reg,
        )
        fake.set_sample(gpus[0].uuid, utilization_gpu=91)
        try:
            held = await asyncio.to_thread(_series, reg, "utilization_percent")
        finally:
            m.close()
    by_uuid = {s["uuid"]: s for s in held}
    assert len(by_uuid) == 8
    in_pod = [s for s in held if s["pod"] == "train"]
    assert len(in_pod) == 2
    assert all((s["namespace"], s["container"]) == ("ml", "worker") for s in in_pod)
    free = [s for s in held if s["pod"] == ""]
    assert len(free) == 6
    assert all(s["namespace"] == "" and s["container"] == "" for s in free)
    # values come from NVML (the fake): GPU 3's static reading, GPU 0's override
    reg2 = CollectorRegistry()
    m2 = GpuMetrics(fake, gpus, None, [RES], _to_gpu(fake), registry=reg2)

    def unheld(name: str, i: int) -> float | None:  # GPU i's value; no pod holds it
        return _value(reg2, name, gpu=str(i), uuid=gpus[i].uuid, namespace="", pod="", container="")

    assert unheld("utilization_percent", 0) == 91
    assert unheld("utilization_percent", 3) == 37
    assert unheld("power_watts", 3) == 312.0
    assert unheld("memory_total_bytes", 3) == gpus[3].memory_total
    assert unheld("processes", 3) == 1
    m2.close()


async def test_replicas_of_one_gpu_held_by_two_pods(emu: Emulator, fake: FakeNvml) -> None:
    gpus = fake.gpus()
    u = gpus[5].uuid
    async with kubedevice.PluginServer(emu.device_plugin_dir) as server:
        await server.add(GpuIds([f"{u}::{n}" for n in range(4)]))
        await emu.wait_for_resource(RES, allocatable=4, timeout=10)
        await emu.apply_pod(_pod("a", 1, namespace="team-a"))
        await emu.apply_pod(_pod("b", 1, namespace="team-b"))
        reg = CollectorRegistry()
        m = GpuMetrics(fake, gpus, emu.pod_resources_socket, [RES], _to_gpu(fake), registry=reg)
        try:
            series = await asyncio.to_thread(_series, reg, "temperature_celsius")
        finally:
            m.close()
    on5 = sorted((s["namespace"], s["pod"]) for s in series if s["uuid"] == u)
    assert on5 == [("team-a", "a"), ("team-b", "b")]


def test_sweeps_at_most_once_per_interval(fake: FakeNvml) -> None:
    now = [100.0]
    calls = []
    gpus = fake.gpus()

    class Counting(FakeNvml):
        def sample(self, uuid: str):  # type: ignore[no-untyped-def]
            calls.append(uuid)
            return fake.sample(uuid)

    backend = Counting(fake.machine)
    reg = CollectorRegistry()
    m = GpuMetrics(backend, gpus, None, [RES], _to_gpu(fake), registry=reg, clock=lambda: now[0])
    generate_latest(reg)
    generate_latest(reg)
    now[0] += 0.5
    generate_latest(reg)
    assert m.sweeps == 1
    assert len(calls) == 8
    now[0] += 0.6
    generate_latest(reg)
    assert m.sweeps == 2
    assert len(calls) == 16
    m.close()
    backend.close()


def test_health_and_xid_counter(fake: FakeNvml) -> None:
    gpus = fake.gpus()
    reg = CollectorRegistry()
    m = GpuMetrics(fake, gpus, None, [RES], _to_gpu(fake), registry=reg)
    lv = {"gpu": "2", "uuid": gpus[2].uuid, "namespace": "", "pod": "", "container": ""}
    assert _value(reg, "healthy", **lv) == 1
    m.set_health(gpus[2].uuid, False)
    m.record_xid(gpus[2].uuid, 79)
    m.record_xid(gpus[2].uuid, 79)
    m.record_xid(gpus[2].uuid, 48)
    assert _value(reg, "healthy", **lv) == 0
    # a GPU whose MPS daemon died (sharing.mps) is unhealthy too, whatever NVML says
    l3 = {**lv, "gpu": "3", "uuid": gpus[3].uuid}
    m.set_mps_faults({gpus[3].uuid})
    assert _value(reg, "healthy", **l3) == 0
    m.set_health(gpus[3].uuid, True)
    assert _value(reg, "healthy", **l3) == 0
    m.set_mps_faults(())
    assert _value(reg, "healthy", **l3) == 1
    xl = {"gpu": "2", "uuid": gpus[2].uuid}
    assert _value(reg, "xid_errors_total", xid="79", **xl) == 2
    assert _value(reg, "xid_errors_total", xid="48", **xl) == 1
    m.close()
    assert _value(reg, "healthy", **lv) is None  # unregistered


def test_not_supported_values_are_absent_and_lost_gpu_keeps_health() -> None:
    f = FakeNvml.from_file("h200")
    f.init()
    gpus = f.gpus()
    reg = CollectorRegistry()
    m = GpuMetrics(f, gpus, None, [RES], lambda d: d, registry=reg, min_interval_s=0)
    lv = {"gpu": "0", "uuid": gpus[0].uuid, "namespace": "", "pod": "", "container": ""}
    assert _value(reg, "temperature_celsius", **lv) == 35
    assert _value(reg, "power_watts", **lv) is None  # not recorded: NotSupported, no series
    f.set_lost(gpus[0].uuid, True)
    assert _value(reg, "temperature_celsius", **lv) is None
    assert _value(reg, "healthy", **lv) == 1  # health is the health code's call
    m.close()
    f.close()


def test_load_recording_shows_utilization_during_the_workload() -> None:
    now = [0.0]
    f = FakeNvml.from_file("h200-load", clock=lambda: now[0])
    f.init()
    gpus = f.gpus()
    reg = CollectorRegistry()
    m = GpuMetrics(f, gpus, None, [RES], lambda d: d, registry=reg, min_interval_s=0)
    lv = {"gpu": "0", "uuid": gpus[0].uuid, "namespace": "", "pod": "", "container": ""}
    assert _value(reg, "utilization_percent", **lv) == 0
    now[0] = 6.0
    assert _value(reg, "utilization_percent", **lv) == 98
    assert _value(reg, "power_watts", **lv) == pytest.approx(692.588)
    m.close()
    f.close()


def test_pod_resources_down_gives_empty_pod_labels(fake: FakeNvml, sock_dir: Path) -> None:
    gpus = fake.gpus()
    reg = CollectorRegistry()
    m = GpuMetrics(
        fake,
        gpus,
        sock_dir / "absent.sock",
        [RES],
        _to_gpu(fake),
        registry=reg,
        pod_resources_timeout_s=0.2,
    )
    series = _series(reg, "healthy")
    assert len(series) == 8
    assert all(s["pod"] == "" for s in series)
    m.close()


def test_xid_series_stay_bounded_whatever_the_codes(fake: FakeNvml) -> None:
    gpus = fake.gpus()
    reg = CollectorRegistry()
    m = GpuMetrics(fake, gpus, None, [RES], _to_gpu(fake), registry=reg)
    try:
        for code in range(50_000):
            m.record_xid(gpus[0].uuid, code)
        m.record_xid(gpus[0].uuid, -1)
        series = _series(reg, "xid_errors_total")
        other = _value(reg, "xid_errors_total", gpu="0", uuid=gpus[0].uuid, xid="other")
        xid79 = _value(reg, "xid_errors_total", gpu="0", uuid=gpus[0].uuid, xid="79")
    finally:
        m.close()
    assert len(series) == MAX_XID_LABEL + 2  # 0..255 by value, plus "other"
    assert other == 50_000 - (MAX_XID_LABEL + 1) + 1
    assert xid79 == 1

"""The fake NVML backend: recordings and synthetic machines load, events wake a blocked waiter."""

from __future__ import annotations

import json
import os
import socket
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubedevice.errors import ConfigError, NvmlError
from kubedevice.nvidia.backend import EventKind, HealthEvent, NvmlBackend, P2PLevel
from kubedevice.nvidia.backends import open_backend
from kubedevice.nvidia.fake import (
    MACHINES_DIR,
    FakeNvml,
    load_machine,
    machine_names,
    send_control,
    write_fake_dev,
    write_fake_sysfs,
)

H200_UUID = "GPU-f4dbb85b-ebba-a991-2244-5b8da5b87ae6"
LOAD_UUID = "GPU-03652e89-f5a3-ad1f-63f3-8808394dc029"


@pytest.fixture
def dgx() -> Iterator[FakeNvml]:
    f = FakeNvml.from_file("dgx-8gpu", control_socket=None)
    f.init()
    try:
        yield f
    finally:
        f.close()


def test_packaged_machines_all_load() -> None:
    names = machine_names()
    for want in ("h200", "h200-load", "dgx-8gpu", "pcie-4gpu", "mig-mixed", "gpu-lost"):
        assert want in names
    for n in names:
        assert load_machine(n).name == n


def test_h200_recording_loads_as_recorded() -> None:
    f = FakeNvml.from_file("h200")
    driver = f.init()
    assert (driver.driver_version, driver.cuda_version) == ("580.159.04", "13.0")
    assert driver.nvml_version == "13.580.159.04"
    (gpu,) = f.gpus()
    assert gpu.uuid == H200_UUID
    assert gpu.name == "NVIDIA H200"
    assert gpu.memory_total == 150754820096
    assert gpu.pci_bus_id == "0000:00:06.0"
    assert gpu.compute_capability == (9, 0)
    assert (gpu.architecture, gpu.brand) == ("hopper", "nvidia")
    assert gpu.mig_capable
    assert not gpu.mig_enabled
    assert f.mig_devices(gpu.uuid) == []
    # numa_node answered NotSupported and sysfs said -1: no NUMA node.
    assert f.machine.gpus[0].numa_node is None
    s = f.sample(gpu.uuid)
    assert s.temperature_c == 35
    assert s.memory_used == 644939776
    assert s.remapped_rows_pending is False
    assert s.remapped_rows_failure is False
    # Not recorded: NotSupported is None, never an error.
    assert s.power_mw is None
    assert s.utilization_gpu is None
    assert "/dev/nvidia-caps/nvidia-cap1" in f.machine.dev_nodes
    f.close()


def test_load_recording_plays_a_timeline() -> None:
    now = [0.0]
    f = FakeNvml.from_file("h200-load", clock=lambda: now[0])
    f.init()
    (gpu,) = f.gpus()
    assert gpu.uuid == LOAD_UUID  # the identity of the machine it was recorded on
    idle = f.sample(gpu.uuid)
    assert idle.utilization_gpu == 0
    now[0] = 5.6  # 0.5 s steps: sample 11 of the recording, the workload running
    busy = f.sample(gpu.uuid)
    assert busy.utilization_gpu == 98
    assert busy.power_mw == 532643
    assert busy.processes[0].pid == 429
    assert busy.processes[0].used_memory == 966 * 1024 * 1024
    assert busy.memory_total == gpu.memory_total
    # the base recording's values fill what the load samples lack
    assert busy.remapped_rows_failure is False
    f.close()


def test_base_plus_load_keeps_the_base_identity() -> None:
    m = load_machine("h200+h200-load")
    assert m.gpus[0].info.uuid == H200_UUID
    assert len(m.gpus[0].timeline) == 23


def test_synthetic_dgx_topology(dgx: FakeNvml) -> None:
    gpus = dgx.gpus()
    assert [g.index for g in gpus] == list(range(8))
    u = [g.uuid for g in gpus]
    assert dgx.link(u[0], u[1]).nvlinks == 18  # type: ignore[union-attr]
    assert dgx.link(u[0], u[1]).level == P2PLevel.SINGLE  # type: ignore[union-attr]
    assert dgx.link(u[0], u[2]).level == P2PLevel.NODE  # type: ignore[union-attr]
    assert dgx.link(u[0], u[5]).level == P2PLevel.SYSTEM  # type: ignore[union-attr]
    assert dgx.link(u[0], u[5]).nvlinks == 0  # type: ignore[union-attr]
    assert dgx.link(u[5], u[6]).nvlinks == 6  # type: ignore[union-attr]
    assert dgx.link(u[0], u[4]).nvlinks == 2  # type: ignore[union-attr]
    assert [g.numa_node for g in dgx.machine.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    with pytest.raises(NvmlError) as e:
        dgx.link(u[0], u[0])
    assert e.value.code == "InvalidArgument"


def test_mig_mixed_profiles_and_caps() -> None:
    f = FakeNvml.from_file("mig-mixed")
    f.init()
    gpus = f.gpus()
    profiles = {g.index: [m.profile for m in f.mig_devices(g.uuid)] for g in gpus}
    assert profiles[0] == ["3g.71gb", "2g.35gb", "1g.18gb", "1g.18gb"]
    assert profiles[1] == ["4g.71gb", "3g.71gb"]
    assert profiles[2] == []  # MIG capable, MIG disabled: a whole GPU
    assert "1g.35gb" in profiles[3]
    m = f.mig_devices(gpus[0].uuid)[0]
    assert m.parent_uuid == gpus[0].uuid
    assert m.uuid.startswith("MIG-")
    assert len(m.cap_minors) == 2
    assert f.sample(m.uuid).memory_total == m.memory_total
    f.close()


def test_calls_before_init_and_unknown_uuid_raise() -> None:
    f = FakeNvml.from_file("pcie-4gpu")
    with pytest.raises(NvmlError) as e:
        f.gpus()
    assert e.value.code == "Uninitialized"
    f.init()
    with pytest.raises(NvmlError) as e:
        f.sample("GPU-nope")
    assert e.value.code == "NotFound"
    assert e.value.uuid == "GPU-nope"
    f.close()


def test_no_driver_machine_fails_init() -> None:
    f = open_backend("fake:no-driver")
    with pytest.raises(NvmlError) as e:
        f.init()
    assert e.value.code == "DriverNotLoaded"


def test_fake_is_an_nvml_backend(dgx: FakeNvml) -> None:
    assert isinstance(dgx, NvmlBackend)


def test_wait_event_times_out_and_interrupt_wakes_it(dgx: FakeNvml) -> None:
    t = time.monotonic()
    assert dgx.wait_event(50) is None
    assert time.monotonic() - t >= 0.045
    done = threading.Event()
    result: list[object] = []

    def waiter() -> None:
        result.append(dgx.wait_event(30_000))
        done.set()

    th = threading.Thread(target=waiter)
    th.start()
    time.sleep(0.05)  # let it block (the assertion below does not depend on it)
    t = time.monotonic()
    dgx.interrupt()
    assert done.wait(5)
    th.join()
    assert result == [None]
    assert time.monotonic() - t < 1.0


def test_injected_xid_wakes_a_blocked_waiter_and_unwatched_is_dropped(dgx: FakeNvml) -> None:
    u = [g.uuid for g in dgx.gpus()]
    dgx.watch(u[:2])
    dgx.inject(HealthEvent(EventKind.XID, u[5], xid=79))  # not watched: dropped, as NVML does
    got: list[HealthEvent | None] = []
    th = threading.Thread(target=lambda: got.append(dgx.wait_event(30_000)))
    th.start()
    t = time.monotonic()
    dgx.inject(HealthEvent(EventKind.XID, u[1], xid=79))
    th.join(5)
    assert not th.is_alive()
    ev = got[0]
    assert ev is not None
    assert ev.kind is EventKind.XID
    assert ev.uuid == u[1]
    assert ev.xid == 79
    assert ev.monotonic >= t
    assert dgx.wait_event(0) is None


def test_set_lost_makes_calls_fail_and_delivers_an_event(dgx: FakeNvml) -> None:
    u = dgx.gpus()[2].uuid
    dgx.watch([u])
    dgx.set_lost(u, True)
    ev = dgx.wait_event(1000)
    assert ev is not None
    assert ev.kind is EventKind.GPU_LOST
    assert ev.uuid == u
    for call in (dgx.probe, dgx.sample, dgx.mig_devices):
        with pytest.raises(NvmlError) as e:
            call(u)
        assert e.value.code == "GpuIsLost"
        assert e.value.uuid == u
    dgx.set_lost(u, False)
    dgx.probe(u)
    # watching a lost GPU reports it lost at once instead of failing the whole watch
    dgx.set_lost(u, True)
    dgx.watch([u, dgx.gpus()[0].uuid])
    ev = dgx.wait_event(1000)
    assert ev is not None
    assert ev.kind is EventKind.GPU_LOST


def test_set_sample_overrides(dgx: FakeNvml) -> None:
    u = dgx.gpus()[0].uuid
    dgx.set_sample(u, utilization_gpu=77, processes=[{"pid": 9, "used_memory": 1}])
    s = dgx.sample(u)
    assert s.utilization_gpu == 77
    assert s.processes[0].pid == 9
    assert s.memory_total == dgx.gpus()[0].memory_total
    with pytest.raises(ConfigError, match="bogus"):
        dgx.set_sample(u, bogus=1)


def test_control_socket_cross_process(sock_dir: Path) -> None:
    path = sock_dir / "ctl.sock"
    f = FakeNvml.from_file("dgx-8gpu", control_socket=path)
    f.init()
    try:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        u = [g.uuid for g in f.gpus()]
        f.watch(u)
        got: list[HealthEvent | None] = []
        th = threading.Thread(target=lambda: got.append(f.wait_event(30_000)))
        th.start()
        send_control(path, {"op": "xid", "uuid": u[3], "xid": 48})
        th.join(5)
        assert got
        assert got[0] is not None
        assert (got[0].uuid, got[0].xid) == (u[3], 48)
        # bad messages are ignored with a warning; the next good one still works
        send_control(path, {"op": "explode", "uuid": u[3]})
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as raw:
            for junk in (b"[" * 50_000, b"\xff\xfe", b'{"op": "xid", "xid": ' + b"9" * 5000 + b"}"):
                raw.sendto(junk, str(path))
        send_control(path, {"op": "ecc", "uuid": u[4]})
        ev = f.wait_event(5000)
        assert ev is not None
        assert ev.kind is EventKind.ECC_DOUBLE_BIT
        assert ev.uuid == u[4]
        send_control(path, {"op": "sample", "uuid": u[0], "values": {"utilization_gpu": 55}})
        send_control(path, {"op": "lost", "uuid": u[1]})
        ev = f.wait_event(5000)
        assert ev is not None
        assert ev.kind is EventKind.GPU_LOST
        assert ev.uuid == u[1]
        assert f.sample(u[0]).utilization_gpu == 55
        send_control(path, {"op": "recover", "uuid": u[1]})
        assert f.wait_event(100) is None  # drains the datagram; recovering sends no event
        f.probe(u[1])
    finally:
        f.close()
    assert not path.exists()


def test_control_socket_from_env(sock_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = sock_dir / "env.sock"
    monkeypatch.setenv("KUBEDEVICE_FAKE_NVML_CONTROL", str(path))
    f = FakeNvml.from_file("pcie-4gpu")
    f.init()
    try:
        assert path.exists()
    finally:
        f.close()


def test_mig_device_event_is_delivered_when_parent_watched() -> None:
    f = FakeNvml.from_file("mig-mixed")
    f.init()
    gpu = f.gpus()[0]
    mig = f.mig_devices(gpu.uuid)[1]
    f.watch([gpu.uuid])
    f.apply_control({"op": "xid", "uuid": mig.uuid, "xid": 94})
    ev = f.wait_event(1000)
    assert ev is not None
    assert ev.uuid == mig.uuid
    assert ev.xid == 94
    with pytest.raises(ConfigError, match="MIG device"):
        f.apply_control({"op": "lost", "uuid": mig.uuid})
    f.close()


def test_gpu_lost_machine_script_falls_off_after_watch() -> None:
    f = FakeNvml.from_file("gpu-lost")
    f.init()
    u = [g.uuid for g in f.gpus()]
    f.probe(u[1])
    t = time.monotonic()
    f.watch(u)
    ev = f.wait_event(10_000)
    elapsed = time.monotonic() - t
    assert ev is not None
    assert ev.kind is EventKind.GPU_LOST
    assert ev.uuid == u[1]
    assert 1.9 <= elapsed < 5.0
    with pytest.raises(NvmlError):
        f.probe(u[1])
    f.probe(u[0])
    f.close()


def test_write_fake_sysfs_and_dev(tmp_path: Path) -> None:
    m = load_machine("dgx-8gpu")
    write_fake_sysfs(m, tmp_path / "sys")
    node = tmp_path / "sys/bus/pci/devices/0000:9a:00.0/numa_node"
    assert node.read_text().strip() == "1"
    h = load_machine("h200")
    write_fake_sysfs(h, tmp_path / "sys2")
    assert (tmp_path / "sys2/bus/pci/devices/0000:00:06.0/numa_node").read_text().strip() == "-1"
    made = write_fake_dev(load_machine("mig-mixed"), tmp_path / "dev")
    names = {p.relative_to(tmp_path / "dev").as_posix() for p in made}
    assert {"nvidiactl", "nvidia-uvm", "nvidia0", "nvidia3"} <= names
    assert any(n.startswith("nvidia-caps/nvidia-cap") for n in names)
    made = write_fake_dev(h, tmp_path / "dev2")
    assert (tmp_path / "dev2/nvidia-caps/nvidia-cap2").is_file()


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"\xff\xfe{}", "not UTF-8 text"),
        (b'{"gpus": ' + b"[" * 100_000, "nested too deeply"),
        (b'{"gpus": [{"index": ' + b"9" * 5000 + b"}]}", "not usable JSON"),
    ],
)
def test_hostile_machine_file_is_one_line(tmp_path: Path, content: bytes, says: str) -> None:
    p = tmp_path / "hostile.json"
    p.write_bytes(content)
    with pytest.raises(ConfigError) as e:
        load_machine(p)
    assert says in str(e.value)
    assert str(e.value).startswith(f"{p}: ")
    assert "\n" not in str(e.value)
    assert len(str(e.value)) < 300


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        ({"format": "kubedevice-fake-nvml/v1", "driver": {}, "gpus": []}, "driver.version"),
        (
            {
                "format": "kubedevice-fake-nvml/v1",
                "driver": {"version": "1", "cuda": "1", "nvml": "1"},
                "gpus": [{"uuid": "nope", "name": "x"}],
            },
            "gpus.0.uuid",
        ),
        ({"gpus": []}, "not a fake NVML machine"),
    ],
)
def test_bad_synthetic_file_names_the_field(
    tmp_path: Path, doc: dict[str, object], field: str
) -> None:
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(ConfigError) as e:
        load_machine(p)
    assert field in str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("gpu", "takes"),
    [(1, "uuid"), (1, "mig"), (2, "pci_bus_id")],
    ids=["gpu-uuid", "mig-uuid", "bus-id"],
)
def test_synthetic_file_with_a_duplicate_names_it_in_one_line(
    tmp_path: Path, gpu: int, takes: str
) -> None:
    doc = json.loads((MACHINES_DIR / "mig-mixed.json").read_text())
    first = doc["gpus"][0]
    if takes == "mig":  # two MIG devices (of different GPUs) with one UUID
        migs = [m for g in doc["gpus"] for m in g.get("mig_devices", [])]
        migs[-1]["uuid"] = migs[0]["uuid"]
        field, value = "uuid", migs[0]["uuid"]
    else:
        doc["gpus"][gpu][takes] = first[takes]
        field, value = takes, first[takes]
    p = tmp_path / "dup.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(ConfigError) as e:
        load_machine(p)
    assert str(e.value) == f"{p}: gpus: duplicate {field} {value!r}"


def test_open_backend_specs() -> None:
    assert isinstance(open_backend("fake:dgx-8gpu"), FakeNvml)
    assert isinstance(open_backend(f"fake:{MACHINES_DIR / 'pcie-4gpu.json'}"), FakeNvml)
    assert isinstance(open_backend("fake:machines/h200.json+h200-load.json"), FakeNvml)
    for bad in ("", "fake:", "gpu", "fake:no-such-machine"):
        with pytest.raises(ConfigError):
            open_backend(bad)


def test_watch_accepts_a_mig_uuid_for_its_parent() -> None:
    f = FakeNvml.from_file("mig-mixed")
    f.init()
    gpu = f.gpus()[1]
    mig = f.mig_devices(gpu.uuid)[0]
    f.watch([mig.uuid])
    f.inject(HealthEvent(EventKind.XID, gpu.uuid, xid=79))
    ev = f.wait_event(1000)
    assert ev is not None
    assert ev.uuid == gpu.uuid
    f.close()


def test_control_messages_of_the_wrong_type_are_refused_with_one_line(
    sock_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = sock_dir / "ctl.sock"
    f = FakeNvml.from_file("dgx-8gpu", control_socket=path)
    f.init()
    try:
        u = [g.uuid for g in f.gpus()]
        f.watch(u)
        bad = [
            {"op": "sample", "uuid": u[0], "values": {"utilization_gpu": "busy"}},
            {"op": "sample", "uuid": u[0], "values": {"processes": [1, 2]}},
            {"op": "sample", "uuid": u[0], "values": {"processes": [{"pid": "x"}]}},
            {"op": "sample", "uuid": u[0], "values": {"remapped_rows_pending": 3}},
            {"op": "sample", "uuid": u[0], "values": {"power_mw": 10**30}},
            {"op": "xid", "uuid": ["not", "hashable"], "xid": 48},
            {"op": ["x"], "uuid": u[0]},
            {"op": "xid", "uuid": u[0], "xid": True},
            {"op": "sample", "uuid": u[0], "values": ["utilization_gpu"]},
        ]
        for message in bad:
            send_control(path, message)
        send_control(path, {"op": "xid", "uuid": u[2], "xid": 79})
        ev = f.wait_event(5000)  # the event thread's wait drains them all, and lives on
        assert ev is not None
        assert (ev.uuid, ev.xid) == (u[2], 79)
        sample = f.sample(u[0])
        assert sample.utilization_gpu is None or isinstance(sample.utilization_gpu, int)
        assert sample.processes == f.machine.gpus[0].sample.processes
    finally:
        f.close()
    ignored = [
        r.getMessage() for r in caplog.records if "control message ignored" in r.getMessage()
    ]
    assert len(ignored) == len(bad), ignored
    assert all("\n" not in line and "Traceback" not in line for line in ignored)
    assert "values: utilization_gpu: expected a non-negative integer or null" in ignored[0]
    assert not any(r.exc_info for r in caplog.records)


def test_recording_with_a_bad_or_duplicate_device_names_the_field(tmp_path: Path) -> None:
    raw = json.loads((MACHINES_DIR / "h200.json").read_text())
    cases = [
        (
            {"minor": "zero"},
            "devices[0].minor: bad value in an NVML recording: expected an integer",
        ),
        ({"pci": "x"}, "devices[0].pci: bad value in an NVML recording: expected an object"),
        ({"uuid": None, "name": None}, None),
    ]
    for change, says in cases[:2]:
        doc = json.loads(json.dumps(raw))
        doc["devices"][0].update(change)
        p = tmp_path / "rec.json"
        p.write_text(json.dumps(doc))
        with pytest.raises(ConfigError) as e:
            load_machine(p)
        assert str(e.value).startswith(f"{p}: {says}")
        assert "\n" not in str(e.value)
    doc = json.loads(json.dumps(raw))
    del doc["devices"][0]["minor"]
    p.write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match=r"devices\[0\]\.minor: 'minor' is missing"):
        load_machine(p)
    doc = json.loads(json.dumps(raw))
    doc["devices"].append(dict(doc["devices"][0], index=1, minor=1))
    p.write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match="devices: duplicate uuid 'GPU-"):
        load_machine(p)


def test_a_directory_is_not_a_machine_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="fake NVML machine '/etc': a directory"):
        load_machine("/etc")
    with pytest.raises(ConfigError, match="a directory"):
        open_backend(f"fake:{tmp_path}")

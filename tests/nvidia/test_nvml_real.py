"""nvml_real against a stand-in pynvml module (no GPU here): error mapping, MIG, links, events."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kubedevice.errors import NvmlError
from kubedevice.nvidia.backend import EventKind, NvmlBackend, P2PLevel
from kubedevice.nvidia.backends import open_backend
from kubedevice.nvidia.fake import load_machine
from kubedevice.nvidia.nvml_real import RealNvml, mig_profile_name

from .stand_in_pynvml import NOT_SUPPORTED, GpuSpec, MigSpec, make_module

U0 = "GPU-00000000-aaaa-bbbb-cccc-000000000000"
U1 = "GPU-11111111-aaaa-bbbb-cccc-111111111111"
U2 = "GPU-22222222-aaaa-bbbb-cccc-222222222222"
M0 = "MIG-00000000-aaaa-bbbb-cccc-000000000000"
M1 = "MIG-11111111-aaaa-bbbb-cccc-111111111111"
B0, B1, B2 = "00000000:18:00.0", "00000000:2A:00.0", "00000000:9A:00.0"
H200_TOTAL = 150754820096


def _machine() -> list[GpuSpec]:
    return [
        GpuSpec(uuid=U0, bus=B0, minor=0, nvlink_remote=(B1, B1)),
        GpuSpec(
            uuid=U1,
            bus=B1,
            minor=1,
            name=b"NVIDIA H200",  # old pynvml: bytes
            memory_total=H200_TOTAL,
            mig_mode=(1, 1),
            mig=[
                MigSpec(M0, gi=2, ci=0, gi_slices=3, ci_slices=3, memory_mib=70656),
                MigSpec(M1, gi=9, ci=0, gi_slices=1, ci_slices=1, memory_mib=17920),
            ],
            nvlink_remote=(B0, B0),
        ),
        GpuSpec(
            uuid=U2,
            bus=B2,
            minor=2,
            name="NVIDIA L40S",
            cc=(8, 9),
            arch=8,
            mig_mode=NOT_SUPPORTED,
            power=NOT_SUPPORTED,
            remapped=NOT_SUPPORTED,
            ecc=NOT_SUPPORTED,
            serial=NOT_SUPPORTED,
            procs=((77, None), (78, 1 << 30)),
            nvlink_remote=NOT_SUPPORTED,
            events=NOT_SUPPORTED,
        ),
    ]


@pytest.fixture
def nv(monkeypatch: pytest.MonkeyPatch) -> Any:
    mod = make_module(
        _machine(),
        ancestors={
            frozenset((U0, U1)): 10,
            frozenset((U0, U2)): 50,
            frozenset((U1, U2)): 50,
        },
    )
    monkeypatch.setitem(sys.modules, "pynvml", mod)
    return mod


@pytest.fixture
def real(nv: Any, tmp_path: Path) -> Iterator[RealNvml]:
    caps = tmp_path / "proc/driver/nvidia/capabilities/gpu1/mig"
    for rel, minor in (("gi2/access", 21), ("gi2/ci0/access", 22), ("gi9/access", 84)):
        (caps / rel).parent.mkdir(parents=True, exist_ok=True)
        (caps / rel).write_text(f"DeviceFileMinor: {minor}\nDeviceFileMode: 292\n")
    r = RealNvml(proc_root=tmp_path / "proc", interrupt_slice_ms=50)
    r.init()
    try:
        yield r
    finally:
        r.shutdown()


def test_init_and_enumerate_map_every_field(real: RealNvml) -> None:
    assert isinstance(real, NvmlBackend)
    gpus = real.gpus()
    assert [g.uuid for g in gpus] == [U0, U1, U2]
    g0, g1, g2 = gpus
    assert g0.pci_bus_id == "0000:18:00.0"
    assert g1.pci_bus_id == "0000:2a:00.0"  # lower case, sysfs domain
    assert g1.name == "NVIDIA H200"
    assert (g0.architecture, g0.brand, g0.compute_capability) == ("hopper", "nvidia", (9, 0))
    assert g0.mig_capable
    assert not g0.mig_enabled
    assert g1.mig_enabled
    assert not g2.mig_capable  # NotSupported is "no MIG", not an error
    assert g2.serial is None
    assert g2.architecture == "ada"


def test_driver_info(nv: Any) -> None:
    d = RealNvml().init()
    assert (d.driver_version, d.cuda_version, d.nvml_version) == (
        "580.159.04",
        "13.0",
        "13.580.159.04",
    )


def test_open_backend_real_uses_pynvml(nv: Any) -> None:
    b = open_backend("real")
    assert isinstance(b, RealNvml)
    assert b.init().driver_version == "580.159.04"


@pytest.mark.parametrize("code", ["DRIVER_NOT_LOADED", "LIBRARY_NOT_FOUND", "NO_PERMISSION"])
def test_init_failure_is_an_nvml_error_with_its_name(
    monkeypatch: pytest.MonkeyPatch, code: str
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", make_module([], init_error=code))
    with pytest.raises(NvmlError) as e:
        RealNvml().init()
    assert e.value.code == "".join(w.capitalize() for w in code.split("_"))
    assert e.value.uuid is None


def test_missing_nvidia_ml_py_is_library_not_found(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    with pytest.raises(NvmlError) as e:
        RealNvml().init()
    assert e.value.code == "LibraryNotFound"
    assert "kubedevice[nvidia]" in str(e.value)


def test_calls_before_init_raise_uninitialized() -> None:
    with pytest.raises(NvmlError) as e:
        RealNvml().gpus()
    assert e.value.code == "Uninitialized"


def test_sample_maps_values_and_not_supported_to_none(real: RealNvml) -> None:
    real.gpus()
    s0 = real.sample(U0)
    assert (s0.utilization_gpu, s0.utilization_memory, s0.power_mw, s0.temperature_c) == (
        10,
        3,
        70000,
        31,
    )
    assert s0.memory_used == 600 * 1024 * 1024
    assert s0.ecc_double_bit_volatile == 0
    assert s0.remapped_rows_pending is False
    s2 = real.sample(U2)
    assert s2.power_mw is None
    assert s2.ecc_double_bit_volatile is None
    assert s2.remapped_rows_failure is None
    assert [(p.pid, p.used_memory) for p in s2.processes] == [(77, None), (78, 1 << 30)]


def test_lost_gpu_raises_gpu_is_lost_for_that_gpu_only(real: RealNvml, nv: Any) -> None:
    real.gpus()
    nv.gpus[U1].lost = True
    for call in (real.sample, real.probe, real.mig_devices):
        with pytest.raises(NvmlError) as e:
            call(U1)
        assert e.value.code == "GpuIsLost"
        assert e.value.uuid == U1
    real.probe(U0)
    assert real.sample(U0).temperature_c == 31


def test_unknown_uuid_is_not_found(real: RealNvml) -> None:
    with pytest.raises(NvmlError) as e:
        real.sample("GPU-nope")
    assert e.value.code == "NotFound"


def test_mig_devices_names_and_cap_minors(real: RealNvml) -> None:
    real.gpus()
    assert real.mig_devices(U0) == []
    assert real.mig_devices(U2) == []
    m0, m1 = real.mig_devices(U1)
    assert (m0.uuid, m0.profile, m0.gi_id, m0.ci_id) == (M0, "3g.71gb", 2, 0)
    assert m0.cap_minors == (21, 22)
    assert (m1.profile, m1.index, m1.parent_index) == ("1g.18gb", 1, 1)
    assert m1.cap_minors == (84,)  # the CI access file is absent: only what exists
    assert m0.memory_total == 70656 * 1024 * 1024


@pytest.mark.parametrize(
    ("gi", "ci", "mib", "total", "name"),
    [
        # H100 80GB (81559 MiB)
        (1, 1, 9856, 81559, "1g.10gb"),
        (1, 1, 19968, 81559, "1g.20gb"),
        (2, 2, 19968, 81559, "2g.20gb"),
        (3, 3, 40192, 81559, "3g.40gb"),
        (4, 4, 40192, 81559, "4g.40gb"),
        (7, 7, 80768, 81559, "7g.80gb"),
        (7, 1, 80768, 81559, "1c.7g.80gb"),
        # H200 141GB (143771 MiB)
        (1, 1, 17920, 143771, "1g.18gb"),
        (1, 1, 35072, 143771, "1g.35gb"),
        (2, 2, 35072, 143771, "2g.35gb"),
        (3, 3, 70656, 143771, "3g.71gb"),
        (4, 4, 70656, 143771, "4g.71gb"),
        (7, 7, 140800, 143771, "7g.141gb"),
    ],
)
def test_mig_profile_names(gi: int, ci: int, mib: int, total: int, name: str) -> None:
    assert mig_profile_name(gi, ci, mib, total * 1024 * 1024) == name


def test_packaged_mig_machine_names_agree_with_the_rule() -> None:
    m = load_machine("mig-mixed")
    for g in m.gpus:
        for d in g.mig:
            slices = int(d.profile.split("g.")[0].split(".")[-1])
            got = mig_profile_name(slices, slices, d.memory_total >> 20, g.info.memory_total)
            assert got == d.profile


def test_links_direct_nvlink_and_not_supported(real: RealNvml, nv: Any) -> None:
    real.gpus()
    link = real.link(U0, U1)
    assert link is not None
    assert (link.level, link.nvlinks) == (P2PLevel.SINGLE, 2)
    link = real.link(U1, U0)
    assert link is not None
    assert link.nvlinks == 2
    link = real.link(U0, U2)  # U2 has no NVLink: PCIe only
    assert link is not None
    assert (link.level, link.nvlinks) == (P2PLevel.SYSTEM, 0)
    with pytest.raises(NvmlError):
        real.link(U0, U0)


def test_link_unknown_when_nvml_cannot_tell(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = [
        GpuSpec(uuid=U0, bus=B0, minor=0, nvlink_remote=NOT_SUPPORTED),
        GpuSpec(uuid=U1, bus=B1, minor=1, nvlink_remote=NOT_SUPPORTED),
    ]
    monkeypatch.setitem(sys.modules, "pynvml", make_module(gpus, ancestors=None))
    r = RealNvml()
    r.init()
    r.gpus()
    assert r.link(U0, U1) is None


def test_nvswitch_links_counted_from_p2p_status(monkeypatch: pytest.MonkeyPatch) -> None:
    switch = "00000000:C0:00.0"
    gpus = [
        GpuSpec(uuid=U0, bus=B0, minor=0, nvlink_remote=(switch,) * 4),
        GpuSpec(uuid=U1, bus=B1, minor=1, nvlink_remote=(switch,) * 3),
    ]
    mod = make_module(
        gpus, ancestors={frozenset((U0, U1)): 50}, p2p_nvlink_ok={frozenset((U0, U1))}
    )
    monkeypatch.setitem(sys.modules, "pynvml", mod)
    r = RealNvml()
    r.init()
    r.gpus()
    link = r.link(U0, U1)
    assert link is not None
    assert link.nvlinks == 3


def test_watch_registers_xid_and_double_bit_only(real: RealNvml, nv: Any) -> None:
    real.gpus()
    real.watch([U0, U1, U2])
    regs = nv.state["registered"]
    assert [(u, m) for u, m, _ in regs] == [(U0, 0x8 | 0x2), (U1, 0x8 | 0x2)]  # U2: NotSupported
    real.watch([U0])  # replacing the set frees the old one
    assert nv.state["freed"] == 1


def test_events_xid_ecc_and_mig_mapping(real: RealNvml, nv: Any) -> None:
    real.gpus()
    real.mig_devices(U1)
    real.watch([U0, U1])
    nv.events.put((U0, 8, 79, 0xFFFFFFFF, 0xFFFFFFFF))
    nv.events.put((U1, 2, 0, 0xFFFFFFFF, 0xFFFFFFFF))
    nv.events.put((U1, 8, 94, 9, 0))
    ev = real.wait_event(1000)
    assert ev is not None
    assert (ev.kind, ev.uuid, ev.xid) == (EventKind.XID, U0, 79)
    ev = real.wait_event(1000)
    assert ev is not None
    assert (ev.kind, ev.uuid) == (EventKind.ECC_DOUBLE_BIT, U1)
    ev = real.wait_event(1000)
    assert ev is not None
    assert (ev.uuid, ev.xid) == (M1, 94)
    t = time.monotonic()
    assert real.wait_event(120) is None
    assert time.monotonic() - t >= 0.1


def test_wait_gpu_is_lost_probes_and_reports_the_lost_gpu(real: RealNvml, nv: Any) -> None:
    real.gpus()
    real.watch([U0, U1])
    nv.gpus[U1].lost = True
    nv.events.put("GPU_IS_LOST")
    ev = real.wait_event(1000)
    assert ev is not None
    assert (ev.kind, ev.uuid) == (EventKind.GPU_LOST, U1)


def test_watch_a_lost_gpu_reports_it_and_watches_the_rest(real: RealNvml, nv: Any) -> None:
    real.gpus()
    nv.gpus[U0].lost = True
    real.watch([U0, U1])
    assert [u for u, _, _ in nv.state["registered"]] == [U1]
    ev = real.wait_event(100)
    assert ev is not None
    assert (ev.kind, ev.uuid) == (EventKind.GPU_LOST, U0)


def test_interrupt_ends_the_wait_within_a_slice(real: RealNvml) -> None:
    real.gpus()
    real.watch([U0])
    got: list[object] = []
    th = threading.Thread(target=lambda: got.append(real.wait_event(30_000)))
    th.start()
    t = time.monotonic()
    real.interrupt()
    th.join(5)
    assert got == [None]
    assert time.monotonic() - t < 1.0


def test_other_wait_error_is_raised_as_nvml_error(real: RealNvml, nv: Any) -> None:
    real.gpus()
    real.watch([U0])
    nv.events.put("UNKNOWN")
    with pytest.raises(NvmlError) as e:
        real.wait_event(1000)
    assert e.value.code == "Unknown"


def test_watch_a_mig_uuid_registers_its_parent(real: RealNvml, nv: Any) -> None:
    real.gpus()
    real.mig_devices(U1)
    real.watch([M0, M1, U1])
    assert [u for u, _, _ in nv.state["registered"]] == [U1]


def test_real_pynvml_without_a_driver_is_library_not_found() -> None:
    """With the real nvidia-ml-py and no libnvidia-ml (a CPU machine): one clear error."""
    pytest.importorskip("pynvml")
    import ctypes.util

    if ctypes.util.find_library("nvidia-ml"):
        pytest.skip("an NVIDIA driver is installed here")
    with pytest.raises(NvmlError) as e:
        RealNvml().init()
    assert e.value.code in ("LibraryNotFound", "DriverNotLoaded")


def test_a_gpu_lost_before_enumeration_is_left_out(nv: Any) -> None:
    nv.gpus[U1].lost = True
    r = RealNvml()
    r.init()
    assert [g.uuid for g in r.gpus()] == [U0, U2]
    assert [(i, e.code) for i, e in r.skipped] == [(1, "GpuIsLost")]


def test_shutdown_after_a_failed_init_keeps_quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    """A caller's clean-up after init() failed must not raise Uninitialized over the real
    error (NVML was never up, so there is nothing to shut down)."""
    monkeypatch.setitem(sys.modules, "pynvml", make_module([], init_error="LIBRARY_NOT_FOUND"))
    r = RealNvml()
    with pytest.raises(NvmlError) as e:
        r.init()
    assert e.value.code == "LibraryNotFound"
    r.shutdown()  # nothing to do, no error


def test_shutdown_twice_is_one_nvml_shutdown(nv: Any) -> None:
    r = RealNvml()
    r.init()
    r.shutdown()
    assert nv.state["init"] is False
    r.shutdown()  # already down: nothing more

"""The real backend's MIG calls (nvml_mig.py) against a stand-in pynvml with an H200's answers."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kubedevice.errors import NvmlError
from kubedevice.nvidia.backend import MigPartitioning, MigPlacement
from kubedevice.nvidia.fake import FakeNvml
from kubedevice.nvidia.nvml_real import RealNvml

from .stand_in_pynvml import GpuSpec, make_module
from .stand_in_pynvml_mig import add_mig

MIG_ON = "GPU-11111111-aaaa-bbbb-cccc-111111111111"
MIG_OFF = "GPU-00000000-aaaa-bbbb-cccc-000000000000"


@pytest.fixture
def real(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[tuple[RealNvml, Any]]:
    mod = make_module(
        [
            GpuSpec(uuid=MIG_OFF, bus="00000000:18:00.0", minor=0, name="NVIDIA H200"),
            GpuSpec(
                uuid=MIG_ON,
                bus="00000000:2A:00.0",
                minor=1,
                name="NVIDIA H200",
                memory_total=143771 * 1024 * 1024,
                mig_mode=(1, 1),
            ),
        ]
    )
    add_mig(mod)
    monkeypatch.setitem(sys.modules, "pynvml", mod)
    r = RealNvml(proc_root=tmp_path / "proc")
    r.init()
    r.gpus()
    try:
        yield r, mod
    finally:
        r.shutdown()


def test_profiles_are_those_nvml_reports_and_match_the_fakes(real: tuple[RealNvml, Any]) -> None:
    nvml, _ = real
    assert isinstance(nvml, MigPartitioning)
    got = nvml.gpu_instance_profiles(MIG_OFF)  # answered with MIG mode off too
    fake = FakeNvml.from_file("mig-mixed")  # H200s
    fake.init()
    try:
        want = fake.gpu_instance_profiles(fake.gpus()[0].uuid)
    finally:
        fake.close()
    assert sorted(got, key=lambda p: p.id) == sorted(want, key=lambda p: p.id)


def test_make_list_and_destroy_a_mig_device(real: tuple[RealNvml, Any]) -> None:
    nvml, _mod = real
    made = nvml.create_mig_device(MIG_ON, 9, MigPlacement(4, 4))
    assert (made.profile, made.gi_id, made.ci_id) == ("3g.71gb", 1, 0)
    assert made.memory_total == 71424 * 1024 * 1024
    [gi] = nvml.gpu_instances(MIG_ON)
    assert (gi.gi_id, gi.profile_id, gi.placement) == (1, 9, MigPlacement(4, 4))
    assert [d.uuid for d in gi.devices] == [made.uuid]
    four = nvml.create_mig_device(MIG_ON, 5, MigPlacement(0, 4))  # slices 0-3 are free
    assert (four.profile, four.gi_id) == ("4g.71gb", 2)
    assert len(nvml.mig_devices(MIG_ON)) == 2


def test_overlap_is_insufficient_resources_and_nothing_is_left(real: tuple[RealNvml, Any]) -> None:
    nvml, mod = real
    nvml.create_mig_device(MIG_ON, 14, MigPlacement(2, 2))
    with pytest.raises(NvmlError) as err:
        nvml.create_mig_device(MIG_ON, 9, MigPlacement(0, 4))
    assert err.value.code == "InsufficientResources"
    assert len(mod.instances) == 1


def test_destroy_takes_the_compute_instance_first(real: tuple[RealNvml, Any]) -> None:
    nvml, mod = real
    made = nvml.create_mig_device(MIG_ON, 9, MigPlacement(0, 4))
    nvml.destroy_mig_device(MIG_ON, made.gi_id)
    assert mod.instances == {}
    assert nvml.gpu_instances(MIG_ON) == []
    with pytest.raises(NvmlError) as err:
        nvml.destroy_mig_device(MIG_ON, made.gi_id)
    assert err.value.code == "NotFound"


def test_without_mig_mode_nothing_is_made(real: tuple[RealNvml, Any]) -> None:
    nvml, _mod = real
    with pytest.raises(NvmlError) as err:
        nvml.create_mig_device(MIG_OFF, 9, MigPlacement(0, 4))
    assert err.value.code == "NotSupported"
    assert nvml.gpu_instances(MIG_OFF) == []

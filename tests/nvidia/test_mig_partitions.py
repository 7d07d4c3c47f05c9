"""The fake NVML makes and destroys MIG devices with NVML's placement rules (H100 80GB, H200)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubedevice.errors import NvmlError
from kubedevice.nvidia.backend import MigPartitioning, MigPlacement
from kubedevice.nvidia.fake import FakeNvml
from kubedevice.nvidia.fake.partitions import cap_minors


@pytest.fixture
def h100(tmp_path: Path) -> Iterator[FakeNvml]:
    nvml = FakeNvml.from_file("dgx-8gpu-mig", state_file=tmp_path / "state.json")
    nvml.init()
    yield nvml
    nvml.close()


def _profile(nvml: FakeNvml, uuid: str, name: str) -> int:
    return next(p.id for p in nvml.gpu_instance_profiles(uuid) if p.name == name)


def test_h100_profiles_and_placements(h100: FakeNvml) -> None:
    assert isinstance(h100, MigPartitioning)
    gpu = h100.gpus()[0].uuid
    got = {
        p.name: [(pl.start, pl.size) for pl in p.placements]
        for p in h100.gpu_instance_profiles(gpu)
    }
    assert got == {
        "1g.10gb": [(i, 1) for i in range(7)],
        "1g.10gb+me": [(i, 1) for i in range(7)],
        "1g.20gb": [(0, 2), (2, 2), (4, 2), (6, 2)],
        "2g.20gb": [(0, 2), (2, 2), (4, 2)],
        "3g.40gb": [(0, 4), (4, 4)],
        "4g.40gb": [(0, 4)],
        "7g.80gb": [(0, 8)],
    }


def test_3g_2g_2g_fit_then_4g_does_not(h100: FakeNvml) -> None:
    gpu = h100.gpus()[0].uuid
    made = [
        h100.create_mig_device(gpu, _profile(h100, gpu, "3g.40gb"), MigPlacement(4, 4)),
        h100.create_mig_device(gpu, _profile(h100, gpu, "2g.20gb"), MigPlacement(0, 2)),
        h100.create_mig_device(gpu, _profile(h100, gpu, "2g.20gb"), MigPlacement(2, 2)),
    ]
    assert [m.profile for m in made] == ["3g.40gb", "2g.20gb", "2g.20gb"]
    assert [m.gi_id for m in made] == [1, 2, 3]
    assert made[0].cap_minors == cap_minors(0, 1, 0)
    assert {m.uuid for m in h100.mig_devices(gpu)} == {m.uuid for m in made}
    four = _profile(h100, gpu, "4g.40gb")
    with pytest.raises(NvmlError) as err:
        h100.create_mig_device(gpu, four, MigPlacement(0, 4))
    assert err.value.code == "InsufficientResources"
    assert len(h100.gpu_instances(gpu)) == 3  # nothing left behind
    # another GPU is untouched: the 4g fits there
    other = h100.gpus()[1].uuid
    assert h100.create_mig_device(other, four, MigPlacement(0, 4)).profile == "4g.40gb"


def test_overlap_refused_and_destroy_frees(h100: FakeNvml) -> None:
    gpu = h100.gpus()[0].uuid
    two = _profile(h100, gpu, "2g.20gb")
    first = h100.create_mig_device(gpu, two, MigPlacement(2, 2))
    with pytest.raises(NvmlError) as err:  # 1g.20gb at {2,2} shares memory slices 2-3
        h100.create_mig_device(gpu, _profile(h100, gpu, "1g.20gb"), MigPlacement(2, 2))
    assert err.value.code == "InsufficientResources"
    with pytest.raises(NvmlError) as err:  # 3g at {0,4} overlaps slices 2-3 too
        h100.create_mig_device(gpu, _profile(h100, gpu, "3g.40gb"), MigPlacement(0, 4))
    assert err.value.code == "InsufficientResources"
    h100.destroy_mig_device(gpu, first.gi_id)
    assert h100.gpu_instances(gpu) == []
    assert (
        h100.create_mig_device(gpu, _profile(h100, gpu, "3g.40gb"), MigPlacement(0, 4)).gi_id == 1
    )
    with pytest.raises(NvmlError) as err:
        h100.destroy_mig_device(gpu, 7)
    assert err.value.code == "NotFound"


def test_invalid_placement_and_media_extensions(h100: FakeNvml) -> None:
    gpu = h100.gpus()[0].uuid
    with pytest.raises(NvmlError) as err:  # 2g never starts at 6
        h100.create_mig_device(gpu, _profile(h100, gpu, "2g.20gb"), MigPlacement(6, 2))
    assert err.value.code == "InvalidArgument"
    me = _profile(h100, gpu, "1g.10gb+me")
    h100.create_mig_device(gpu, me, MigPlacement(0, 1))
    with pytest.raises(NvmlError) as err:  # one set of media extensions per GPU
        h100.create_mig_device(gpu, me, MigPlacement(3, 1))
    assert err.value.code == "InsufficientResources"


def test_mig_mode_off_is_not_supported() -> None:
    nvml = FakeNvml.from_file("dgx-8gpu")  # MIG-capable, MIG mode off
    nvml.init()
    try:
        gpu = nvml.gpus()[0].uuid
        with pytest.raises(NvmlError) as err:
            nvml.create_mig_device(gpu, 9, MigPlacement(0, 4))
        assert err.value.code == "NotSupported"
        assert nvml.gpu_instances(gpu) == []
    finally:
        nvml.close()


def test_instances_outlive_the_process(tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    first = FakeNvml.from_file("dgx-8gpu-mig", state_file=state)
    first.init()
    gpu = first.gpus()[0].uuid
    made = first.create_mig_device(gpu, 9, MigPlacement(0, 4))
    first.close()
    assert json.loads(state.read_text())["instances"][0]["uuid"] == made.uuid
    again = FakeNvml.from_file("dgx-8gpu-mig", state_file=state)
    again.init()
    try:
        assert [m.uuid for m in again.mig_devices(gpu)] == [made.uuid]
        with pytest.raises(NvmlError):  # still there: slices 0-3 are taken
            again.create_mig_device(gpu, 5, MigPlacement(0, 4))
        again.destroy_mig_device(gpu, made.gi_id)
        assert json.loads(state.read_text())["instances"] == []
    finally:
        again.close()


def test_corrupt_state_file_set_aside(tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    state.write_text("{not json")
    nvml = FakeNvml.from_file("dgx-8gpu-mig", state_file=state)
    nvml.init()
    try:
        assert nvml.gpu_instances(nvml.gpus()[0].uuid) == []
        assert (tmp_path / "state.json.corrupt").read_text() == "{not json"
    finally:
        nvml.close()

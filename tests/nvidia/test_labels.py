"""Node labels and the NFD local feature file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kubedevice.errors import ConfigError
from kubedevice.nvidia.fake import FakeNvml
from kubedevice.nvidia.labels import (
    compute_labels,
    label_value,
    remove_feature_file,
    render_feature_file,
    write_feature_file,
)


def _labels(machine: str, **kw: object) -> dict[str, str]:
    f = FakeNvml.from_file(machine)
    driver = f.init()
    gpus = f.gpus()
    mig = {g.uuid: f.mig_devices(g.uuid) for g in gpus}
    f.close()
    args: dict[str, object] = {"mig_strategy": "none", "sharing_strategy": "none", "replicas": 1}
    args.update(kw)
    return compute_labels(driver, gpus, mig, **args)  # type: ignore[arg-type]


def test_h200_recording_labels() -> None:
    labels = _labels("h200")
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H200"
    assert labels["nvidia.com/gpu.count"] == "1"
    assert labels["nvidia.com/gpu.memory"] == str(150754820096 // (1024 * 1024))
    assert labels["nvidia.com/gpu.family"] == "hopper"
    assert (labels["nvidia.com/gpu.compute.major"], labels["nvidia.com/gpu.compute.minor"]) == (
        "9",
        "0",
    )
    assert labels["nvidia.com/cuda.driver.major"] == "580"
    assert labels["nvidia.com/cuda.driver.minor"] == "159"
    assert labels["nvidia.com/cuda.driver.rev"] == "04"
    assert labels["nvidia.com/cuda.driver-version.full"] == "580.159.04"
    assert labels["nvidia.com/cuda.runtime.major"] == "13"
    assert labels["nvidia.com/cuda.runtime.minor"] == "0"
    assert labels["nvidia.com/mig.capable"] == "true"
    assert labels["nvidia.com/mig.strategy"] == "none"
    assert labels["nvidia.com/gpu.sharing-strategy"] == "none"
    assert labels["nvidia.com/gpu.replicas"] == "1"


def test_pcie_box_no_mig_and_time_slicing() -> None:
    labels = _labels("pcie-4gpu", sharing_strategy="time-slicing", replicas=4)
    assert labels["nvidia.com/gpu.count"] == "4"
    assert labels["nvidia.com/mig.capable"] == "false"
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-L40S-SHARED"
    assert labels["nvidia.com/gpu.replicas"] == "4"
    assert labels["nvidia.com/gpu.sharing-strategy"] == "time-slicing"
    assert labels["nvidia.com/gpu.family"] == "ada"


def test_mig_mixed_labels_per_profile() -> None:
    labels = _labels("mig-mixed", mig_strategy="mixed")
    assert labels["nvidia.com/mig.strategy"] == "mixed"
    assert labels["nvidia.com/mig-1g.18gb.count"] == "4"
    assert labels["nvidia.com/mig-3g.71gb.count"] == "2"
    assert labels["nvidia.com/mig-2g.35gb.count"] == "2"
    assert labels["nvidia.com/mig-1g.35gb.count"] == "2"
    assert labels["nvidia.com/mig-4g.71gb.count"] == "1"
    assert labels["nvidia.com/mig-3g.71gb.slices.gi"] == "3"
    assert labels["nvidia.com/mig-1g.18gb.memory"] == "16896"
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H200"
    assert labels["nvidia.com/gpu.count"] == "4"


def test_mig_single_relabels_the_product() -> None:
    labels = _labels("mig-mixed", mig_strategy="single")
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H200-MIG-1g.18gb"
    assert labels["nvidia.com/gpu.count"] == "11"  # MIG devices, not GPUs


def test_no_gpus_and_bad_arguments() -> None:
    f = FakeNvml.from_file("pcie-4gpu")
    driver = f.init()
    f.close()
    labels = compute_labels(
        driver, [], {}, mig_strategy="none", sharing_strategy="none", replicas=1
    )
    assert labels["nvidia.com/gpu.present"] == "false"
    assert labels["nvidia.com/gpu.count"] == "0"
    assert "nvidia.com/gpu.product" not in labels
    for kw in (
        {"mig_strategy": "half", "sharing_strategy": "none", "replicas": 1},
        {"mig_strategy": "none", "sharing_strategy": "spatial", "replicas": 1},
        {"mig_strategy": "none", "sharing_strategy": "none", "replicas": 0},
    ):
        with pytest.raises(ConfigError):
            compute_labels(driver, [], {}, **kw)  # type: ignore[arg-type]


def test_label_value_sanitises() -> None:
    assert label_value("NVIDIA H100 80GB HBM3") == "NVIDIA-H100-80GB-HBM3"
    assert label_value(" Tesla (V100) ") == "Tesla-V100"
    assert len(label_value("x" * 100)) == 63


def test_every_label_renders() -> None:
    for machine in ("h200", "dgx-8gpu", "mig-mixed"):
        text = render_feature_file(_labels(machine, mig_strategy="mixed"))
        assert text.startswith("#")
        body = [ln for ln in text.splitlines() if not ln.startswith("#")]
        assert body == sorted(body)
        assert all(ln.count("=") == 1 for ln in body)


def test_write_is_atomic_and_only_on_change(tmp_path: Path) -> None:
    d = tmp_path / "features.d"
    labels = _labels("dgx-8gpu")
    assert write_feature_file(d, labels) is True
    target = d / "kubedevice-nvidia"
    text = target.read_text()
    assert "nvidia.com/gpu.count=8\n" in text
    assert "nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3\n" in text
    assert oct(target.stat().st_mode & 0o777) == "0o644"
    inode = target.stat().st_ino
    assert write_feature_file(d, labels) is False
    assert target.stat().st_ino == inode  # untouched
    labels["nvidia.com/gpu.replicas"] = "2"
    assert write_feature_file(d, labels) is True
    assert target.stat().st_ino != inode  # replaced by rename, never rewritten in place
    assert "nvidia.com/gpu.replicas=2\n" in target.read_text()
    assert sorted(os.listdir(d)) == ["kubedevice-nvidia"]  # no temporary left behind


def test_symlink_target_is_replaced_not_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.write_text("precious\n")
    d = tmp_path / "features.d"
    d.mkdir()
    (d / "kubedevice-nvidia").symlink_to(outside)
    assert write_feature_file(d, {"nvidia.com/gpu.count": "1"}) is True
    assert outside.read_text() == "precious\n"
    assert not (d / "kubedevice-nvidia").is_symlink()


def test_bad_labels_and_names_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="value"):
        write_feature_file(tmp_path, {"nvidia.com/gpu.product": "has space"})
    with pytest.raises(ConfigError, match="name"):
        write_feature_file(tmp_path, {"bad=name": "x"})
    with pytest.raises(ConfigError, match="file name"):
        write_feature_file(tmp_path, {}, name=".hidden")
    with pytest.raises(ConfigError, match="file name"):
        write_feature_file(tmp_path, {}, name="../escape")
    assert list(tmp_path.iterdir()) == []


def test_unwritable_dir_is_a_config_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ConfigError, match="cannot write"):
        write_feature_file(blocker / "sub", {"nvidia.com/gpu.count": "1"})


def test_remove_feature_file(tmp_path: Path) -> None:
    write_feature_file(tmp_path, {"nvidia.com/gpu.count": "1"})
    assert remove_feature_file(tmp_path) is True
    assert remove_feature_file(tmp_path) is False


def test_feature_file_is_world_readable_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o077)
    try:
        write_feature_file(tmp_path, {"nvidia.com/gpu.count": "1"})
    finally:
        os.umask(old)
    assert (tmp_path / "kubedevice-nvidia").stat().st_mode & 0o777 == 0o644

"""`nvidia info` data: GPUs, MIG devices, the topology matrix and the labels."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubedevice.errors import NvmlError
from kubedevice.nvidia.backend import Link, P2PLevel
from kubedevice.nvidia.fake import FakeNvml, write_fake_sysfs
from kubedevice.nvidia.info import collect_info, format_info, link_cell


@pytest.fixture
def dgx(tmp_path: Path) -> Iterator[tuple[FakeNvml, Path]]:
    f = FakeNvml.from_file("dgx-8gpu")
    write_fake_sysfs(f, tmp_path / "sys")
    yield f, tmp_path / "sys"
    f.close()


def test_dgx_info_matrix_and_numa(dgx: tuple[FakeNvml, Path]) -> None:
    f, sys_root = dgx
    info = collect_info(f, sys_root)
    json.dumps(info)  # plain JSON types only
    topo = info["topology"]
    assert topo["gpus"] == [f"GPU{i}" for i in range(8)]
    m = topo["matrix"]
    assert [m[i][i] for i in range(8)] == ["X"] * 8
    assert m[0][1] == "NV18"
    assert m[5][6] == "NV6"
    assert m[0][4] == "NV2"
    assert m[0][5] == "SYS"
    assert all(m[i][j] == m[j][i] for i in range(8) for j in range(8))
    assert topo["numa_nodes"] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [g["numa_node"] for g in info["gpus"]] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert info["labels"]["nvidia.com/gpu.count"] == "8"
    text = format_info(info)
    assert "NV18" in text
    assert "Legend:" in text
    assert "nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3" in text
    row0 = next(ln for ln in text.splitlines() if ln.startswith("GPU0 "))
    assert row0.split() == ["GPU0", "X", "NV18", "NV18", "NV18", "NV2", "SYS", "SYS", "SYS", "0"]


def test_mig_devices_listed(tmp_path: Path) -> None:
    f = FakeNvml.from_file("mig-mixed")
    info = collect_info(f, tmp_path, mig_strategy="mixed")  # no sysfs: the machine's NUMA
    g0 = info["gpus"][0]
    assert [m["profile"] for m in g0["mig_devices"]] == ["3g.71gb", "2g.35gb", "1g.18gb", "1g.18gb"]
    assert info["gpus"][2]["mig_devices"] == []
    assert [g["numa_node"] for g in info["gpus"]] == [0, 0, 1, 1]
    assert info["labels"]["nvidia.com/mig-1g.18gb.count"] == "4"
    text = format_info(info)
    assert "MIG devices" in text
    assert "3g.71gb" in text
    assert "nvidia-cap" in text
    f.close()


def test_pcie_box_matrix_uses_pcie_levels(tmp_path: Path) -> None:
    f = FakeNvml.from_file("pcie-4gpu")
    m = collect_info(f, tmp_path)["topology"]["matrix"]
    assert m[0][1] == "PIX"
    assert m[0][2] == "SYS"
    f.close()


def test_recording_with_unknown_links(tmp_path: Path) -> None:
    f = FakeNvml.from_file("h200")
    write_fake_sysfs(f, tmp_path)
    info = collect_info(f, tmp_path)
    assert info["driver"]["driver_version"] == "580.159.04"
    assert info["gpus"][0]["numa_node"] is None  # sysfs says -1
    assert info["topology"]["matrix"] == [["X"]]
    f.close()


def test_lost_gpu_is_listed_with_its_error(dgx: tuple[FakeNvml, Path]) -> None:
    f, sys_root = dgx
    driver = f.init()
    u = f.gpus()[3].uuid
    f.set_lost(u, True)
    info = collect_info(f, sys_root, driver=driver)
    assert "GpuIsLost" in info["gpus"][3]["error"]
    assert info["topology"]["matrix"][3][0] == "N/A"
    assert "GPU3: NVML GpuIsLost" in format_info(info)


def test_no_driver_raises_nvml_error(tmp_path: Path) -> None:
    with pytest.raises(NvmlError):
        collect_info(FakeNvml.from_file("no-driver"), tmp_path)


def test_link_cells() -> None:
    assert link_cell(None) == "N/A"
    assert link_cell(Link(P2PLevel.MULTIPLE)) == "PXB"
    assert link_cell(Link(P2PLevel.HOSTBRIDGE)) == "PHB"
    assert link_cell(Link(P2PLevel.SYSTEM, 4)) == "NV4"

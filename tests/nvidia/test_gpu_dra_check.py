"""scripts/gpu-dra-check without a GPU or a cluster: no NVML exits 2 with one line; what the
driver published is compared with what NVML says, and any difference is a failed check."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
MISSING_PYNVML = 'raise ModuleNotFoundError("No module named \'pynvml\'", name="pynvml")\n'
NO_DRIVER_PYNVML = """
class NVMLError(Exception):
    pass

def nvmlInit():
    raise NVMLError("NVML Shared Library Not Found")
"""


@pytest.fixture(scope="module")
def check() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_dra_check", SCRIPTS / "gpu_dra_check.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_dra_check"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _run(tmp_path: Path, pynvml: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "pynvml.py").write_text(pynvml)
    return subprocess.run(
        [str(SCRIPTS / "gpu-dra-check")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(tmp_path)},
    )


def test_without_pynvml_one_line_and_exit_2(tmp_path: Path) -> None:
    proc = _run(tmp_path, MISSING_PYNVML)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout == ""
    assert proc.stderr.splitlines() == [
        "gpu-dra-check: NVML is not available here (the Python module pynvml (nvidia-ml-py) "
        "is not installed); it needs an NVIDIA GPU and driver, and nvidia-ml-py"
    ]


def test_without_driver_one_line_and_exit_2(tmp_path: Path) -> None:
    proc = _run(tmp_path, NO_DRIVER_PYNVML)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    [line] = proc.stderr.splitlines()
    assert line.startswith("gpu-dra-check: NVML is not available here (nvmlInit failed: NVML ")


H100 = dict(
    uuid="GPU-f4dbb85b-ebba-a991-2244-5b8da5b87ae6",
    name="NVIDIA H100 80GB HBM3",
    memory=85520809984,
    pci_bus_id="0000:18:00.0",
    minor=3,
    numa_node=0,
)


def _published(**changes: Any) -> dict[str, Any]:
    """The device as the driver publishes the H100 above (resource.k8s.io/v1 JSON)."""
    attrs: dict[str, Any] = {
        "uuid": {"string": H100["uuid"]},
        "productName": {"string": H100["name"]},
        "pcieBusID": {"string": "0000:18:00.0"},
        "resource.kubernetes.io/pciBusID": {"string": "0000:18:00.0"},
        "minor": {"int": 3},
        "numaNode": {"int": 0},
        "type": {"string": "gpu"},
        "driverVersion": {"version": "580.95.5"},
    }
    device = {
        "name": "gpu-3",
        "attributes": attrs,
        "capacity": {"memory": {"value": "85520809984"}},
    }
    for key, value in changes.items():
        if key == "memory":
            device["capacity"] = {"memory": {"value": value}}
        elif key == "name":
            device["name"] = value
        elif value is None:
            attrs.pop(key)
        else:
            attrs[key] = value
    return {device["name"]: device}


def _failed(check: ModuleType, devices: dict[str, Any], **gpu: Any) -> list[str]:
    report = check.Report("real")
    check.compare_devices(report, [check.Gpu(**{**H100, **gpu})], devices)
    assert report.checks
    return [c["name"] for c in report.checks if not c["ok"]]


def test_a_device_as_nvml_says_passes(check: ModuleType) -> None:
    assert _failed(check, _published()) == []
    # NVML's 8-digit domain and upper case; a quantity with a binary suffix
    assert _failed(check, _published(memory="81559Mi"), memory=81559 * 2**20) == []
    assert check.bdf("00000000:1A:00.0") == "0000:1a:00.0"


@pytest.mark.parametrize(
    ("changes", "gpu", "failed"),
    [
        ({"memory": "80Gi"}, {}, "gpu-3.memory_matches_nvml"),
        ({"productName": {"string": "NVIDIA H100"}}, {}, "gpu-3.productName_matches_nvml"),
        ({"pcieBusID": {"string": "0000:19:00.0"}}, {}, "gpu-3.pcieBusID_matches_nvml"),
        ({"numaNode": None}, {}, "gpu-3.numaNode_matches_nvml"),
        ({}, {"numa_node": None}, "gpu-3.numaNode_matches_nvml"),
        ({"minor": {"int": 0}}, {}, "gpu-3.minor_matches_nvml"),
        ({"uuid": {"string": "GPU-00000000-0000-0000-0000-000000000000"}}, {},
         "every_nvml_gpu_published"),
    ],
)  # fmt: skip
def test_a_difference_from_nvml_is_a_failed_check(
    check: ModuleType, changes: dict[str, Any], gpu: dict[str, Any], failed: str
) -> None:
    assert _failed(check, _published(**changes), **gpu) == [failed]


def test_a_device_named_for_another_minor_fails(check: ModuleType) -> None:
    devices = _published(name="gpu-0")
    assert _failed(check, devices) == ["gpu-0.name_matches_nvml"]


def test_xz_binaries_are_unpacked_into_the_work_dir(check: ModuleType, tmp_path: Path) -> None:
    import lzma

    carried = tmp_path / "carried"
    carried.mkdir()
    for name in ("etcd", "kube-apiserver", "kubelet"):
        with lzma.open(carried / f"{name}.xz", "wb") as f:
            f.write(f"#!/bin/sh\necho {name}\n".encode())
    (carried / "kd-fakecri").write_text("#!/bin/sh\necho fakecri\n")
    (carried / "kd-fakecri").chmod(0o755)
    work = tmp_path / "work"
    work.mkdir()
    got = check.find_binaries(str(carried), work)
    assert got == work / "bin"
    for name in ("etcd", "kube-apiserver", "kubelet", "kd-fakecri"):
        out = subprocess.run([str(got / name)], capture_output=True, text=True, check=True)
        assert out.stdout == f"{name if name != 'kd-fakecri' else 'fakecri'}\n"


def test_a_binary_missing_in_both_forms_is_named(check: ModuleType, tmp_path: Path) -> None:
    (tmp_path / "etcd.xz").write_bytes(b"")
    with pytest.raises(check.CheckError, match=r"missing kube-apiserver, kubelet, kd-fakecri$"):
        check.find_binaries(str(tmp_path), tmp_path)

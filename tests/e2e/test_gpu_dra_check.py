"""scripts/gpu-dra-check rehearsed on a fake NVML machine: its own etcd, kube-apiserver and
real kubelet (in a mount namespace of its own), the GPU DRA driver, allocation by hand, the
pod Running with the claim's CDI device; nothing left behind. This is what runs on a real GPU
with ``--nvml real``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest

from .cluster import find_binaries

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu-dra-check"

pytestmark = pytest.mark.timeout(300)


def _run(out: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    proc = subprocess.run(
        [str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
        env={**os.environ, "PYTHON": sys.executable, "OUT": str(out)},
    )
    result = json.loads(proc.stdout)
    assert json.loads((out / "gpu-dra-check.json").read_text()) == result
    return proc, result


def _nothing_left(work: str) -> None:
    assert not Path(work).exists()
    with open("/proc/self/mountinfo") as f:
        assert work not in f.read()
    for p in psutil.process_iter(["cmdline"]):
        assert not any(work in arg for arg in p.info["cmdline"] or []), p.info["cmdline"]


def test_rehearsal_on_eight_fake_gpus_passes_every_check(tmp_path: Path) -> None:
    bin_dir = find_binaries(REPO)
    assert bin_dir is not None
    proc, result = _run(
        tmp_path, "--nvml", "fake:dgx-8gpu", "--k8s-bin", str(bin_dir), "--deadline", "200"
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr
    assert result["ok"] is True
    assert result["failed"] == []
    names = [c["name"] for c in result["checks"]]
    for name in (
        "node_ready",
        "every_nvml_gpu_published",
        "driver_registered_with_the_kubelet",
        "claim_allocated_by_hand",
        "pod_running",
        "runtime_got_the_claims_cdi_device",
        "cdi_spec_names_the_gpus_device_node",
        "cdi_device_nodes_exist",
        "claim_unprepared_cdi_spec_removed",
        "driver_clean_exit",
    ):
        assert name in names
    # each of the 8 GPUs compared with NVML, attribute by attribute
    compared = [n for n in names if n.endswith("_matches_nvml")]
    assert len(compared) == 8 * 8
    assert {n.split(".", 1)[0] for n in compared} == {f"gpu-{i}" for i in range(8)}
    assert sorted(result["published"]) == [f"gpu-{i}" for i in range(8)]
    [cdi] = result["runtime_cdi_devices"]
    assert cdi.startswith("k8s.gpu.kubedevice.io/claim=")
    assert cdi.endswith("-gpu-0")
    assert result["cdi_device_nodes"][0] == "/dev/nvidia0"
    assert set(result["timings_ms"]) >= {
        "driver_start_to_slice_published",
        "pod_created_to_running",
        "total",
    }
    _nothing_left(result["work_dir"])


def test_missing_binaries_fail_with_one_error_naming_them(tmp_path: Path) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    (empty / "etcd").write_text("")
    proc, result = _run(tmp_path, "--nvml", "fake:h200", "--k8s-bin", str(empty))
    assert proc.returncode == 1
    assert result["ok"] is False
    assert result["error"] == (
        f"CheckError: --k8s-bin {empty}: missing kube-apiserver, kubelet, kd-fakecri"
    )
    assert "Traceback" not in proc.stderr
    _nothing_left(result["work_dir"])

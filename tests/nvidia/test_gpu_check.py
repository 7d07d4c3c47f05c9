"""scripts/gpu-check without a GPU: one line, exit 2; every non-CUDA step rehearsed on the fake."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu-check"

# A stand-in pynvml whose nvmlInit fails like it does on a machine without the driver.
NO_DRIVER_PYNVML = """
class NVMLError(Exception):
    pass

def nvmlInit():
    raise NVMLError("NVML Shared Library Not Found")
"""


def _run(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SCRIPT)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "PYTHON": sys.executable, **env},
    )


# A pynvml that is not there, even where nvidia-ml-py is installed.
MISSING_PYNVML = 'raise ModuleNotFoundError("No module named \'pynvml\'", name="pynvml")\n'


def test_without_pynvml_one_line_and_exit_2(tmp_path: Path) -> None:
    (tmp_path / "pynvml.py").write_text(MISSING_PYNVML)
    proc = _run({"PYTHONPATH": str(tmp_path)})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout == ""
    assert proc.stderr.splitlines() == [
        "gpu-check: NVML is not available here (the Python module pynvml (nvidia-ml-py) is "
        "not installed); it needs an NVIDIA GPU and driver, and nvidia-ml-py"
    ]


def test_without_driver_one_line_and_exit_2(tmp_path: Path) -> None:
    (tmp_path / "pynvml.py").write_text(NO_DRIVER_PYNVML)
    proc = _run({"PYTHONPATH": str(tmp_path)})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("gpu-check: NVML is not available here (nvmlInit failed: NVML ")
    assert "Traceback" not in proc.stderr


def test_rehearsal_on_the_h200_recording_passes_every_check() -> None:
    proc = subprocess.run(
        [str(SCRIPT), "--nvml", "fake:h200"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "PYTHON": sys.executable},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(proc.stdout)
    assert result["ok"] is True
    assert result["checks"] == {
        "every_nvml_gpu_advertised": True,
        "pod_admitted": True,
        "uuid_known_to_nvml": True,
        "device_nodes_exist": True,
        "env_names_the_gpu": True,
        "metrics_utilization_above_0": True,
        "metrics_carry_pod_labels": True,
        "plugin_clean_exit": True,
    }
    assert result["allocated"] == "GPU-f4dbb85b-ebba-a991-2244-5b8da5b87ae6"
    assert set(result["timings_ms"]) == {
        "nvml_init",
        "start_to_registered",
        "pod_admitted",
        "allocate",
        "sigterm_to_exit",
    }
    assert result["plugin_rss_mb"] > 10  # read from /proc while the plugin served
    assert 'pod="gpu-check"' in result["metrics_line"]


def test_rehearsal_without_a_driver_is_one_line() -> None:
    proc = subprocess.run(
        [str(SCRIPT), "--nvml", "fake:no-driver"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "PYTHON": sys.executable},
    )
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        "gpu-check: NVML is not available here (NVML DriverNotLoaded: fake machine 'no-driver'); "
        "it needs an NVIDIA GPU and driver, and nvidia-ml-py"
    ]

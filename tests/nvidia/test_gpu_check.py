"""scripts/gpu-check without a GPU: one clear line and exit 2 (the GPU path needs real hardware)."""

from __future__ import annotations

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


def test_without_pynvml_one_line_and_exit_2() -> None:
    proc = _run({"PYTHONPATH": ""})
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

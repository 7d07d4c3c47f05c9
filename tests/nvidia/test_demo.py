"""`kubedevice demo --gpu` runs end to end as a real process."""

from __future__ import annotations

import re
import subprocess
import sys


def test_gpu_demo_runs_every_step_and_exits_zero() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "kubedevice", "--log-level", "warning", "demo", "--gpu"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "nvidia.com/gpu  8         8" in out
    assert "GPUs [0, 1, 2, 3]: one full-strength NVLink clique" in out
    assert re.search(r"Unhealthy \d+\.\d ms after the XID", out)
    assert "Healthy again" in out
    assert re.search(r'utilization_percent\{container="train",.*pod="notebook".*\} 87\.0', out)
    assert 'xid="48"} 1.0' in out
    assert "nvidia.com/gpu.count=8" in out
    assert "nvidia.com/gpu.shared: 32 replicas (4 per GPU)" in out
    spread = re.search(r"replicas spread over GPUs \[(\d), (\d)\] first", out)
    assert spread is not None
    assert spread.group(1) != spread.group(2)
    assert "exit code 0" in out
    assert "demo finished in" in out


def test_gpu_demo_narration_owns_the_terminal() -> None:
    """Run as a user types it (default log level, stderr on the terminal): no log lines."""
    proc = subprocess.run(
        [sys.executable, "-m", "kubedevice", "demo", "--gpu"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout
    log_lines = [
        line
        for line in proc.stdout.splitlines()
        if re.search(r"^\d{4}-\d\d-\d\d[ T]\d\d:\d\d|\b(INFO|WARNING|ERROR|DEBUG)\b", line)
    ]
    assert log_lines == []

"""`kubedevice conformance --strict` passes on `kubedevice nvidia run --nvml fake:dgx-8gpu`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

KUBEDEVICE = str(Path(sys.executable).parent / "kubedevice")


def _conformance(tmp_path: Path, host: Any, machine: str, *run_args: str) -> str:
    """Run ``conformance --strict`` on ``nvidia run`` on a fake machine; its report."""
    proc = subprocess.run(
        [
            KUBEDEVICE,
            "conformance",
            "--strict",
            "--log",
            str(tmp_path / "plugin.log"),
            "--",
            KUBEDEVICE,
            "nvidia",
            "run",
            "--nvml",
            f"fake:{machine}",
            *run_args,
            "--dev-root",
            str(host.dev),
            "--sys-root",
            str(host.sys),
            "--pod-resources-socket",
            str(tmp_path / "none.sock"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_gpu_plugin_passes_strict_conformance(tmp_path: Path, gpu_host: Any) -> None:
    host = gpu_host("dgx-8gpu")
    out = _conformance(
        tmp_path,
        host,
        "dgx-8gpu",
        "--cdi-dir",
        str(host.cdi),
        "--features-dir",
        str(host.features),
    )
    assert "0 failed" in out
    assert "(0 MUST and 0 SHOULD failures)" in out
    assert "PASS    MUST    allocate-healthy[nvidia.com/gpu]" in out
    assert "PASS    SHOULD  preferred-allocation[nvidia.com/gpu]" in out


def test_mig_mixed_with_replicas_passes_strict_conformance(tmp_path: Path, gpu_host: Any) -> None:
    host = gpu_host("mig-mixed")
    config = tmp_path / "gpu.yaml"
    config.write_text(
        "version: v1\nflags: {migStrategy: mixed}\n"
        "sharing: {timeSlicing: {resources: [{name: nvidia.com/mig-1g.18gb, replicas: 2}]}}\n"
    )
    out = _conformance(tmp_path, host, "mig-mixed", "--config", str(config), "--features-dir", "")
    assert "(0 MUST and 0 SHOULD failures)" in out
    for resource in ("nvidia.com/gpu", "nvidia.com/mig-1g.18gb", "nvidia.com/mig-4g.71gb"):
        assert f"PASS    MUST    allocate-healthy[{resource}]" in out

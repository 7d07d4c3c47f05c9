"""``--cdi-dir`` of the GPU DRA driver defaults to its config's ``flags.cdiDir``, as for
``kubedevice nvidia run``; ``kubedevice run --dra`` keeps /var/run/cdi (its config has no
such key). Run as real processes against a real API server (``--cleanup`` reads and clears
the directory the driver would write to)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

KUBEDEVICE = str(Path(sys.executable).parent / "kubedevice")
DRIVER = "gpu.kubedevice.io"

pytestmark = pytest.mark.timeout(90)


def test_the_gpu_driver_cleans_the_config_s_cdi_dir(
    tmp_path: Path, kubeconfig: Path, node_name: str
) -> None:
    cdi = tmp_path / "cdi-from-config"
    cdi.mkdir()
    spec = cdi / f"k8s.{DRIVER}-claim_gone.json"
    spec.write_text("{}")
    config = tmp_path / "gpu.yaml"
    config.write_text(f"version: v1\nflags:\n  cdiDir: {cdi}\n")
    proc = subprocess.run(
        [KUBEDEVICE, "nvidia", "dra", "--nvml", "fake:pcie-4gpu", "--config", str(config),
         "--node-name", node_name, "--kubeconfig", str(kubeconfig), "--cleanup"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "removed 1 ResourceSlice(s) and CDI spec(s)" in proc.stdout
    assert not spec.exists()

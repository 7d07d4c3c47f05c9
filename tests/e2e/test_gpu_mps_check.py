"""scripts/gpu-mps-check rehearsed on the fake NVML machine ``one-gpu-80gib`` and its MPS
control daemon stand-in: its own etcd, kube-apiserver, kube-scheduler and real kubelet, the
GPU DRA driver with ``--mps``; four shares Running with their MPS env and pipe dir, a fifth
Pending, the daemon gone after the last pod, and the JSON naming what only a GPU can show.
This is what runs on a real GPU with ``--nvml real``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .cluster import find_binaries

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu-mps-check"

pytestmark = pytest.mark.timeout(400)


def test_rehearsal_on_the_fake_passes_and_says_what_it_could_not_check(tmp_path: Path) -> None:
    bin_dir = find_binaries(REPO)
    assert bin_dir is not None
    proc = subprocess.run(
        [str(SCRIPT), "--nvml", "fake:one-gpu-80gib", "--k8s-bin", str(bin_dir)],
        capture_output=True, text=True, timeout=380, check=False,
        env={**os.environ, "PYTHON": sys.executable, "OUT": str(tmp_path)},
    )  # fmt: skip
    result = json.loads(proc.stdout)
    assert json.loads((tmp_path / "gpu-mps-check.json").read_text()) == result
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr
    assert result["ok"] is True
    names = {c["name"] for c in result["checks"]}
    for name in (
        "published_with_memory_and_compute",
        "no_daemon_before_the_first_share",
        "one_daemon_from_the_first_prepare",
        "share-4.env",
        "share-4.pipe_dir_mounted",
        "fifth_claim_pending",
        "share-1.client_limits_seen_by_the_daemon",
        "daemon_gone_after_the_last_pod",
    ):
        assert name in names
    assert any("out-of-memory" in n for n in result["not_checked"])
    assert any("SM percentage" in n for n in result["not_checked"])
    assert not Path(result["work_dir"]).exists()

"""The fleet benchmark's short mode (bench/bench_fleet.py --quick): 10 simulated nodes of the
GPU DRA driver on a real control plane publish their slices, then stay quiet: no LIST and no
write while nothing changes, one watch each; a rolling upgrade writes nothing; the scheduler
binds every pod."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
WRITES = ("create", "update", "patch", "delete", "deletecollection")


@pytest.mark.timeout(180)
def test_quick_fleet_is_quiet_and_publishes() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    run = subprocess.run(
        [sys.executable, str(REPO / "bench" / "bench_fleet.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=170,
        env=env,
        cwd="/tmp",
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    cases = {c["layout"]: c for c in json.loads(run.stdout)["cases"]}
    gpu = cases["gpu"]
    assert gpu["nodes"] == 10
    assert gpu["devices_per_node"] == 8
    assert gpu["slice_writes_per_node"] == 1  # 8 GPUs: one slice per node, written once
    assert gpu["start_to_published_s"] > 0
    publish = gpu["publish_requests_per_node_by_drivers"]
    assert publish["resourceslices create"] == 1
    # one list each: the echo of its own create, even when it comes before the create's
    # answer, is no reason to list again
    assert publish["resourceslices list"] == 1
    # quiet: the drivers made no request at all (0 LIST, 0 writes), each keeps its watch
    assert gpu["quiet_s"] >= 10
    assert gpu["quiet_requests_per_node_per_min_by_drivers"] == {}
    assert 1 <= gpu["slice_watches_open_per_node"] < 1.5
    # a new instance on every node adopts the slices: no write
    upgrade = gpu["upgrade"]
    assert upgrade["slice_writes"] == 0
    assert not [k for k in upgrade["requests_per_node_by_drivers"] if k.split()[1] in WRITES]
    for case in cases.values():
        for figures in case["scheduler"].values():
            assert figures["bound"] == figures["pods"], figures
    assert cases["plugin"]["quiet_requests_per_node_per_min_by_drivers"] == {}

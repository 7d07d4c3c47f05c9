"""Benchmark of ``kubedevice inspect``; prints one JSON object.

A node with 10 plugins and 10,000 devices in total (the raw test plugin,
``tests/kubelet/rawplugin.py``, 1,000 devices each on 2 NUMA nodes, each a subprocess), the
kubelet emulator in this process with 50 pods holding devices; then ``kubedevice inspect -o
json`` as a process, timed from spawn to exit (5 runs), and its own in-report time. Then the
same with an 11th socket that accepts connections but never answers.

Targets (2 vCPUs): under 1 s; with one plugin that never answers, under 3 s.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("GRPC_VERBOSITY", "ERROR")  # before grpc loads: no shutdown chatter

from _common import PY, ROOT, cpu_model, terminate_all

from kubedevice.demo.generic import pod_manifest
from kubedevice.kubelet import Emulator

RAW = ROOT / "tests" / "kubelet" / "rawplugin.py"
ENV = {**os.environ, "GRPC_VERBOSITY": "ERROR"}
PLUGINS = 10
PER_PLUGIN = 1_000
PODS = 50
RUNS = 5


def _plugin(d: Path, i: int) -> subprocess.Popen[str]:
    resource = f"bench.example.com/r{i}"
    return subprocess.Popen(
        [PY, str(RAW), "--dir", str(d), "--resource", resource,
         "--count", str(PER_PLUGIN), "--prefix", f"r{i}-", "--numa", "2",
         "--name", f"r{i}.sock"],
        stdout=subprocess.PIPE, text=True, env=ENV,
    )  # fmt: skip


async def _inspect(dp_dir: Path) -> tuple[float, dict[str, Any], int]:
    start = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        PY, "-m", "kubedevice", "inspect", "-o", "json",
        "--device-plugin-dir", str(dp_dir),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL, env=ENV,
    )  # fmt: skip
    out, _ = await proc.communicate()
    wall = time.perf_counter() - start
    assert proc.returncode is not None
    return wall, json.loads(out), proc.returncode


def _summary(values: list[float]) -> dict[str, float]:
    return {
        "median_s": round(statistics.median(values), 3),
        "max_s": round(max(values), 3),
        "min_s": round(min(values), 3),
    }


async def _series(dp_dir: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    walls, own = [], []
    doc: dict[str, Any] = {}
    for _ in range(RUNS):
        wall, doc, _rc = await _inspect(dp_dir)
        walls.append(wall)
        own.append(doc["seconds"])
    return {"process_wall": _summary(walls), "in_report": _summary(own)}, doc


async def main() -> dict[str, Any]:
    base = Path(tempfile.mkdtemp(prefix="kdb-", dir="/tmp"))
    dp_dir = base / "dp"
    dp_dir.mkdir()
    procs: list[subprocess.Popen[str]] = []
    hang = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        async with Emulator(dp_dir, control_socket=False) as emu:
            procs = [_plugin(dp_dir, i) for i in range(PLUGINS)]
            for i in range(PLUGINS):
                await emu.wait_for_resource(
                    f"bench.example.com/r{i}", allocatable=PER_PLUGIN, timeout=60
                )
            for n in range(PODS):
                res = f"bench.example.com/r{n % PLUGINS}"
                await emu.apply_pod(pod_manifest(f"p{n}", res, 4))
            healthy, doc = await _series(dp_dir)
            ok = [p for p in doc["plugins"] if p["state"] == "ok"]
            assert len(ok) == PLUGINS, doc["plugins"]
            allocatable = doc["podResources"]["allocatable"]
            assert sum(len(ids) for ids in allocatable.values()) == PLUGINS * PER_PLUGIN
            assert len(doc["podResources"]["assigned"]) == PODS
            hang.bind(str(dp_dir / "hang.sock"))
            hang.listen(16)
            hanging, doc = await _series(dp_dir)
            states = sorted(p["state"] for p in doc["plugins"])
            assert states == ["no-answer"] + ["ok"] * PLUGINS, states
    finally:
        hang.close()
        terminate_all(procs)
        shutil.rmtree(base, ignore_errors=True)
    return {
        "benchmark": "inspect",
        "cpu_model": cpu_model(),
        "python": platform.python_version(),
        "plugins": PLUGINS,
        "devices": PLUGINS * PER_PLUGIN,
        "pods": PODS,
        "runs": RUNS,
        "all_answering": {**healthy, "target_s": 1.0},
        "one_never_answers": {**hanging, "timeout_s": 2.0, "target_s": 3.0},
    }


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main()), indent=2))

"""SIGTERM -> exit of each plugin daemon while it serves; prints one JSON object.

Each daemon runs as a process registered with its own ``kubedevice kubelet`` emulator
(which holds the ListAndWatch stream, as a kubelet does), with all its devices allocatable;
the time from ``kill(SIGTERM)`` to the process having exited (``waitpid``) is measured
``--runs`` times per daemon. The daemons: the SDK example (``examples/minimal.py``), the
generic plugin with 1,000 devices, the GPU plugin on the fake 8-GPU box, and a bare
``grpc.aio`` plugin (serve, register, hold the stream; SIGTERM's default action) as the
floor.

Usage: ``python bench/bench_stop.py [--runs 5]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import (
    KUBEDEVICE,
    PY,
    ROOT,
    cpu_model,
    gpu_plugin_command,
    start_emulator,
    wait_allocatable,
    write_generic_config,
)


def _stop_ms(root: Path, name: str, cmd: list[str], resource: str, count: int) -> float:
    d = root / name / "device-plugins"
    d.mkdir(parents=True)
    env = {**os.environ, "DP_DEVICE_PLUGIN_DIR": str(d)}
    emu = start_emulator(d, env)
    plugin: subprocess.Popen[bytes] | None = None
    try:
        plugin = subprocess.Popen(cmd, env=env, stderr=subprocess.DEVNULL)
        wait_allocatable(env, resource, count, 60)
        t0 = time.perf_counter()
        plugin.send_signal(signal.SIGTERM)
        plugin.wait(30)
        return (time.perf_counter() - t0) * 1000
    finally:
        for proc in (plugin, emu):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="kdstop-", dir="/tmp"))
    try:
        generic = write_generic_config(root, "stop", (f"dev{i:04d}" for i in range(1000)))
        gpu_root = root / "gpu-host"
        gpu_root.mkdir()
        daemons: dict[str, tuple[list[str], str, int]] = {
            "bare-grpc-aio-plugin": (
                [PY, str(ROOT / "bench/bench_memory.py"), "--bare-plugin"],
                "example.com/bare",
                4,
            ),
            "sdk-example": ([PY, str(ROOT / "examples/minimal.py")], "example.com/counter", 4),
            "generic-plugin-1000": (
                [KUBEDEVICE, "run", "--config", str(generic)],
                "example.com/stop",
                1000,
            ),
            "gpu-plugin-fake-8": (gpu_plugin_command(gpu_root), "nvidia.com/gpu", 8),
        }
        samples: dict[str, list[float]] = {name: [] for name in daemons}
        for run in range(args.runs):
            for name, (cmd, resource, count) in daemons.items():
                samples[name].append(_stop_ms(root, f"{name}-{run}", cmd, resource, count))
        result: dict[str, Any] = {
            "bench": "stop",
            "python": sys.version.split()[0],
            "cpu_model": cpu_model(),
            "load_average": os.getloadavg(),
            "runs": args.runs,
            "sigterm_to_exit_ms": {
                name: {
                    "median": round(statistics.median(xs), 1),
                    "max": round(max(xs), 1),
                    "each": [round(x, 1) for x in xs],
                }
                for name, xs in samples.items()
            },
        }
        print(json.dumps(result, indent=2))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

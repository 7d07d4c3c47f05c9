"""SIGTERM -> exit of each DRA driver while it serves and publishes; prints one JSON object.

Each driver runs as a process on a fake kubelet directory against a real API server (etcd
and kube-apiserver started for the run, or ``--kubeconfig``), with its devices published
and its sockets served; the time from ``kill(SIGTERM)`` to the process having exited
(its pidfd readable) is measured ``--runs`` times per driver. The drivers: the generic DRA driver
(``kubedevice run --dra``, 64 devices), the GPU DRA driver (``kubedevice nvidia dra`` on
the fake 8-GPU box) and the kit's example (``examples/dra_minimal.py``, ``dra.main``).

Usage: ``python bench/bench_dra_stop.py [--runs 5] [--kubeconfig FILE]``.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from _common import KUBEDEVICE, PY, ROOT, cpu_model, wait_for, write_generic_config
from bench_dra import api_server


def _commands(root: Path) -> dict[str, list[str]]:
    from kubedevice.nvidia.fake import FakeNvml, write_fake_dev, write_fake_sysfs

    nvml = FakeNvml.from_file("dgx-8gpu")
    write_fake_dev(nvml, root / "gpu" / "dev")
    write_fake_sysfs(nvml, root / "gpu" / "sys")
    nvml.close()
    generic = write_generic_config(root / "generic", "bench", [f"d{i}" for i in range(64)])
    return {
        "generic_dra": [KUBEDEVICE, "run", "--dra", "--config", str(generic),
                        "--driver-name", "dev.bench.example.com"],
        "gpu_dra": [KUBEDEVICE, "nvidia", "dra", "--nvml", "fake:dgx-8gpu",
                    "--dev-root", str(root / "gpu" / "dev"),
                    "--sys-root", str(root / "gpu" / "sys"),
                    "--driver-name", "gpu.bench.example.com"],
        "example_dra_main": [PY, str(ROOT / "examples" / "dra_minimal.py")],
    }  # fmt: skip


def _stop_ms(root: Path, argv: list[str], kubeconfig: Path, api: Any) -> float:
    node = f"bench-{uuid.uuid4().hex[:6]}"  # a fresh pool: the driver publishes it
    api.call("POST", "/api/v1/nodes", {"metadata": {"name": node}})
    kdir = root / f"k-{uuid.uuid4().hex[:6]}"
    (kdir / "plugins_registry").mkdir(parents=True)
    argv = [*argv, "--node-name", node, "--kubeconfig", str(kubeconfig),
            "--kubelet-dir", str(kdir), "--cdi-dir", str(kdir / "cdi")]  # fmt: skip
    log = kdir / "driver.log"
    with log.open("w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=out)
    try:
        try:
            wait_for(
                lambda: (
                    "published" in log.read_text() and any((kdir / "plugins_registry").iterdir())
                ),
                60,
                "the driver serving and published",
            )
        except RuntimeError:
            raise SystemExit(f"{argv[1:3]} did not start: {log.read_text()[-2000:]}") from None
        pidfd = os.pidfd_open(proc.pid)  # readable the moment the process exits (no polling)
        try:
            t0 = time.perf_counter()
            proc.send_signal(signal.SIGTERM)
            ready, _, _ = select.select([pidfd], [], [], 30)
            took = (time.perf_counter() - t0) * 1000
        finally:
            os.close(pidfd)
        if not ready:
            raise SystemExit(f"{argv[1:3]} did not exit within 30 s of SIGTERM")
        code = proc.wait(10)
        if code != 0:
            raise SystemExit(f"{argv[1:3]} exited {code}: {log.read_text()[-2000:]}")
        return took
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        shutil.rmtree(kdir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--kubeconfig", default=None)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="kd-bench-drastop-"))
    results: dict[str, object] = {}
    try:
        with api_server(args.kubeconfig) as kubeconfig:
            from dra.api import Api

            api = Api(kubeconfig)
            for name, argv in _commands(root).items():
                samples = [_stop_ms(root, argv, kubeconfig, api) for _ in range(args.runs)]
                results[name] = {
                    "median_ms": round(statistics.median(samples), 1),
                    "min_ms": round(min(samples), 1),
                    "max_ms": round(max(samples), 1),
                }
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps({
        "bench": "dra_stop", "runs": args.runs, "cpu": cpu_model(), "cpus": os.cpu_count(),
        "python": sys.version.split()[0], "sigterm_to_exit": results,
    }, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()

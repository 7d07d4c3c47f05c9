"""MIG on demand: the ResourceSlices of 8 H100s with every MIG placement published.

The GPU DRA driver (``dra.migOnDemand``) on the fake ``dgx-8gpu-mig`` machine, in this
process, against a real kube-apiserver (``--kubeconfig FILE``, else one started for the run,
as ``bench_dra.py`` does): from start to every slice written (seconds), the slices (how many:
counter-set slices and device slices), devices, and their size as the API server returns
them (bytes of JSON, total and largest slice).

Usage: ``python bench/bench_mig_ondemand.py [--kubeconfig FILE]``. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from _common import cpu_model
from bench_dra import api_server

import kubedevice.dra as dra
from kubedevice.dra.api.kube import KubeClient
from kubedevice.dra.node.server import DriverServer
from kubedevice.nvidia.config import Config
from kubedevice.nvidia.dra import GpuDraDriver
from kubedevice.nvidia.fake import FakeNvml, write_fake_dev, write_fake_sysfs


async def publish(kubeconfig: Path, kube: KubeClient, node: str) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="kd-bm-", dir="/tmp"))
    (root / "plugins_registry").mkdir()
    nvml = FakeNvml.from_file("dgx-8gpu-mig", state_file=root / "state.json")
    write_fake_dev(nvml, root / "dev")
    write_fake_sysfs(nvml, root / "sys")
    config = Config(version="v1").with_overrides(
        dev_root=str(root / "dev"), sys_root=str(root / "sys")
    )
    config = dataclasses.replace(config, dra=dataclasses.replace(config.dra, mig_on_demand=True))
    driver = GpuDraDriver(config, nvml)
    options = dra.DriverOptions(
        node_name=node, kubelet_dir=root, cdi_dir=root / "cdi", kubeconfig=kubeconfig
    )
    try:
        t0 = time.perf_counter()
        async with DriverServer(driver, options.resolved(driver)) as server:
            await server.wait_published()
            elapsed = time.perf_counter() - t0
            slices = kube.list_slices(driver.driver_name, node)
        sizes = [len(json.dumps(s, separators=(",", ":"))) for s in slices]
        await dra.cleanup(driver, options)
        return {
            "gpus": 8,
            "devices": sum(len(s["spec"].get("devices") or []) for s in slices),
            "counter_sets": sum(len(s["spec"].get("sharedCounters") or []) for s in slices),
            "slices": len(slices),
            "counter_set_slices": sum(1 for s in slices if s["spec"].get("sharedCounters")),
            "bytes_total": sum(sizes),
            "bytes_largest_slice": max(sizes),
            "start_to_published_s": round(elapsed, 3),
        }
    finally:
        nvml.close()
        shutil.rmtree(root, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", default=None)
    args = parser.parse_args()
    with api_server(args.kubeconfig) as kubeconfig:
        kube = KubeClient.connect(kubeconfig)
        node = f"bench-{uuid.uuid4().hex[:6]}"
        kube._call("POST", "/api/v1/nodes", body={"metadata": {"name": node}})
        try:
            result = asyncio.run(publish(kubeconfig, kube, node))
        finally:
            kube._call("DELETE", f"/api/v1/nodes/{node}")
            kube.close()
    out = {
        "machine": cpu_model(),
        "load_1m": round(os.getloadavg()[0], 2),
        "python": sys.version.split()[0],
        **result,
    }
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

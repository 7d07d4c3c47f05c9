"""The DRA driver kit: NodePrepareResources latency over the socket, and publishing slices.

Needs a real kube-apiserver: ``--kubeconfig FILE``, else etcd and one are started for the run
from the binaries the tests use (``$KUBEDEVICE_K8S_BIN``; tests/e2e/README.md), on free
ports, and stopped after.

* ``prepare``: ``examples/dra_minimal.py`` as a process; a synchronous grpcio client calls
  NodePrepareResources (v1) with 1 and with 8 claims per call, every claim new (allocated
  in the API server beforehand), so each call reads the claims, runs the hook, writes the CDI
  specs and saves the checkpoint; then the same calls again (``again``: answered from the
  checkpoint, what a second pod sharing a claim gets). Unprepare is timed by
  ``bench/bench_dra_daemon.py`` (with the drivers' memory and idle CPU).
* ``publish``: a driver with ``--devices`` devices in this process: from start to every
  slice written (slices written, seconds), then one device changed (generation bump:
  seconds), then a restart adopting the unchanged slices (slices written: 0).

Usage: ``python bench/bench_dra.py [--kubeconfig FILE] [--calls 60] [--devices 1000]``.
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
from _common import PY, ROOT, cpu_model, pct

import kubedevice.dra as dra
from kubedevice._api.dra.v1 import api_pb2 as v1, api_pb2_grpc as v1_grpc
from kubedevice._api.pluginregistration.v1 import api_pb2 as reg, api_pb2_grpc as reg_grpc
from kubedevice.dra.api.kube import KubeClient
from kubedevice.dra.node.server import DriverServer

EXAMPLE_DRIVER = "counter.example.com"


@contextmanager
def api_server(kubeconfig: str | None) -> Iterator[Path]:
    """``--kubeconfig``'s API server, else etcd and a kube-apiserver started for the run from
    the binaries the tests use (``$KUBEDEVICE_K8S_BIN``; tests/e2e/README.md)."""
    if kubeconfig:
        yield Path(kubeconfig)
        return
    sys.path.insert(0, str(ROOT / "tests"))
    from dra.conftest import api_server as start_api_server
    from e2e.cluster import find_binaries

    bin_dir = find_binaries(ROOT)
    if bin_dir is None:
        raise SystemExit("bench_dra: no API server: pass --kubeconfig or set KUBEDEVICE_K8S_BIN")
    with start_api_server(bin_dir) as path:
        yield path


def _claims(kube: KubeClient, node: str, count: int) -> list[v1.Claim]:
    base = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"
    out = []
    for i in range(count):
        body = {
            "metadata": {"name": f"bench-{uuid.uuid4().hex[:10]}", "namespace": "default"},
            "spec": {
                "devices": {
                    "requests": [{"name": "c", "exactly": {"deviceClassName": "x", "count": 1}}]
                }
            },
        }
        claim = kube.call("POST", base, body=body)
        claim["status"] = {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "c",
                            "driver": EXAMPLE_DRIVER,
                            "pool": node,
                            "device": f"counter-{i % 4}",
                        }
                    ]
                }
            }
        }
        kube.call("PUT", f"{base}/{claim['metadata']['name']}/status", body=claim)
        out.append(
            v1.Claim(
                namespace="default", name=claim["metadata"]["name"], uid=claim["metadata"]["uid"]
            )
        )
    return out


def bench_prepare(kubeconfig: Path, kube: KubeClient, node: str, calls: int) -> dict[str, Any]:
    kdir = Path(tempfile.mkdtemp(prefix="kd-b-", dir="/tmp"))
    (kdir / "plugins_registry").mkdir()
    reg_sock = kdir / "plugins_registry" / f"{EXAMPLE_DRIVER}-reg.sock"
    proc = subprocess.Popen(
        [
            PY,
            str(ROOT / "examples" / "dra_minimal.py"),
            "--node-name",
            node,
            "--kubeconfig",
            str(kubeconfig),
            "--kubelet-dir",
            str(kdir),
            "--cdi-dir",
            str(kdir / "cdi"),
            "--log-level",
            "warning",
        ]
    )
    try:
        deadline = time.monotonic() + 60
        while not reg_sock.exists():  # start-up of the child; not what is measured
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("the example driver did not start")
            time.sleep(0.05)
        with grpc.insecure_channel(f"unix:{reg_sock}") as channel:
            info = reg_grpc.RegistrationStub(channel).GetInfo(reg.InfoRequest(), timeout=10)
        out: dict[str, Any] = {}
        with grpc.insecure_channel(f"unix:{info.endpoint}") as channel:
            stub = v1_grpc.DRAPluginStub(channel)
            for per_call in (1, 8):
                batches = [_claims(kube, node, per_call) for _ in range(calls)]
                first: list[float] = []
                again: list[float] = []
                for timings in (first, again):
                    for batch in batches:
                        request = v1.NodePrepareResourcesRequest(claims=batch)
                        t0 = time.perf_counter_ns()
                        answer = stub.NodePrepareResources(request, timeout=30)
                        timings.append((time.perf_counter_ns() - t0) / 1e6)
                        errors = [c.error for c in answer.claims.values() if c.error]
                        if errors:
                            raise RuntimeError(f"prepare failed: {errors[0]}")
                for batch in batches:
                    stub.NodeUnprepareResources(
                        v1.NodeUnprepareResourcesRequest(claims=batch), timeout=30
                    )
                out[f"claims_{per_call}"] = {
                    "calls": calls,
                    "p50_ms": round(pct(first, 0.5), 2),
                    "p99_ms": round(pct(first, 0.99), 2),
                    "again_p50_ms": round(pct(again, 0.5), 3),
                    "again_p99_ms": round(pct(again, 0.99), 3),
                }
        return out
    finally:
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(kdir, ignore_errors=True)


class _Many(dra.Driver):
    driver_name = "bench.kubedevice.io"

    def __init__(self, count: int) -> None:
        self.queue: asyncio.Queue[Sequence[dra.Device]] = asyncio.Queue()
        self.queue.put_nowait(self.make(count, "a"))

    @staticmethod
    def make(count: int, model: str) -> list[dra.Device]:
        return [
            dra.Device(
                name=f"dev-{i}",
                attributes={"index": i, "model": model, "numa": i % 2, "fw": dra.Version("1.0.0")},
                capacity={"memory": "16Gi"},
            )
            for i in range(count)
        ]

    async def devices(self) -> AsyncIterator[Sequence[dra.Device]]:
        while True:
            yield await self.queue.get()


async def bench_publish(kubeconfig: Path, node: str, count: int) -> dict[str, Any]:
    kdir = Path(tempfile.mkdtemp(prefix="kd-b-", dir="/tmp"))
    (kdir / "plugins_registry").mkdir()
    options = dra.DriverOptions(
        node_name=node, kubelet_dir=kdir, cdi_dir=kdir / "cdi", kubeconfig=kubeconfig
    )
    try:
        driver = _Many(count)
        t0 = time.perf_counter()
        async with DriverServer(driver, options.resolved(driver)) as server:
            await server.wait_published()
            start = time.perf_counter() - t0
            assert server.publisher is not None
            written = server.publisher.writes
            changed = _Many.make(count, "a")
            changed[count // 2] = _Many.make(count, "b")[count // 2]
            t1 = time.perf_counter()
            driver.queue.put_nowait(changed)
            await asyncio.sleep(0)  # the device list reaches the publisher
            await server.wait_published()
            change = time.perf_counter() - t1
            change_writes = server.publisher.writes - written
        again = _Many(count)
        again.queue = asyncio.Queue()
        again.queue.put_nowait(changed)
        t2 = time.perf_counter()
        async with DriverServer(again, options.resolved(again)) as server:
            await server.wait_published()
            restart = time.perf_counter() - t2
            assert server.publisher is not None
            restart_writes = server.publisher.writes
        cleanup = await dra.cleanup(again, options)
        return {
            "devices": count,
            "start_to_published_s": round(start, 3),
            "slices_written": written,
            "change_one_device_s": round(change, 3),
            "change_slices_written": change_writes,
            "restart_adopt_s": round(restart, 3),
            "restart_slices_written": restart_writes,
            "cleanup_removed": cleanup,
        }
    finally:
        shutil.rmtree(kdir, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", default=None)
    parser.add_argument("--calls", type=int, default=60)
    parser.add_argument("--devices", type=int, default=1000)
    args = parser.parse_args()
    with api_server(args.kubeconfig) as kubeconfig:
        kube = KubeClient.connect(kubeconfig)
        node = f"bench-{uuid.uuid4().hex[:6]}"
        kube.call("POST", "/api/v1/nodes", body={"metadata": {"name": node}})
        try:
            publish = asyncio.run(bench_publish(kubeconfig, node, args.devices))
            prepare = bench_prepare(kubeconfig, kube, node, args.calls)
        finally:
            kube.call("DELETE", f"/api/v1/nodes/{node}")
            kube.close()
    result = {
        "machine": cpu_model(),
        "load_1m": round(os.getloadavg()[0], 2),
        "python": sys.version.split()[0],
        "kubernetes_client": _client_version(),
        "prepare": prepare,
        "publish": publish,
    }
    print(json.dumps(result, indent=2))
    return 0


def _client_version() -> str:
    import kubernetes

    return str(kubernetes.__version__)


if __name__ == "__main__":
    raise SystemExit(main())

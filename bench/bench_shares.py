"""Memory shares of one GPU: NodePrepareResources latency over the socket, per share.

``kubedevice nvidia dra --memory-shares --nvml fake:one-gpu-80gib`` runs as a process (its
fake /dev and /sys written first) against a real kube-apiserver (``--kubeconfig FILE``, else
etcd and one are started from the binaries the tests use). A synchronous grpcio client
calls NodePrepareResources (v1), one claim per call, each claim a new share of ``gpu-0``
(its allocation, with a ``shareID`` and ``consumedCapacity``, written in the API server
beforehand):

* ``new_share``: the claim is read, checked against every share already prepared on the
  node (the one-device-two-claims guard; the number held grows to ``--calls``), the hook
  runs, the claim's CDI spec and the checkpoint are written;
* ``existing_share``: the same calls again: answered from the checkpoint (what a second
  pod using one claim gets).

Unprepare is not timed. Usage: ``python bench/bench_shares.py [--kubeconfig FILE]
[--calls 300]``. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import grpc
from _common import KUBEDEVICE, cpu_model, pct, wait_for
from bench_dra import api_server

from kubedevice._api.dra.v1 import api_pb2 as v1, api_pb2_grpc as v1_grpc
from kubedevice._api.pluginregistration.v1 import api_pb2 as reg, api_pb2_grpc as reg_grpc
from kubedevice.dra.api.kube import KubeClient
from kubedevice.nvidia.fake import FakeNvml, write_fake_dev, write_fake_sysfs

DRIVER = "gpu.kubedevice.io"
MACHINE = "one-gpu-80gib"


def _share_claims(kube: KubeClient, node: str, count: int) -> list[v1.Claim]:
    base = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"
    out = []
    for _ in range(count):
        body = {
            "metadata": {"name": f"share-{uuid.uuid4().hex[:10]}", "namespace": "default"},
            "spec": {
                "devices": {
                    "requests": [{"name": "gpu", "exactly": {"deviceClassName": "x", "count": 1}}]
                }
            },
        }
        claim = kube.call("POST", base, body=body)
        result = {
            "request": "gpu",
            "driver": DRIVER,
            "pool": node,
            "device": "gpu-0",
            "shareID": str(uuid.uuid4()),
            "consumedCapacity": {"memory": "1Gi"},
        }
        claim["status"] = {"allocation": {"devices": {"results": [result]}}}
        kube.call("PUT", f"{base}/{claim['metadata']['name']}/status", body=claim)
        meta = claim["metadata"]
        out.append(v1.Claim(namespace="default", name=meta["name"], uid=meta["uid"]))
    return out


def bench(kubeconfig: Path, kube: KubeClient, node: str, calls: int) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="kd-bs-", dir="/tmp"))
    kdir = root / "kubelet"
    (kdir / "plugins_registry").mkdir(parents=True)
    nvml = FakeNvml.from_file(MACHINE)
    write_fake_dev(nvml, root / "dev")
    write_fake_sysfs(nvml, root / "sys")
    nvml.close()
    (root / "gpu.yaml").write_text("version: v1\n")
    reg_sock = kdir / "plugins_registry" / f"{DRIVER}-reg.sock"
    proc = subprocess.Popen(
        [KUBEDEVICE, "--log-level", "warning", "nvidia", "dra", "--memory-shares",
         "--config", str(root / "gpu.yaml"), "--nvml", f"fake:{MACHINE}",
         "--dev-root", str(root / "dev"), "--sys-root", str(root / "sys"),
         "--node-name", node, "--kubeconfig", str(kubeconfig),
         "--kubelet-dir", str(kdir), "--cdi-dir", str(root / "cdi")],
        env={**os.environ, "KUBEDEVICE_FAKE_NVML_CONTROL": str(root / "nvml.sock")},
    )  # fmt: skip
    try:
        wait_for(lambda: reg_sock.exists() or proc.poll() is not None, 60, "the driver")
        if proc.poll() is not None:
            raise RuntimeError("the GPU DRA driver did not start")
        with grpc.insecure_channel(f"unix:{reg_sock}") as channel:
            info = reg_grpc.RegistrationStub(channel).GetInfo(reg.InfoRequest(), timeout=10)
        claims = _share_claims(kube, node, calls)
        new: list[float] = []
        again: list[float] = []
        with grpc.insecure_channel(f"unix:{info.endpoint}") as channel:
            stub = v1_grpc.DRAPluginStub(channel)
            for timings in (new, again):
                for claim in claims:
                    request = v1.NodePrepareResourcesRequest(claims=[claim])
                    t0 = time.perf_counter_ns()
                    answer = stub.NodePrepareResources(request, timeout=30)
                    timings.append((time.perf_counter_ns() - t0) / 1e6)
                    [got] = answer.claims.values()
                    if got.error or not got.devices[0].share_id:
                        raise RuntimeError(f"prepare failed: {got.error or 'no share ID'}")
            for claim in claims:
                stub.NodeUnprepareResources(
                    v1.NodeUnprepareResourcesRequest(claims=[claim]), timeout=30
                )
        return {
            "calls": calls,
            "new_share": {
                "p50_ms": round(pct(new, 0.5), 2),
                "p99_ms": round(pct(new, 0.99), 2),
                "first_50_p50_ms": round(pct(new[:50], 0.5), 2),
                "last_50_p50_ms": round(pct(new[-50:], 0.5), 2),
            },
            "existing_share": {
                "p50_ms": round(pct(again, 0.5), 3),
                "p99_ms": round(pct(again, 0.99), 3),
            },
        }
    finally:
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(root, ignore_errors=True)


def main() -> int:
    import json

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", default=None)
    parser.add_argument("--calls", type=int, default=300)
    args = parser.parse_args()
    with api_server(args.kubeconfig) as kubeconfig:
        kube = KubeClient.connect(kubeconfig)
        node = f"bench-{uuid.uuid4().hex[:6]}"
        kube.call("POST", "/api/v1/nodes", body={"metadata": {"name": node}})
        try:
            result = bench(kubeconfig, kube, node, args.calls)
        finally:
            kube.call("DELETE", f"/api/v1/nodes/{node}")
            kube.close()
    print(
        json.dumps(
            {
                "machine": cpu_model(),
                "load_1m": round(os.getloadavg()[0], 2),
                "python": sys.version.split()[0],
                "prepare": result,
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

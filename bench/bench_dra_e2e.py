"""Benchmark of the GPU DRA driver on the real Kubernetes components; prints JSON.

Brings up the end-to-end tier's cluster (``tests/e2e/cluster.py``: etcd, kube-apiserver,
kube-scheduler, kube-controller-manager, a real kubelet with kd-fakecri; binaries from
``$KUBEDEVICE_K8S_BIN``, found as the end-to-end tier finds them) and measures, with
``kubedevice nvidia dra --nvml fake:dgx-8gpu`` as a real process:

* driver start -> slices published: process spawn until a watch of the API server shows the
  driver's ResourceSlices with all 8 GPUs (the slices are deleted between runs);
* pod created -> Running: a pod with a 1-GPU claim from a ResourceClaimTemplate, from the
  create call until a watch shows it Running (scheduler allocation, the kubelet's
  NodePrepareResources, the CDI spec written, the runtime's CreateContainer/Start).

Needs root (a real kubelet); re-runs itself in a private mount namespace, as scripts/e2e
does, so no other kubelet's device-plugin directory is touched.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from _common import cpu_model, e2e_cluster, pct  # noqa: E402

DRIVER = "gpu.kubedevice.io"


def _slices_ready(api: Any, count: int) -> bool:
    items = api.list_resource_slice(field_selector=f"spec.driver={DRIVER}").items
    return sum(len(s.spec.devices or []) for s in items) == count


def _watch_until(list_fn: Any, predicate: Any, timeout: float, **kwargs: Any) -> float:
    """List then watch until ``predicate(obj)``; return the monotonic time it was seen."""
    from e2e.cluster import wait_for

    wait_for(list_fn, predicate, timeout, "bench", **kwargs)
    return time.monotonic()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=5)
    parser.add_argument("--pods", type=int, default=10)
    args = parser.parse_args()
    from e2e.cluster import NODE, namespace
    from e2e.dra import (
        POD_TIMEOUT,
        REGISTERED,
        GpuDra,
        claim_pod,
        claim_spec,
        create_template,
        delete_pod,
        device_class,
        log_count,
        request,
    )
    from kubernetes import client

    out: dict[str, Any] = {"machine": cpu_model(), "kubernetes": "v1.36.2", "gpus": 8}
    with e2e_cluster("bench_dra_e2e") as cluster:
        api = client.ResourceV1Api(cluster.api)
        start_slices: list[float] = []
        for _ in range(args.starts):
            drv = GpuDra(cluster)
            before = log_count(drv.log, REGISTERED)
            t0 = time.monotonic()
            drv.start(wait=False)
            t_slices = _watch_until(
                api.list_resource_slice,
                lambda _s: _slices_ready(api, 8),
                60,
                field_selector=f"spec.driver={DRIVER}",
            )
            start_slices.append((t_slices - t0) * 1000)
            drv.wait_registered(before + 1)
            drv.close()
            for s in api.list_resource_slice(field_selector=f"spec.driver={DRIVER}").items:
                api.delete_resource_slice(s.metadata.name)
        out["driver_start_to_slices_ms_p50"] = statistics.median(start_slices)
        out["driver_start_to_slices_ms_max"] = max(start_slices)

        drv = GpuDra(cluster)
        drv.start()
        running: list[float] = []
        with (
            namespace(cluster, "bench") as ns,
            device_class(cluster, f'device.driver == "{DRIVER}"') as cls,
        ):
            create_template(cluster, ns, "one", claim_spec(request("gpu", cls)))
            for i in range(args.pods + 1):
                name = f"p{i}"
                t0 = time.monotonic()
                cluster.create_pod(ns, claim_pod(name, template="one"))
                cluster.wait_running(ns, name, timeout=POD_TIMEOUT)
                if i:  # the first pod warms the scheduler's and kubelet's caches
                    running.append((time.monotonic() - t0) * 1000)
                delete_pod(cluster, ns, name)
        drv.close()
        # a pod the kubelet could not prepare at once (its node authorizer race, see
        # tests/e2e/dra.py POD_TIMEOUT) waits for the kubelet's next pod sync: counted apart
        slow = [t for t in running if t > 30_000]
        out["pods_waiting_for_kubelet_resync"] = len(slow)
        running = [t for t in running if t <= 30_000] or running
        out["pod_created_to_running_ms_p50"] = statistics.median(running)
        out["pod_created_to_running_ms_p90"] = pct(running, 0.9)
        out["pod_created_to_running_ms_max"] = max(running)
        out["node"] = NODE
        out["runs"] = {"starts": args.starts, "pods": args.pods}
        out["load_1m"] = os.getloadavg()[0]
    print(json.dumps({k: round(v, 1) if isinstance(v, float) else v for k, v in out.items()}))


if __name__ == "__main__":
    main()

"""Benchmark of a rolling upgrade of the GPU DRA driver under pod churn; prints JSON.

Brings up the end-to-end tier's cluster (``tests/e2e/cluster.py``: etcd, kube-apiserver,
kube-scheduler, kube-controller-manager, a real kubelet with kd-fakecri) and runs
``kubedevice nvidia dra --nvml fake:dgx-8gpu --pod-uid A`` as a real process. Pods with a
1-GPU claim are created every 100 ms, at most 3 on their way to Running at a time, each
deleted once Running (``tests/e2e/churn.py``). Two runs of ``--pods`` pods each:

* ``steady``: instance A alone;
* ``upgrade``: after a third of the pods, instance B (``--pod-uid B``, the same trees)
  starts beside A; once the kubelet has registered B, A gets SIGTERM; the churn goes on
  through B.

Per run: pod created -> Running p50/p99 (from the create call until a watch shows it
Running), the FailedPrepareDynamicResources events a driver caused (a NodePrepareResources
that failed), the kubelet's own claim reads refused by the node authorizer (no driver called:
the pod waits for the kubelet's next pod sync, 10 s here; counted apart, with and without
those pods in the figures), and for the upgrade the ResourceSlice writes between B's start
and the end of the run (resourceVersions compared) and B's start -> registered time.

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
from bench_dra_e2e import DRIVER  # noqa: E402

UID_A = "aaaaaaaa-0000-4000-8000-00000000000a"
UID_B = "bbbbbbbb-0000-4000-8000-00000000000b"


def _slice_versions(cluster: Any) -> dict[str, str]:
    from e2e.dra import resource_api

    items = resource_api(cluster).list_resource_slice(field_selector=f"spec.driver={DRIVER}")
    return {s.metadata.name: s.metadata.resource_version for s in items.items}


def _figures(churn: Any) -> dict[str, Any]:
    raced = {m.split(":", 1)[0] for m in churn.claim_read_retries}
    all_ms = [t * 1000 for t in churn.running.values()]
    clean_ms = [t * 1000 for n, t in churn.running.items() if n not in raced] or all_ms
    return {
        "pods_running": len(churn.running),
        "failed_prepares": len(churn.failed_prepares),
        "pods_with_kubelet_claim_read_retry": len(raced),
        "pod_to_running_ms_p50": statistics.median(all_ms),
        "pod_to_running_ms_p99": pct(all_ms, 0.99),
        "pod_to_running_ms_p50_without_retried": statistics.median(clean_ms),
        "pod_to_running_ms_p99_without_retried": pct(clean_ms, 0.99),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=45)
    args = parser.parse_args()
    from e2e.churn import PodChurn
    from e2e.cluster import namespace
    from e2e.dra import GpuDra, claim_spec, device_class, request

    from kubedevice.nvidia.fake.control import CONTROL_ENV

    out: dict[str, Any] = {"machine": cpu_model(), "kubernetes": "v1.36.2", "gpus": 8}
    with e2e_cluster("bench_dra_upgrade") as cluster:
        a = GpuDra(cluster, extra=("--pod-uid", UID_A))
        a.start()
        with device_class(cluster, f'device.driver == "{DRIVER}"') as cls:
            spec = claim_spec(request("gpu", cls))
            with namespace(cluster, "bench-steady") as ns:
                churn = PodChurn(cluster, ns, spec, interval=0.1, in_flight=3)
                churn.start()
                try:
                    churn.wait_running(args.pods, timeout=300)
                finally:
                    churn.stop(timeout=120)
                out["steady"] = _figures(churn)
            with namespace(cluster, "bench-upgrade") as ns:
                b = a.sibling(["--pod-uid", UID_B], env={CONTROL_ENV: str(a.root / "b.sock")})
                churn = PodChurn(cluster, ns, spec, interval=0.1, in_flight=3)
                churn.start()
                try:
                    churn.wait_running(args.pods // 3, timeout=300)
                    before = _slice_versions(cluster)
                    t0 = time.monotonic()
                    b.start()  # until the kubelet has registered it
                    registered_ms = (time.monotonic() - t0) * 1000
                    a.stop()
                    churn.wait_running(args.pods, timeout=300)
                finally:
                    churn.stop(timeout=120)
                after = _slice_versions(cluster)
                out["upgrade"] = {
                    **_figures(churn),
                    "slice_writes": sum(after.get(n) != v for n, v in before.items())
                    + len(set(after) - set(before)),
                    "b_start_to_registered_ms": registered_ms,
                }
                b.stop()
        a.close()
        out["runs"] = {"pods": args.pods, "interval_s": 0.1, "in_flight": 3}
        out["load_1m"] = os.getloadavg()[0]

    def rounded(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: rounded(x) for k, x in v.items()}
        return round(v, 1) if isinstance(v, float) else v

    print(json.dumps(rounded(out)))


if __name__ == "__main__":
    main()

"""Pods on the real runtime (containerd + runc) next to the fake one (kd-fakecri); prints JSON.

On the end-to-end tier's cluster (real etcd, API server, scheduler, controller manager and
kubelet), once with ``kd-fakecri`` and once with containerd 2.4 + runc (the tier's real
runtime, tests/e2e/README.md):

* a pod asking for 1 GPU (the GPU device plugin, fake NVML) created -> Running (API create to
  the Running watch event; on containerd a busybox container really started);
* a pod with a 1-GPU claim (the GPU DRA driver) created -> Running;
* containerd only: the chart's DaemonSet pod (the project's image, ``scripts/build-image``)
  created -> the Node shows its resource (``--image``; the build is not timed);
* containerd only: a node "reboot" (kubelet, runtime, plugin stop; all start again) -> the
  device-plugin pod's new container running (from the runtime's start).

Needs root and the binaries (as the tier); without them it prints one line and exits 0. Runs
itself in a private mount namespace, as ``scripts/e2e`` does.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from _common import ROOT, cpu_model

sys.path.insert(0, str(ROOT / "tests"))

from e2e.cluster import Cluster, find_binaries, namespace, pod_manifest
from e2e.dra import GpuDra, claim_spec, create_template, device_class, release, request
from e2e.plugins import GpuDaemon
from e2e.real import claim_show_pod, real_nvidia_nodes, show_pod
from e2e.runtime import find_runtime

GPU = "nvidia.com/gpu"
DRIVER = "gpu.kubedevice.io"
IS_GPU = f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].type == "gpu"'
DP = "/var/lib/kubelet/device-plugins"


def ms(seconds: float) -> float:
    return round(seconds * 1000, 1)


def summary(samples: list[float]) -> dict[str, float]:
    return {"median_ms": round(statistics.median(samples), 1), "min_ms": min(samples),
            "max_ms": max(samples), "runs": len(samples)}  # fmt: skip


def _pod(runtime: str, name: str, limits: dict[str, int]) -> dict[str, Any]:
    if runtime == "containerd":
        return show_pod(name, limits, keep_running=True)
    return pod_manifest(name, limits)


def _claim_pod(runtime: str, name: str) -> dict[str, Any]:
    if runtime == "containerd":
        return claim_show_pod(name, template="one")
    m = claim_show_pod(name, template="one")
    m["spec"]["containers"][0]["image"] = "registry.k8s.io/pause:3.10"
    return m


def _created_to_running(c: Cluster, ns: str, manifest: dict[str, Any]) -> float:
    t0 = time.monotonic()
    c.create_pod(ns, manifest)
    c.wait_running(ns, manifest["metadata"]["name"], timeout=150)
    return ms(time.monotonic() - t0)


@contextlib.contextmanager
def _cluster(bin_dir: Path, runtime: str, runtime_dir: Path | None) -> Iterator[Cluster]:
    workdir = Path(tempfile.mkdtemp(prefix="kdb-", dir="/tmp"))
    c = Cluster.start(bin_dir, workdir, runtime=runtime, runtime_dir=runtime_dir)
    try:
        yield c
    finally:
        c.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def measure(bin_dir: Path, runtime: str, runtime_dir: Path | None, runs: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with _cluster(bin_dir, runtime, runtime_dir) as c, namespace(c, f"bench-{runtime}") as ns:
        gpus = GpuDaemon(c)
        with real_nvidia_nodes(gpus.nvml.machine.dev_nodes) if runtime == "containerd" else (
            contextlib.nullcontext()
        ):  # fmt: skip
            gpus.start()
            c.wait_resource(GPU, allocatable=8)
            out["device_plugin_pod_created_to_running"] = summary(
                [_created_to_running(c, ns, _pod(runtime, f"dp-{i}", {GPU: 1}))
                 for i in range(runs)]
            )  # fmt: skip
            if runtime == "containerd":
                out["node_reboot_to_containers_running"] = summary(
                    [_reboot(c, ns, gpus, i) for i in range(runs)]
                )
            c.delete_pods(ns)
            gpus.close()
            drv = GpuDra(c)
            drv.start()
            try:
                with device_class(c, IS_GPU) as cls:
                    create_template(c, ns, "one", claim_spec(request("gpu", cls)))
                    out["dra_claim_pod_created_to_running"] = summary(
                        [_created_to_running(c, ns, _claim_pod(runtime, f"dra-{i}"))
                         for i in range(runs)]
                    )  # fmt: skip
                    release(c, ns, [drv])
            finally:
                drv.close()
    return out


def _reboot(c: Cluster, ns: str, gpus: GpuDaemon, i: int) -> float:
    """Stop kubelet, plugin and runtime; start all again; time from the runtime's start to
    every device-plugin pod's new container running."""
    assert c.kubelet is not None
    since = datetime.datetime.fromtimestamp(math.ceil(time.time()), datetime.UTC)
    time.sleep(max(0.0, since.timestamp() - time.time()))  # a start time after `since`
    c.kubelet.stop()
    gpus.stop()
    c.kubelet.stop_runtime()
    t0 = time.monotonic()
    c.kubelet.start_runtime()
    gpus.start()
    c.kubelet.start()
    names = [p.metadata.name for p in c.core.list_namespaced_pod(ns).items]
    for name in names:
        c.wait_pod(
            ns,
            name,
            lambda p: any(
                s.state.running and s.state.running.started_at >= since
                for s in p.status.container_statuses or []
            ),
            150,
            "running again",
        )
    return ms(time.monotonic() - t0)


def reexec_in_namespace() -> None:
    if os.environ.get("KUBEDEVICE_E2E_IN_NS"):
        return
    os.makedirs(DP, exist_ok=True)
    os.environ["KUBEDEVICE_E2E_IN_NS"] = "1"
    script = 'mount -t tmpfs -o mode=0755 tmpfs "$1" && shift && exec "$@"'
    argv = ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", DP]
    os.execvp("unshare", [*argv, sys.executable, *sys.argv])


def daemonset_to_node(bin_dir: Path, runtime_dir: Path, runs: int) -> dict[str, Any]:
    """The chart's generic DaemonSet (our image): created -> the Node shows kubedevice.io/fuse."""
    from deploy.render import by_kind, render
    from kubernetes import client

    with _cluster(bin_dir, "containerd", runtime_dir) as c:
        assert c.containerd is not None
        tar = c.workdir / "image.tar"
        subprocess.run(
            [sys.executable, str(ROOT / "scripts" / "build_image.py"), "--out", str(tar),
             "--tag", "localhost/kubedevice:bench"], check=True, capture_output=True,
            env={**os.environ, "KUBEDEVICE_MKIMAGE": str(runtime_dir / "mkimage.py")},
        )  # fmt: skip
        c.containerd.import_image(tar)
        apps = client.AppsV1Api(c.api)
        samples = []
        for i in range(runs):
            with namespace(c, f"bench-ds-{i}") as ns:
                docs = render(namespace=ns, values={
                    "image.repository": "localhost/kubedevice", "image.tag": "bench"})  # fmt: skip
                [cm] = by_kind(docs, "ConfigMap")
                [ds] = by_kind(docs, "DaemonSet")
                c.core.create_namespaced_config_map(ns, cm)
                t0 = time.monotonic()
                apps.create_namespaced_daemon_set(ns, ds)
                c.wait_resource("kubedevice.io/fuse", allocatable=10, timeout=120)
                samples.append(ms(time.monotonic() - t0))
                apps.delete_namespaced_daemon_set(ds["metadata"]["name"], ns)
                c.delete_pods(ns)
                c.wait_resource("kubedevice.io/fuse", allocatable=0, timeout=120)
        return summary(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--image", action="store_true", help="also the DaemonSet (builds it)")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench_containerd: skipped: a real kubelet needs root")
        return
    bin_dir, runtime_dir = find_binaries(ROOT), find_runtime(ROOT)
    if bin_dir is None or runtime_dir is None:
        print("bench_containerd: skipped: no Kubernetes binaries or runtime (tests/e2e/README.md)")
        return
    reexec_in_namespace()
    sys.path.insert(0, str(ROOT / "tests"))
    result: dict[str, Any] = {
        "machine": cpu_model(),
        "python": sys.version.split()[0],
        "fakecri": measure(bin_dir, "fakecri", None, args.runs),
        "containerd": measure(bin_dir, "containerd", runtime_dir, args.runs),
    }
    if args.image:
        result["containerd"]["daemonset_pod_created_to_node_resource"] = daemonset_to_node(
            bin_dir, runtime_dir, args.runs
        )
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

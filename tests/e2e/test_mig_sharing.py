"""Beyond whole GPUs, on the real kubelet: MIG devices as their own resources (`migStrategy:
mixed`, one socket and registration each) and time-sliced replicas."""

from __future__ import annotations

from .cluster import Cluster, envs, pod_manifest
from .conftest import GPU

MIG_MIXED = "version: v1\nflags:\n  migStrategy: mixed\n"
MIG_RESOURCES = {
    "nvidia.com/mig-1g.18gb": 4,
    "nvidia.com/mig-2g.35gb": 2,
    "nvidia.com/mig-3g.71gb": 2,
    "nvidia.com/mig-4g.71gb": 1,
    "nvidia.com/mig-1g.35gb": 2,
    GPU: 1,
}
TIME_SLICED = """\
version: v1
sharing:
  timeSlicing:
    resources:
      - name: nvidia.com/gpu
        replicas: 4
"""


def test_mig_mixed_resources_register_and_a_pod_gets_a_mig_device(
    cluster: Cluster, ns: str, gpu_plugin
) -> None:
    plugin = gpu_plugin(MIG_MIXED, machine="mig-mixed", resources=tuple(MIG_RESOURCES))
    for resource, count in MIG_RESOURCES.items():
        cluster.wait_resource(resource, capacity=count, allocatable=count)
    cluster.run_pod(ns, pod_manifest("mig", {"nvidia.com/mig-1g.18gb": 1}))
    rec = cluster.kubelet.created(ns, "mig", "main")
    visible = envs(rec)["NVIDIA_VISIBLE_DEVICES"]
    migs = {m.uuid: m for g in plugin.nvml.machine.gpus for m in g.mig}
    assert migs[visible].profile == "1g.18gb"
    nodes = {d["container_path"] for d in rec["devices"]}
    caps = {f"/dev/nvidia-caps/nvidia-cap{c}" for c in migs[visible].cap_minors}
    assert caps <= nodes


def test_time_sliced_replicas_share_one_gpu(cluster: Cluster, ns: str, gpu_plugin) -> None:
    plugin = gpu_plugin(TIME_SLICED)
    cluster.wait_resource(GPU, capacity=32, allocatable=32)
    cluster.run_pod(ns, pod_manifest("a", {GPU: 1}))
    cluster.run_pod(ns, pod_manifest("b", {GPU: 1}))
    got = [envs(cluster.kubelet.created(ns, p, "main"))["NVIDIA_VISIBLE_DEVICES"] for p in "ab"]
    assert all(g in plugin.uuids for g in got)

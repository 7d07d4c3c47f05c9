"""Item 2: pods asking for our devices are scheduled by the real scheduler, the real kubelet
calls GetPreferredAllocation and Allocate, and the runtime gets what the plugin answered."""

from __future__ import annotations

import itertools
import json

from .cluster import NODE, Cluster, envs, pod_manifest, poll_until
from .conftest import GENERIC_CONFIG, GENERIC_RESOURCE, GPU

CDI_CRI = "version: v1\nflags:\n  deviceListStrategy: cdi-cri\n"


def _kubelet_log(cluster: Cluster) -> str:
    assert cluster.kubelet is not None
    assert cluster.kubelet.process is not None
    return cluster.kubelet.process.log.read_text(errors="replace")


def _device_paths(record: dict) -> dict[str, str]:
    """container path -> host path of the record's device nodes."""
    return {d["container_path"]: d["host_path"] for d in record.get("devices") or []}


def test_two_gpus_get_an_nvlink_pair(cluster: Cluster, ns: str, gpu_plugin) -> None:
    plugin = gpu_plugin()
    cluster.wait_resource(GPU, allocatable=8)
    cluster.create_pod(ns, pod_manifest("two-gpus", {GPU: 2}))
    assert cluster.wait_scheduled(ns, "two-gpus").spec.node_name == NODE
    pod = cluster.wait_running(ns, "two-gpus")

    rec = cluster.kubelet.created(ns, "two-gpus", "main")
    visible = envs(rec)["NVIDIA_VISIBLE_DEVICES"].split(",")
    assert len(visible) == 2
    assert set(visible) <= set(plugin.uuids)
    best = max(plugin.nvlinks(a, b) for a, b in itertools.combinations(plugin.uuids, 2))
    assert plugin.nvlinks(*visible) == best == 18
    minors = [plugin.uuids.index(u) for u in visible]
    devices = _device_paths(rec)
    for m in minors:
        assert devices[f"/dev/nvidia{m}"] == f"/dev/nvidia{m}"
    assert "/dev/nvidiactl" in devices
    assert not rec.get("cdiDevices")

    log = _kubelet_log(cluster)
    uid = pod.metadata.uid
    asked = [
        line
        for line in log.splitlines()
        if "Issuing a GetPreferredAllocation call" in line and uid in line
    ]
    assert asked, "the kubelet never called GetPreferredAllocation for the pod"
    allocated = [
        line
        for line in log.splitlines()
        if "Making allocation request for device plugin" in line and GPU in line
    ]
    assert any(all(u in line for u in visible) for line in allocated), allocated
    assert plugin.metric("kubedevice_plugin_allocate_total", resource=GPU) >= 1


def test_cdi_cri_strategy_reaches_the_runtime(cluster: Cluster, ns: str, gpu_plugin) -> None:
    plugin = gpu_plugin(CDI_CRI)
    cluster.wait_resource(GPU, allocatable=8)
    cluster.run_pod(ns, pod_manifest("cdi", {GPU: 2}))
    rec = cluster.kubelet.created(ns, "cdi", "main")
    names = [d["name"] for d in rec.get("cdiDevices") or []]
    assert len(names) == 2
    uuids = [n.removeprefix("nvidia.com/gpu=") for n in names]
    assert all(n.startswith("nvidia.com/gpu=") for n in names)
    assert set(uuids) <= set(plugin.uuids)
    assert plugin.nvlinks(*uuids) == 18
    assert "NVIDIA_VISIBLE_DEVICES" not in envs(rec)
    # the spec the runtime would resolve those names against exists and names both GPUs
    spec = json.loads((plugin.cdi_dir / "kubedevice-nvidia.json").read_text())
    assert {f"{spec['kind']}={d['name']}" for d in spec["devices"]} >= set(names)


def test_generic_pod_gets_nodes_envs_mounts_and_annotations(
    cluster: Cluster, ns: str, generic_plugin
) -> None:
    plugin = generic_plugin(GENERIC_CONFIG, start=False)
    for i in range(3):
        plugin.host.add_char_device(f"/dev/e2e{i}")
    plugin.start()
    cluster.wait_resource(GENERIC_RESOURCE, allocatable=3)
    cluster.create_pod(ns, pod_manifest("two-devs", {GENERIC_RESOURCE: 2}))
    assert cluster.wait_scheduled(ns, "two-devs").spec.node_name == NODE
    pod = cluster.wait_running(ns, "two-devs")

    rec = cluster.kubelet.created(ns, "two-devs", "main")
    devices = _device_paths(rec)
    assert len(devices) == 2
    assert all(p.startswith("/dev/e2e") and devices[p] == p for p in devices)
    ids = sorted(p.removeprefix("/dev/") for p in devices)
    env = envs(rec)
    assert sorted(env["E2E_DEVICES"].split(",")) == ids
    assert sorted(env["E2E_PATHS"].split(",")) == sorted(devices)
    mounts = {m["container_path"]: m for m in rec.get("mounts") or []}
    assert mounts["/etc/e2e-hostname"]["host_path"] == "/etc/hostname"
    assert mounts["/etc/e2e-hostname"].get("readonly") is True
    assert sorted(rec["annotations"]["example.com/e2e-ids"].split(",")) == ids
    log = _kubelet_log(cluster)
    assert any(
        "Issuing a GetPreferredAllocation call" in line and pod.metadata.uid in line
        for line in log.splitlines()
    )
    allocated = [
        line
        for line in log.splitlines()
        if "Making allocation request for device plugin" in line and "/two-devs" in line
    ]
    assert len(allocated) == 1
    assert all(f'"{i}"' in allocated[0] for i in ids)


def test_gpu_metrics_name_the_pod_through_real_pod_resources(
    cluster: Cluster, ns: str, gpu_plugin
) -> None:
    # the daemon reads the real kubelet's PodResources socket for its per-pod metric labels
    plugin = gpu_plugin()
    cluster.wait_resource(GPU, allocatable=8)
    cluster.run_pod(ns, pod_manifest("metered", {GPU: 2}))
    held = envs(cluster.kubelet.created(ns, "metered", "main"))["NVIDIA_VISIBLE_DEVICES"]

    def labelled() -> bool:
        return all(
            plugin.metric(
                "kubedevice_nvidia_gpu_healthy",
                uuid=u,
                namespace=ns,
                pod="metered",
                container="main",
            )
            == 1
            for u in held.split(",")
        )

    poll_until("GPU metrics labelled with the pod", labelled)
    free = next(u for u in plugin.uuids if u not in held)
    assert plugin.metric("kubedevice_nvidia_gpu_healthy", uuid=free, pod="metered") == 0

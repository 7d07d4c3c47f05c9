"""Item 3: device health reaches the Node status through the real kubelet. An XID (or a lost
GPU) on the fake GPU turns allocatable down; the GPU's recovery brings it back. A device
unplugged from the fake /dev tree likewise."""

from __future__ import annotations

from .cluster import Cluster, envs, pod_manifest
from .conftest import GENERIC_CONFIG, GENERIC_RESOURCE, GPU

# short recovery periods, so a GPU is Healthy again within seconds
FAST_RECOVERY = "version: v1\nhealth:\n  quietPeriod: 2s\n  resetCheckInterval: 500ms\n"


def test_xid_turns_allocatable_down_and_quiet_period_brings_it_back(
    cluster: Cluster, gpu_plugin
) -> None:
    plugin = gpu_plugin(FAST_RECOVERY)
    cluster.wait_resource(GPU, capacity=8, allocatable=8)
    plugin.xid(plugin.uuids[5], xid=62)  # not an application XID: default policy, quiet period
    cluster.wait_resource(GPU, capacity=8, allocatable=7)
    cluster.wait_resource(GPU, capacity=8, allocatable=8)


def test_lost_gpu_is_down_until_it_is_reset(cluster: Cluster, gpu_plugin) -> None:
    plugin = gpu_plugin(FAST_RECOVERY)
    cluster.wait_resource(GPU, capacity=8, allocatable=8)
    plugin.send({"op": "lost", "uuid": plugin.uuids[2]})
    cluster.wait_resource(GPU, capacity=8, allocatable=7)
    plugin.recover(plugin.uuids[2])
    cluster.wait_resource(GPU, capacity=8, allocatable=8)


def test_unplugged_free_device_leaves_and_comes_back(cluster: Cluster, generic_plugin) -> None:
    plugin = generic_plugin(GENERIC_CONFIG, start=False)
    for i in range(3):
        plugin.host.add_char_device(f"/dev/e2e{i}")
    plugin.start()
    cluster.wait_resource(GENERIC_RESOURCE, capacity=3, allocatable=3)
    plugin.host.remove("/dev/e2e1")
    cluster.wait_resource(GENERIC_RESOURCE, capacity=2, allocatable=2)
    plugin.host.add_char_device("/dev/e2e1")
    cluster.wait_resource(GENERIC_RESOURCE, capacity=3, allocatable=3)


def test_unplugged_allocated_device_turns_unhealthy(
    cluster: Cluster, ns: str, generic_plugin
) -> None:
    plugin = generic_plugin(GENERIC_CONFIG, start=False)
    for i in range(3):
        plugin.host.add_char_device(f"/dev/e2e{i}")
    plugin.start()
    cluster.wait_resource(GENERIC_RESOURCE, capacity=3, allocatable=3)
    cluster.run_pod(ns, pod_manifest("holder", {GENERIC_RESOURCE: 1}))
    held = envs(cluster.kubelet.created(ns, "holder", "main"))["E2E_DEVICES"]
    plugin.host.remove(f"/dev/{held}")
    # still listed (the pod holds it) but Unhealthy: capacity stays, allocatable drops
    cluster.wait_resource(GENERIC_RESOURCE, capacity=3, allocatable=2)
    plugin.host.add_char_device(f"/dev/{held}")
    cluster.wait_resource(GENERIC_RESOURCE, capacity=3, allocatable=3)

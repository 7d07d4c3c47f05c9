"""Item 1: the generic plugin and the GPU plugin register with the real kubelet, and the Node's
capacity and allocatable show their resources."""

from __future__ import annotations

from .cluster import DEVICE_PLUGIN_DIR, Cluster
from .conftest import GENERIC_CONFIG, GENERIC_RESOURCE, GPU


def test_generic_plugin_registers_and_node_shows_its_devices(
    cluster: Cluster, generic_plugin
) -> None:
    plugin = generic_plugin(GENERIC_CONFIG, start=False)
    for i in range(3):
        plugin.host.add_char_device(f"/dev/e2e{i}")
    plugin.start()
    node = cluster.wait_resource(GENERIC_RESOURCE, capacity=3, allocatable=3)
    assert node.status.capacity[GENERIC_RESOURCE] == "3"
    assert node.status.allocatable[GENERIC_RESOURCE] == "3"
    assert (DEVICE_PLUGIN_DIR / "example.com-e2e.sock").is_socket()
    assert plugin.metric("kubedevice_plugin_registrations_total", resource=GENERIC_RESOURCE) == 1


def test_gpu_plugin_registers_eight_gpus(cluster: Cluster, gpu_plugin) -> None:
    plugin = gpu_plugin()
    node = cluster.wait_resource(GPU, capacity=8, allocatable=8)
    assert node.status.allocatable[GPU] == "8"
    assert plugin.metric("kubedevice_plugin_registrations_total", resource=GPU) == 1

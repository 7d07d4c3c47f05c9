"""Three nodes on the real runtime: the first kubelet and two more (``Cluster.add_node``: real
kubelets, each in a mount namespace of its own, each with a containerd of its own: its own
bridge, pod subnet and CDI dir), the GPU DRA driver as a process on each (fake NVML
``pcie-4gpu``; its ``/dev/nvidia*`` made as real nodes in the tier's private ``/dev``).

A Deployment of pods with a 1-GPU claim (from a ResourceClaimTemplate) spreads over the three;
a node is drained (cordoned, its pod evicted: the driver there unprepares it) and deleted: its
ResourceSlices go with it (owned by the Node) and the Deployment's new pod gets a new claim on a
node that stays. The node comes back as a new Node with its driver: its slices appear and the
next pod lands there.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from kubedevice.nvidia.fake import FakeNvml

from .cluster import EXTRA_NODES, NODE, Cluster, Kubelet, wait_for
from .dra import (
    GpuDra,
    claim_spec,
    create_template,
    delete_pod,
    device_class,
    release,
    request,
    resource_api,
    wait_slices,
)
from .real import real_nvidia_nodes
from .runtime import PAUSE

pytestmark = [pytest.mark.containerd, pytest.mark.timeout(300)]

GPU_DRIVER = "gpu.kubedevice.io"
MACHINE = "pcie-4gpu"
GPUS = 4
LABELS = {"app": "spread-gpu"}


def _deployment(replicas: int) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [
            {
                "name": "main",
                "image": PAUSE,
                "imagePullPolicy": "IfNotPresent",
                "resources": {"claims": [{"name": "gpu"}]},
            }
        ],
        "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": 0,
        # one pod per node while they are even; a cordoned node is no place to count
        "topologySpreadConstraints": [
            {
                "maxSkew": 1,
                "topologyKey": "kubernetes.io/hostname",
                "whenUnsatisfiable": "DoNotSchedule",
                "nodeTaintsPolicy": "Honor",
                "labelSelector": {"matchLabels": LABELS},
            }
        ],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "spread"},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": LABELS},
            "template": {"metadata": {"labels": LABELS}, "spec": spec},
        },
    }


def _running(cluster: Cluster, ns: str, count: int, what: str) -> dict[str, str]:
    """Wait until ``count`` pods of the Deployment run (none on its way out); pod -> node."""
    running: dict[str, str] = {}

    def enough(p: Any) -> bool:
        name = p.metadata.name
        if p.status.phase == "Running" and p.metadata.deletion_timestamp is None:
            running[name] = p.spec.node_name
        else:
            running.pop(name, None)
        return len(running) == count

    selector = ",".join(f"{k}={v}" for k, v in LABELS.items())
    wait_for(cluster.core.list_namespaced_pod, enough, 120, what, ns, label_selector=selector)
    return running


def _slices_on(cluster: Cluster, node: str) -> list[Any]:
    items = resource_api(cluster).list_resource_slice(field_selector=f"spec.nodeName={node}")
    return list(items.items)


def _claim_nodes(cluster: Cluster, ns: str) -> dict[str, str]:
    """Pod -> the node its claim is allocated on (the allocation's node selector)."""
    out = {}
    for claim in resource_api(cluster).list_namespaced_resource_claim(ns).items:
        status = claim.status
        if status is None or status.allocation is None or not status.reserved_for:
            continue
        [term] = status.allocation.node_selector.node_selector_terms
        node = term.match_fields[0].values[0]
        out.update({consumer.name: node for consumer in status.reserved_for})
    return out


@pytest.fixture
def three_nodes(cluster: Cluster) -> Iterator[list[Kubelet]]:
    assert cluster.kubelet is not None
    added: list[str] = []
    try:
        kubelets = [cluster.kubelet]
        for name in EXTRA_NODES:
            kubelets.append(cluster.add_node(name))
            added.append(name)
        yield kubelets
    finally:
        for name in added:
            cluster.remove_node(name)


def test_three_nodes_a_node_drained_deleted_and_added(
    cluster: Cluster, ns: str, three_nodes: list[Kubelet]
) -> None:
    nvml = FakeNvml.from_file(MACHINE)
    dev_nodes = nvml.machine.dev_nodes
    nvml.close()
    with real_nvidia_nodes(dev_nodes):  # the same on every node: one /dev in the tier
        _scenario(cluster, ns, three_nodes)


def _scenario(cluster: Cluster, ns: str, three_nodes: list[Kubelet]) -> None:
    drivers: dict[str, GpuDra] = {}

    def start_driver(kubelet: Kubelet) -> None:
        drv = GpuDra(cluster, MACHINE, kubelet=kubelet)
        drivers[kubelet.node] = drv
        drv.start()

    apps = client.AppsV1Api(cluster.api)
    victim = EXTRA_NODES[-1]
    try:
        for kubelet in three_nodes:
            start_driver(kubelet)
        for node in drivers:
            wait_slices(cluster, GPU_DRIVER, lambda n: len(n) == GPUS, "4 GPUs", node=node)
        with device_class(cluster, f'device.driver == "{GPU_DRIVER}"') as cls:
            create_template(cluster, ns, "one-gpu", claim_spec(request("gpu", cls)))
            apps.create_namespaced_deployment(ns, _deployment(3))
            placed = _running(cluster, ns, 3, "3 Running pods")
            assert sorted(placed.values()) == sorted([NODE, *EXTRA_NODES])

            # drain: cordon, evict its pod (its driver unprepares the claim), delete the Node
            cluster.core.patch_node(victim, {"spec": {"unschedulable": True}})
            [evicted] = [pod for pod, node in placed.items() if node == victim]
            delete_pod(cluster, ns, evicted)
            drivers[victim].wait_specs(lambda specs: not specs, "the evicted pod unprepared")
            cluster.remove_node(victim)
            drivers.pop(victim).close()  # the machine is gone, and its driver with it
            wait_for(
                resource_api(cluster).list_resource_slice,
                lambda _s: not _slices_on(cluster, victim),
                60,
                f"the ResourceSlices of deleted Node {victim} gone",
            )
            moved = _running(cluster, ns, 3, "3 Running pods without the deleted node")
            assert victim not in moved.values()
            assert set(moved.values()) == {NODE, EXTRA_NODES[0]}
            claimed = _claim_nodes(cluster, ns)  # each pod's claim allocated where it runs
            assert {pod: claimed.get(pod) for pod in moved} == moved

            # the node comes back (a new Node), with its driver: slices, and a pod lands there
            start_driver(cluster.add_node(victim))
            wait_slices(cluster, GPU_DRIVER, lambda n: len(n) == GPUS, "4 GPUs", node=victim)
            apps.patch_namespaced_deployment_scale("spread", ns, {"spec": {"replicas": 4}})
            grown = _running(cluster, ns, 4, "4 Running pods")
            assert sorted(grown.values()).count(victim) == 1
    finally:
        with contextlib.suppress(client.ApiException):
            apps.delete_namespaced_deployment("spread", ns, propagation_policy="Orphan")
        release(cluster, ns, list(drivers.values()))
        for drv in drivers.values():
            drv.close()

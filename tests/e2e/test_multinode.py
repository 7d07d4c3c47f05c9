"""Three nodes on the real runtime: the first kubelet and two more (``Cluster.add_node``: real
kubelets, each with a containerd of its own: its own bridge, pod subnet and CDI dir), and the
chart's GPU DRA DaemonSet (``helm template`` of charts/, the project's image from
``scripts/build-image`` imported into each node's containerd) running on all three with the
fake NVML ``pcie-4gpu`` (its ``/dev/nvidia*`` made as real nodes in the tier's private ``/dev``).

One DaemonSet has one set of hostPaths: each added node's kubelet and containerd share a mount
namespace where the first node's kubelet dir and CDI dir are bind mounts of the node's own, so
the chart's paths lead to each node's. The drivers use the host's network (no kube-proxy here)
and each node has an address of its own (``--node-ip``: the first node's, 10.213.77.N/32 on
``lo`` for the others) where its driver serves its probes (``--metrics-address`` on the pod's
IP, not the chart's 0.0.0.0, which three drivers on one machine cannot share).

A Deployment of pods with a 1-GPU claim (from a ResourceClaimTemplate) spreads over the three;
a node is drained (cordoned, its pod evicted: the driver there unprepares it) and deleted: its
ResourceSlices go with it (owned by the Node), its DaemonSet pod goes (the pod GC's work, 40 to
60 s after the deletion: the same Node name comes back, and must find no old pod), and the
Deployment's new
pod gets a new claim on a node that stays. The node comes back as a new Node: the DaemonSet
controller starts a driver pod there that becomes Ready, its slices appear and the next pod
lands there.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from deploy.render import daemonset, render
from kubernetes import client

from kubedevice.nvidia.fake import FakeNvml

from .cluster import EXTRA_NODES, NODE, Cluster, ClusterError, Kubelet, poll_until, wait_for
from .conftest import IMAGE
from .dra import (
    claim_spec,
    create_template,
    delete_pod,
    device_class,
    request,
    resource_api,
    wait_file,
    wait_slices,
)
from .real import real_nvidia_nodes
from .runtime import PAUSE
from .test_containerd_image import (
    GPU_LABEL,
    REPOSITORY,
    TAG,
    _chart,
    _logs_on_failure,
    _security_holds,
    _with_env,
)

pytestmark = [pytest.mark.containerd, pytest.mark.timeout(300)]

GPU_DRIVER = "gpu.kubedevice.io"
MACHINE = "pcie-4gpu"
GPUS = 4
LABELS = {"app": "spread-gpu"}
#: the added nodes' addresses (``--node-ip``), /32 on ``lo`` while the test runs
NODE_IPS = {name: f"10.213.77.{i}" for i, name in enumerate(EXTRA_NODES, 2)}


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


@contextlib.contextmanager
def _addresses() -> Iterator[None]:
    for ip in NODE_IPS.values():
        subprocess.run(["ip", "addr", "add", f"{ip}/32", "dev", "lo"], capture_output=True)
    try:
        yield
    finally:
        for ip in NODE_IPS.values():
            subprocess.run(["ip", "addr", "del", f"{ip}/32", "dev", "lo"], capture_output=True)


def _add_node(cluster: Cluster, name: str, tar: Path | None) -> Kubelet:
    """Node ``name`` with the first node's kubelet and CDI dirs bound to its own (the chart's
    hostPaths), its own address, the GPU label; the image imported when ``tar`` is given."""
    main = cluster.kubelet
    assert main is not None
    assert cluster.cdi_dir is not None
    binds = {
        main.root: cluster.workdir / f"kubelet-{name}",
        cluster.cdi_dir: cluster.workdir / f"runtime-{name}" / "cdi",
    }
    kubelet = cluster.add_node(name, binds=binds, node_ip=NODE_IPS[name])
    assert kubelet.containerd is not None
    if tar is not None:
        kubelet.containerd.import_image(tar, IMAGE)
    cluster.core.patch_node(name, {"metadata": {"labels": {GPU_LABEL: "true"}}})
    return kubelet


@pytest.fixture
def three_nodes(cluster: Cluster, image_tar: Path) -> Iterator[list[Kubelet]]:
    assert cluster.kubelet is not None
    assert cluster.containerd is not None
    added: list[str] = []
    with _addresses():
        try:
            t0 = time.monotonic()
            cluster.containerd.import_image(image_tar, IMAGE)
            cluster.core.patch_node(NODE, {"metadata": {"labels": {GPU_LABEL: "true"}}})
            print(f"image import, first node: {time.monotonic() - t0:.1f} s")
            kubelets = [cluster.kubelet]
            for name in EXTRA_NODES:
                t0 = time.monotonic()
                kubelets.append(_add_node(cluster, name, image_tar))
                added.append(name)
                print(f"{name} up with the image: {time.monotonic() - t0:.1f} s")
            yield kubelets
        finally:
            for name in added:
                cluster.remove_node(name)
            with contextlib.suppress(client.ApiException):
                cluster.core.patch_node(NODE, {"metadata": {"labels": {GPU_LABEL: None}}})


def _chart_docs(cluster: Cluster, ns: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The chart with the GPU DRA driver only, patched for this machine (see the docstring)."""
    assert cluster.kubelet is not None
    assert cluster.cdi_dir is not None
    docs = render(
        namespace=ns,
        release=f"mn-{ns[-5:]}",
        values={
            "image.repository": REPOSITORY,
            "image.tag": TAG,
            "dra.nvidia.enabled": "true",
            "generic.enabled": "false",
            "dra.kubeletDir": str(cluster.kubelet.root),
            "dra.cdiDir": str(cluster.cdi_dir),
        },
    )
    gpu = daemonset(docs, "dra-nvidia")
    spec = gpu["spec"]["template"]["spec"]
    spec["hostNetwork"] = True
    [c] = spec["containers"]
    at = c["args"].index("--metrics-address") + 1
    port = c["args"][at].rsplit(":", 1)[1]
    c["args"][at] = f"$(KD_POD_IP):{port}"
    _with_env(
        gpu,
        {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
        {"name": "KUBERNETES_SERVICE_PORT", "value": str(cluster.api_port)},
        {"name": "KUBEDEVICE_NVML", "value": f"fake:{MACHINE}"},
        {"name": "KD_POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
    )
    return docs, gpu


def _driver_pods(cluster: Cluster, ns: str, ds: dict[str, Any]) -> dict[str, Any]:
    """Node -> the DaemonSet's pod there (any phase)."""
    selector = ",".join(f"{k}={v}" for k, v in ds["spec"]["selector"]["matchLabels"].items())
    pods = cluster.core.list_namespaced_pod(ns, label_selector=selector).items
    return {p.spec.node_name: p for p in pods if p.spec.node_name}


def _ready_on(cluster: Cluster, ns: str, ds: dict[str, Any], nodes: set[str]) -> dict[str, Any]:
    """Wait until the DaemonSet has a Running, Ready pod on each of ``nodes``; node -> pod."""
    selector = ",".join(f"{k}={v}" for k, v in ds["spec"]["selector"]["matchLabels"].items())
    ready: dict[str, Any] = {}

    def enough(p: Any) -> bool:
        ok = (
            p.status.phase == "Running"
            and p.metadata.deletion_timestamp is None
            and all(s.ready for s in p.status.container_statuses or [None])
        )
        if ok:
            ready[p.spec.node_name] = p
        elif ready.get(p.spec.node_name) is not None and (
            ready[p.spec.node_name].metadata.name == p.metadata.name
        ):
            ready.pop(p.spec.node_name)
        return nodes <= set(ready)

    wait_for(
        cluster.core.list_namespaced_pod,
        enough,
        120,
        f"a Ready driver pod on each of {sorted(nodes)}",
        ns,
        label_selector=selector,
    )
    return ready


def _claim_specs(cluster: Cluster, node: str) -> list[Path]:
    cdi = cluster.cdi_dir if node == NODE else cluster.workdir / f"runtime-{node}" / "cdi"
    assert cdi is not None
    return sorted(cdi.glob(f"k8s.{GPU_DRIVER}-claim_*.json"))


def _wait_unprepared(cluster: Cluster, node: str, what: str) -> None:
    cdi = cluster.cdi_dir if node == NODE else cluster.workdir / f"runtime-{node}" / "cdi"
    assert cdi is not None
    wait_file(cdi / "x", lambda _p: not _claim_specs(cluster, node), 60, what)


def test_three_nodes_a_node_drained_deleted_and_added(
    cluster: Cluster, ns: str, three_nodes: list[Kubelet], image_tar: Path
) -> None:
    nvml = FakeNvml.from_file(MACHINE)
    dev_nodes = nvml.machine.dev_nodes
    nvml.close()
    docs, gpu = _chart_docs(cluster, ns)
    with real_nvidia_nodes(dev_nodes), _chart(cluster, ns, docs):  # one /dev in the tier
        try:
            _scenario(cluster, ns, gpu, image_tar)
        finally:
            _release(cluster, ns)
            # the driver pods too, while their kubelets run to stop them (a pod of a stopped
            # node waits out the pod GC's 40 s); a failure above is the one to report
            with contextlib.suppress(ClusterError):
                cluster.delete_pods(ns)


def _release(cluster: Cluster, ns: str) -> None:
    """Delete the Deployment's pods while the drivers run, and wait until every claim is
    unprepared on each node still there; only then may the DaemonSet go."""
    apps = client.AppsV1Api(cluster.api)
    with contextlib.suppress(client.ApiException):  # no ReplicaSet left to replace them
        apps.delete_namespaced_deployment("spread", ns, propagation_policy="Foreground")
    selector = ",".join(f"{k}={v}" for k, v in LABELS.items())
    for pod in cluster.core.list_namespaced_pod(ns, label_selector=selector).items:
        with contextlib.suppress(client.ApiException):
            delete_pod(cluster, ns, pod.metadata.name)
    for node in [NODE, *cluster.nodes]:
        _wait_unprepared(cluster, node, f"every claim unprepared on {node}")


def _scenario(cluster: Cluster, ns: str, gpu: dict[str, Any], tar: Path) -> None:
    apps = client.AppsV1Api(cluster.api)
    victim = EXTRA_NODES[-1]
    everyone = {NODE, *EXTRA_NODES}
    t0 = time.monotonic()
    drivers = _ready_on(cluster, ns, gpu, everyone)
    with _logs_on_failure(ns, *drivers.values()):
        print(f"driver pods Ready on 3 nodes: {time.monotonic() - t0:.1f} s")
        for node in everyone:
            wait_slices(cluster, GPU_DRIVER, lambda n: len(n) == GPUS, "4 GPUs", node=node)
        _security_holds(cluster, drivers[NODE], IMAGE)
    with device_class(cluster, f'device.driver == "{GPU_DRIVER}"') as cls:
        create_template(cluster, ns, "one-gpu", claim_spec(request("gpu", cls)))
        apps.create_namespaced_deployment(ns, _deployment(3))
        placed = _running(cluster, ns, 3, "3 Running pods")
        assert sorted(placed.values()) == sorted(everyone)

        # drain: cordon, evict its pod (its driver unprepares the claim), delete the Node
        t0 = time.monotonic()
        cluster.core.patch_node(victim, {"spec": {"unschedulable": True}})
        [evicted] = [pod for pod, node in placed.items() if node == victim]
        delete_pod(cluster, ns, evicted)
        _wait_unprepared(cluster, victim, "the evicted pod unprepared")
        old_driver = drivers[victim].metadata.name
        cluster.remove_node(victim)  # the machine is gone, and the driver pod's container
        wait_for(
            resource_api(cluster).list_resource_slice,
            lambda _s: not _slices_on(cluster, victim),
            60,
            f"the ResourceSlices of deleted Node {victim} gone",
        )
        print(f"  slices of the deleted Node gone: {time.monotonic() - t0:.1f} s")
        moved = _running(cluster, ns, 3, "3 Running pods without the deleted node")
        print(f"  3 pods running again: {time.monotonic() - t0:.1f} s")
        assert victim not in moved.values()
        assert set(moved.values()) == {NODE, EXTRA_NODES[0]}
        claimed = _claim_nodes(cluster, ns)  # each pod's claim allocated where it runs
        assert {pod: claimed.get(pod) for pod in moved} == moved
        # the DaemonSet's pod of the deleted Node goes (the DaemonSet controller deletes it,
        # the pod GC removes it: no kubelet is left to confirm)
        wait_for(
            cluster.core.list_namespaced_pod,
            lambda _p: old_driver not in {p.metadata.name for p in _driver_pods(
                cluster, ns, gpu).values() if p.metadata.deletion_timestamp is None},
            90,
            f"the driver pod {old_driver} of deleted Node {victim} deleted",
            ns,
        )  # fmt: skip
        print(f"drain and delete: {time.monotonic() - t0:.1f} s")

        # the node comes back (a new Node; its containerd kept the image): the DaemonSet
        # controller starts a driver there, it becomes Ready, slices appear, a pod lands
        t0 = time.monotonic()
        _add_node(cluster, victim, None)
        back = _ready_on(cluster, ns, gpu, {victim})[victim]
        assert back.metadata.name != old_driver
        with _logs_on_failure(ns, back):
            wait_slices(cluster, GPU_DRIVER, lambda n: len(n) == GPUS, "4 GPUs", node=victim)
        print(f"node back with a Ready driver and its slices: {time.monotonic() - t0:.1f} s")
        apps.patch_namespaced_deployment_scale("spread", ns, {"spec": {"replicas": 4}})
        grown = _running(cluster, ns, 4, "4 Running pods")
        assert sorted(grown.values()).count(victim) == 1
        poll_until(  # no kubelet confirmed its deletion: the pod GC or the new kubelet does
            f"the driver pod {old_driver} of the deleted Node gone",
            lambda: (
                old_driver not in {p.metadata.name for p in _driver_pods(cluster, ns, gpu).values()}
            ),
            90,
        )
        _release(cluster, ns)

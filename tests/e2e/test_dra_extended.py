"""Pods asking for the device plugins' extended resources, served by the DRA drivers.

With no device plugin running, the DeviceClasses ``--print-device-classes`` prints (each with
``spec.extendedResourceName``) are created and pods keep their plain ``resources.limits``
(``nvidia.com/gpu: 2``, ``nvidia.com/mig-1g.18gb: 1``, ``example.com/e2e: 1``): the real
scheduler makes a ResourceClaim for each pod from the classes, allocates with their CEL, and
records in the pod's ``status.extendedResourceClaimStatus`` which container request became
which claim request; the real kubelet prepares the claim through the driver and hands each
container its own devices (kd-fakecri records the CDI device names). A two-node run puts one
Deployment on a device-plugin node and a DRA node at once.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, watch

from .cluster import NODE, Cluster, ClusterError, Kubelet, pod_manifest, wait_for
from .conftest import GPU
from .dra import (
    KUBEDEVICE,
    POD_TIMEOUT,
    DraDriver,
    GenericDra,
    GpuDra,
    allocated,
    claim_pod,
    claim_spec,
    create_template,
    log_count,
    pod_claim,
    release,
    request,
    resource_api,
    run_claim_pod,
    wait_slices,
)
from .plugins import GpuDaemon

# a DRA pod may wait for the kubelet's next pod sync (see dra.POD_TIMEOUT)
pytestmark = pytest.mark.timeout(420)

GPU_DRIVER = "gpu.kubedevice.io"
DEV_DRIVER = "dev.kubedevice.io"
CLAIM_ANNOTATION = "resource.kubernetes.io/extended-resource-claim"
MIXED = """\
version: v1
flags: {migStrategy: mixed}
sharing:
  timeSlicing:
    resources:
      - {name: nvidia.com/gpu, replicas: 2, rename: nvidia.com/gpu.shared}
"""
DEV_CONFIG = """\
version: v1
resources:
  - name: example.com/e2e
    groups:
      - paths:
          - path: /dev/e2e*
        envs:
          E2E_PATHS: "{paths}"
"""


def printed_classes(*argv: str) -> list[dict[str, Any]]:
    """What ``kubedevice ARGV --print-device-classes`` prints (a real process)."""
    proc = subprocess.run(
        [KUBEDEVICE, *argv, "--print-device-classes"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


@contextlib.contextmanager
def created_classes(cluster: Cluster, classes: list[dict[str, Any]]) -> Iterator[list[str]]:
    """Create the DeviceClasses (as ``kubectl apply`` would); delete them afterwards."""
    api = resource_api(cluster)
    names = []
    try:
        for body in classes:
            api.create_device_class(body)
            names.append(body["metadata"]["name"])
        yield [c["spec"]["extendedResourceName"] for c in classes]
    finally:
        for name in names:
            with contextlib.suppress(client.ApiException):
                api.delete_device_class(name)


@pytest.fixture
def drivers(cluster: Cluster, ns: str) -> Iterator[list[DraDriver]]:
    """The DRA drivers a test starts; its pods are released while they still run."""
    made: list[DraDriver] = []
    yield made
    release(cluster, ns, made)
    for d in made:
        d.close()


def raw_pod(cluster: Cluster, ns: str, name: str) -> dict[str, Any]:
    return dict(
        cluster.api.sanitize_for_serialization(  # type: ignore[union-attr]
            cluster.core.read_namespaced_pod(name, ns)
        )
    )


def extended_claim(cluster: Cluster, ns: str, pod: str) -> tuple[dict[str, str], Any]:
    """The pod's extendedResourceClaimStatus as {container/resource: request}, and its claim."""
    status = raw_pod(cluster, ns, pod)["status"]["extendedResourceClaimStatus"]
    mapping = {
        f"{m['containerName']}/{m['resourceName']}": m["requestName"]
        for m in status["requestMappings"]
    }
    claim = resource_api(cluster).read_namespaced_resource_claim(status["resourceClaimName"], ns)
    return mapping, claim


def results_by_request(claim: Any) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for r in claim.status.allocation.devices.results:
        out.setdefault(r.request, []).append(r.device)
    return out


def container_nodes(cluster: Cluster, kubelet: Kubelet, drv: DraDriver, ns: str, pod: str,
                    container: str) -> list[list[str]]:  # fmt: skip
    """The device nodes of each CDI device the runtime got for ``container`` (from the spec)."""
    record = kubelet.created(ns, pod, container)
    ids = [d["name"] for d in record.get("cdiDevices") or []]
    specs = {s["kind"]: s for s in drv.cdi_specs().values()}
    out = []
    for cdi_id in ids:
        kind, name = cdi_id.split("=", 1)
        [device] = [d for d in specs[kind]["devices"] if d["name"] == name]
        out.append([n["hostPath"] for n in device["containerEdits"].get("deviceNodes", [])])
    return out


def no_device_plugin(cluster: Cluster, *resources: str) -> None:
    """The Node has none of ``resources`` allocatable: the scheduler serves them by DRA
    (a device plugin that ran before leaves the name with 0, which counts as none)."""
    allocatable = cluster.node().status.allocatable or {}
    for r in resources:
        assert int(allocatable.get(r, "0")) == 0, f"{r} is advertised by a device plugin"


def test_gpu_pods_keep_nvidia_com_gpu_on_the_dra_driver(
    cluster: Cluster, ns: str, drivers: list[DraDriver]
) -> None:
    drv = GpuDra(cluster, "dgx-8gpu")
    drivers.append(drv)
    drv.start()
    wait_slices(cluster, GPU_DRIVER, lambda n: len(n) == 8, "8 GPUs")
    no_device_plugin(cluster, GPU)
    classes = printed_classes("nvidia", "dra", "--config", str(drv.root / "gpu.yaml"))
    with created_classes(cluster, classes) as names:
        assert names == [GPU]
        run_claim_pod(cluster, ns, pod_manifest("p", {GPU: 2}))
        mapping, claim = extended_claim(cluster, ns, "p")
        assert mapping == {"main/nvidia.com/gpu": "container-0-request-0"}
        assert claim.metadata.annotations[CLAIM_ANNOTATION] == "true"
        assert [o.name for o in claim.metadata.owner_references] == ["p"]
        [request] = claim.spec.devices.requests
        assert request.exactly.device_class_name == "nvidia.com-gpu"
        assert request.exactly.count == 2
        got = results_by_request(claim)["container-0-request-0"]
        assert len(got) == 2
        nodes = container_nodes(cluster, cluster.kubelet, drv, ns, "p", "main")  # type: ignore[arg-type]
        own = sorted(n[0] for n in nodes)
        assert own == sorted(f"/dev/nvidia{d.removeprefix('gpu-')}" for d in got)


def test_a_mig_profile_and_a_time_sliced_gpu_in_one_pod(
    cluster: Cluster, ns: str, drivers: list[DraDriver]
) -> None:
    drv = GpuDra(cluster, "mig-mixed", config=MIXED)
    drivers.append(drv)
    drv.start()
    wait_slices(cluster, GPU_DRIVER, lambda n: len(n) == 12, "11 MIG devices and 1 GPU")
    classes = printed_classes(
        "nvidia", "dra", "--config", str(drv.root / "gpu.yaml"), "--nvml", "fake:mig-mixed"
    )
    mig = "nvidia.com/mig-1g.18gb"
    with created_classes(cluster, classes) as names:
        assert {"nvidia.com/gpu.shared", mig} <= set(names)
        no_device_plugin(cluster, *names)
        pod = pod_manifest("p", containers=[])
        for name, limits in (("small", {mig: 1}), ("whole", {"nvidia.com/gpu.shared": 1})):
            pod["spec"]["containers"].append(
                {"name": name, "image": "registry.k8s.io/pause:3.10",
                 "resources": {"limits": {k: str(v) for k, v in limits.items()}}}
            )  # fmt: skip
        run_claim_pod(cluster, ns, pod)
        mapping, claim = extended_claim(cluster, ns, "p")
        assert mapping == {
            f"small/{mig}": "container-0-request-0",
            "whole/nvidia.com/gpu.shared": "container-1-request-0",
        }
        results = results_by_request(claim)
        [small] = results["container-0-request-0"]
        [whole] = results["container-1-request-0"]
        assert "-mig-1g-18gb-" in small
        assert whole == "gpu-2"  # the machine's one GPU with MIG off
        kubelet = cluster.kubelet
        assert kubelet is not None
        [small_nodes] = container_nodes(cluster, kubelet, drv, ns, "p", "small")
        assert any(n.startswith("/dev/nvidia-caps/") for n in small_nodes)
        [whole_nodes] = container_nodes(cluster, kubelet, drv, ns, "p", "whole")
        assert "/dev/nvidia2" in whole_nodes
        assert not any(n.startswith("/dev/nvidia-caps/") for n in whole_nodes)
        # the class's GpuConfig reached the driver: it set the GPU's time slice
        assert log_count(drv.log, "time-slice level 0 set on") == 1


def test_a_mig_profile_made_on_demand_for_a_plain_limit(
    cluster: Cluster, ns: str, drivers: list[DraDriver]
) -> None:
    """``nvidia.com/mig-3g.40gb: 1`` on a node whose GPUs have no MIG device yet: the class of
    each profile the GPUs offer selects its placements, the scheduler picks one from the
    counters, and the driver makes the instance when the kubelet prepares the claim."""
    import json

    config = "version: v1\nflags: {migStrategy: mixed}\ndra: {migOnDemand: true}\n"
    drv = GpuDra(cluster, "dgx-8gpu-mig", config=config, name="mig-dra")
    drivers.append(drv)
    drv.start()
    wait_slices(cluster, GPU_DRIVER, lambda n: len(n) == 8 * 26, "8 GPUs x 26 devices", 60)
    classes = printed_classes(
        "nvidia", "dra", "--config", str(drv.root / "gpu.yaml"), "--nvml", "fake:dgx-8gpu-mig"
    )
    three = "nvidia.com/mig-3g.40gb"
    with created_classes(cluster, classes) as names:
        assert three in names
        no_device_plugin(cluster, *names)
        run_claim_pod(cluster, ns, pod_manifest("p", {three: 1}))
        mapping, claim = extended_claim(cluster, ns, "p")
        assert mapping == {f"main/{three}": "container-0-request-0"}
        [device] = results_by_request(claim)["container-0-request-0"]
        assert "-mig-3g-40gb-" in device, device
        made = json.loads(drv.nvml_state.read_text())["instances"]
        assert [i["name"] for i in made] == ["3g.40gb"]
        [nodes] = container_nodes(cluster, cluster.kubelet, drv, ns, "p", "main")  # type: ignore[arg-type]
        assert any(n.startswith("/dev/nvidia-caps/") for n in nodes)


def test_a_generic_resource_on_the_dev_dra_driver(
    cluster: Cluster, ns: str, drivers: list[DraDriver]
) -> None:
    drv = GenericDra(cluster, DEV_CONFIG)
    drivers.append(drv)
    for node in ("/dev/e2e0", "/dev/e2e1"):
        drv.host.add_char_device(node)
    drv.start()
    wait_slices(cluster, DEV_DRIVER, lambda n: len(n) == 2, "2 devices")
    no_device_plugin(cluster, "example.com/e2e")
    classes = printed_classes("run", "--dra", "--config", str(drv.root / "config.yaml"))
    with created_classes(cluster, classes):
        run_claim_pod(cluster, ns, pod_manifest("p", {"example.com/e2e": 1}))
        mapping, claim = extended_claim(cluster, ns, "p")
        assert mapping == {"main/example.com/e2e": "container-0-request-0"}
        [device] = results_by_request(claim)["container-0-request-0"]
        [nodes] = container_nodes(cluster, cluster.kubelet, drv, ns, "p", "main")  # type: ignore[arg-type]
        assert nodes == [f"/dev/{device.split('-')[1]}"]
        [spec] = drv.cdi_specs().values()
        assert f"E2E_PATHS={nodes[0]}" in spec["devices"][0]["containerEdits"]["env"]


def delete_deployment(cluster: Cluster, ns: str, name: str, timeout: float = 120) -> None:
    """Delete a Deployment in the foreground and wait until it is gone: its ReplicaSet and
    pods are deleted first (the kubelets let the pods go), so none is made again."""
    apps = client.AppsV1Api(cluster.api)
    apps.delete_namespaced_deployment(name, ns, propagation_policy="Foreground")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        listing = apps.list_namespaced_deployment(ns, field_selector=f"metadata.name={name}")
        if not listing.items:
            return
        w = watch.Watch()
        try:
            for ev in w.stream(
                apps.list_namespaced_deployment,
                ns,
                field_selector=f"metadata.name={name}",
                resource_version=listing.metadata.resource_version,
                timeout_seconds=max(1, int(deadline - time.monotonic())),
            ):
                if ev["type"] == "DELETED":
                    return
        finally:
            w.stop()
    raise AssertionError(f"Deployment {ns}/{name} not gone after {timeout:.0f} s")


def test_one_deployment_on_a_device_plugin_node_and_a_dra_node(
    cluster: Cluster,
    ns: str,
    second_node: Kubelet,  # before drivers: it stops after they released their pods
    drivers: list[DraDriver],
    gpu_plugin: Callable[..., GpuDaemon],
) -> None:
    gpu_plugin()  # registers with the first kubelet only (its own device-plugin directory)
    cluster.wait_resource(GPU, allocatable=8)
    drv = GpuDra(cluster, "dgx-8gpu", kubelet=second_node)
    drivers.append(drv)
    drv.start()
    wait_slices(cluster, GPU_DRIVER, lambda n: len(n) == 8, "8 GPUs", node=second_node.node)
    other = cluster.core.read_node(second_node.node)
    assert int((other.status.allocatable or {}).get(GPU, "0")) == 0
    classes = printed_classes("nvidia", "dra", "--config", str(drv.root / "gpu.yaml"))
    with created_classes(cluster, classes):
        labels = {"app": "gpu"}
        pod = pod_manifest("x", {GPU: 1})
        template = {"metadata": {"labels": labels}, "spec": pod["spec"]}
        template["spec"]["topologySpreadConstraints"] = [
            {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
             "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": labels}}
        ]  # fmt: skip
        deployment = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "gpu"},
            "spec": {"replicas": 2, "selector": {"matchLabels": labels}, "template": template},
        }
        apps = client.AppsV1Api(cluster.api)
        apps.create_namespaced_deployment(ns, deployment)
        try:
            running: dict[str, Any] = {}

            def both(p: Any) -> bool:
                if p.status.phase == "Running":
                    running[p.spec.node_name] = p
                return len(running) == 2

            wait_for(cluster.core.list_namespaced_pod, both, POD_TIMEOUT, "2 Running pods", ns,
                     label_selector="app=gpu")  # fmt: skip
            assert set(running) == {NODE, second_node.node}
            # the device-plugin node: the plugin's Allocate gave the GPU (an env)
            dp = running[NODE]
            assert dp.status.extended_resource_claim_status is None
            record = cluster.kubelet.created(ns, dp.metadata.name, "main")  # type: ignore[union-attr]
            visible = {e["key"]: e["value"] for e in record["envs"]}["NVIDIA_VISIBLE_DEVICES"]
            assert visible.startswith("GPU-")
            assert "," not in visible
            # the DRA node: a claim made by the scheduler, prepared by the driver there
            dra = running[second_node.node]
            mapping, claim = extended_claim(cluster, ns, dra.metadata.name)
            assert mapping == {"main/nvidia.com/gpu": "container-0-request-0"}
            [device] = results_by_request(claim)["container-0-request-0"]
            assert claim.status.allocation.node_selector is not None
            [nodes] = container_nodes(cluster, second_node, drv, ns, dra.metadata.name, "main")
            assert nodes[0] == f"/dev/nvidia{device.removeprefix('gpu-')}"
            with pytest.raises(ClusterError, match="no CreateContainer"):
                second_node.created(ns, dp.metadata.name, "main")
        finally:
            delete_deployment(cluster, ns, "gpu")


def test_the_charts_class_for_the_default_config_serves_a_pod(
    cluster: Cluster, ns: str, drivers: list[DraDriver], tmp_path: Path
) -> None:
    """The DeviceClass the chart renders (helm) is accepted by the API server and works."""
    from deploy.render import render

    docs = render(values={"dra.nvidia.enabled": "true"})
    classes = [
        {**d, "metadata": {"name": d["metadata"]["name"]}}
        for d in docs
        if d["kind"] == "DeviceClass"
    ]
    drv = GpuDra(cluster, "pcie-4gpu")
    drivers.append(drv)
    drv.start()
    wait_slices(cluster, GPU_DRIVER, lambda n: len(n) == 4, "4 GPUs")
    with created_classes(cluster, classes) as names:
        assert names == [GPU]
        run_claim_pod(cluster, ns, pod_manifest("p", {GPU: 1}))
        _mapping, claim = extended_claim(cluster, ns, "p")
        assert len(results_by_request(claim)["container-0-request-0"]) == 1


def test_a_node_with_both_serves_the_name_by_the_plugin_and_gives_gpus_twice(
    cluster: Cluster,
    ns: str,
    drivers: list[DraDriver],
    gpu_plugin: Callable[..., GpuDaemon],
) -> None:
    """What docs/nvidia-dra.md warns of: the device plugin and the DRA driver on one node.

    The scheduler serves ``nvidia.com/gpu`` by DRA only on nodes whose allocatable has none of
    it, so the plugin serves the pod; but nothing tells DRA what the plugin handed out: a
    ResourceClaim for all 8 GPUs is allocated and prepared while the plugin's pod holds them.
    """
    plugin = gpu_plugin()
    cluster.wait_resource(GPU, allocatable=8)
    drv = GpuDra(cluster, "dgx-8gpu")
    drivers.append(drv)
    drv.start()
    wait_slices(cluster, GPU_DRIVER, lambda n: len(n) == 8, "8 GPUs")
    classes = printed_classes("nvidia", "dra", "--config", str(drv.root / "gpu.yaml"))
    with created_classes(cluster, classes):
        dp = cluster.run_pod(ns, pod_manifest("plugin", {GPU: 8}))
        assert dp.status.extended_resource_claim_status is None
        record = cluster.kubelet.created(ns, "plugin", "main")  # type: ignore[union-attr]
        visible = {e["key"]: e["value"] for e in record["envs"]}["NVIDIA_VISIBLE_DEVICES"]
        assert sorted(visible.split(",")) == sorted(plugin.uuids)
        create_template(cluster, ns, "all", claim_spec(request("gpus", "nvidia.com-gpu", 8)))
        run_claim_pod(cluster, ns, claim_pod("dra", template="all"))
        assert len(allocated(pod_claim(cluster, ns, "dra"))) == 8

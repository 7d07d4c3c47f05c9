"""The project's image, built from the Dockerfile's steps without a registry
(``scripts/build-image``: mmdebstrap + pip + mkimage), imported into the test's containerd, and
run by the chart's DaemonSets on the real runtime: the daemon inside registers with the kubelet
through the hostPath it mounts, the DRA drivers publish their slices from inside, and the
chart's security context holds (read-only root, no capabilities, dumb-init as pid 1).

Two things stand in for a real node's: the GPU components run the fake NVML
(``KUBEDEVICE_NVML=fake:dgx-8gpu`` added to their env, real char nodes for its /dev/nvidia*),
and the DRA drivers, which talk to the API server, use the host's network and the API server's
address (no kube-proxy here: the ``kubernetes`` Service's ClusterIP leads nowhere).
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from deploy.render import by_kind, daemonset, render
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from .cluster import NODE, Cluster, wait_for
from .conftest import GPU, IMAGE, cluster_on
from .dra import wait_slices
from .real import real_nvidia_nodes
from .runtime import container_output

pytestmark = [pytest.mark.containerd, pytest.mark.timeout(600)]

REPOSITORY, TAG = IMAGE.split(":")
FUSE = "kubedevice.io/fuse"  # the chart's default generic config: /dev/fuse, count 10
GPU_LABEL = "nvidia.com/gpu.present"
FAKE_NVML = {"name": "KUBEDEVICE_NVML", "value": "fake:dgx-8gpu"}


@pytest.fixture(scope="module")
def image(image_tar: Path) -> str:
    """The project's image (conftest's ``image_tar``) imported into the cluster's containerd."""
    c = cluster_on("containerd")
    assert c.containerd is not None
    c.containerd.import_image(image_tar, IMAGE)
    return IMAGE


def _values(cluster: Cluster) -> dict[str, str]:
    assert cluster.kubelet is not None
    return {
        "image.repository": REPOSITORY,
        "image.tag": TAG,
        "podResourcesDir": str(cluster.kubelet.pod_resources_socket.parent),
        "nvidia.cdiDir": str(cluster.cdi_dir),
        "nvidia.featuresDir": str(cluster.workdir / "features.d"),
    }


def _with_env(ds: dict[str, Any], *env: dict[str, str]) -> None:
    [c] = ds["spec"]["template"]["spec"]["containers"]
    c.setdefault("env", []).extend(env)


def _create(cluster: Cluster, ns: str, docs: list[dict[str, Any]]) -> list[Any]:
    """Create what the chart rendered, ServiceAccounts and ConfigMaps first; return the
    cluster-scoped objects' deleters."""
    apps = client.AppsV1Api(cluster.api)
    rbac = client.RbacAuthorizationV1Api(cluster.api)
    made: list[Any] = []
    for sa in by_kind(docs, "ServiceAccount"):
        cluster.core.create_namespaced_service_account(ns, sa)
    for cm in by_kind(docs, "ConfigMap"):
        cluster.core.create_namespaced_config_map(ns, cm)
    for role in by_kind(docs, "ClusterRole"):
        rbac.create_cluster_role(role)
        made.append((rbac.delete_cluster_role, role["metadata"]["name"]))
    for binding in by_kind(docs, "ClusterRoleBinding"):
        rbac.create_cluster_role_binding(binding)
        made.append((rbac.delete_cluster_role_binding, binding["metadata"]["name"]))
    for ds in by_kind(docs, "DaemonSet"):
        apps.create_namespaced_daemon_set(ns, ds)
    return made


@contextlib.contextmanager
def _chart(cluster: Cluster, ns: str, docs: list[dict[str, Any]]) -> Iterator[None]:
    made = _create(cluster, ns, docs)
    try:
        yield
    finally:
        apps = client.AppsV1Api(cluster.api)
        for ds in by_kind(docs, "DaemonSet"):
            with contextlib.suppress(ApiException):
                apps.delete_namespaced_daemon_set(ds["metadata"]["name"], ns)
        for delete, name in reversed(made):
            with contextlib.suppress(ApiException):
                delete(name)


@contextlib.contextmanager
def _node_label(cluster: Cluster, key: str) -> Iterator[None]:
    cluster.core.patch_node(NODE, {"metadata": {"labels": {key: "true"}}})
    try:
        yield
    finally:
        with contextlib.suppress(ApiException):
            cluster.core.patch_node(NODE, {"metadata": {"labels": {key: None}}})


def _running(cluster: Cluster, ns: str, ds: dict[str, Any]) -> Any:
    selector = ",".join(f"{k}={v}" for k, v in ds["spec"]["selector"]["matchLabels"].items())
    return wait_for(
        cluster.core.list_namespaced_pod,
        lambda p: (
            p.status.phase == "Running"
            and all(s.ready for s in p.status.container_statuses or [None])
        ),
        90,
        f"a Running, ready pod of {ds['metadata']['name']}",
        ns,
        label_selector=selector,
    )


@contextlib.contextmanager
def _logs_on_failure(ns: str, *pods: Any) -> Iterator[None]:
    """On a failure, print what the pods' containers wrote (the test's report shows it)."""
    try:
        yield
    except BaseException:
        for pod in pods:
            name = pod.spec.containers[0].name
            print(f"---- {pod.metadata.name}/{name}:")
            print(container_output(ns, pod.metadata.name, pod.metadata.uid, name)[-4000:])
        raise


def _exec(cluster: Cluster, pod: Any, script: str) -> subprocess.CompletedProcess[str]:
    """``sh -c script`` inside the pod's container (``ctr tasks exec``); not raising."""
    c = cluster.containerd
    assert c is not None
    cid = pod.status.container_statuses[0].container_id.removeprefix("containerd://")
    return subprocess.run(
        [str(c.bin / "ctr"), "-a", str(c.socket), "-n", "k8s.io", "tasks", "exec",
         "--exec-id", f"x{cid[:8]}", cid, "/bin/sh", "-c", script],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip


def _security_holds(cluster: Cluster, pod: Any, image: str) -> None:
    """From inside: our image, dumb-init as pid 1 over kubedevice, no capabilities, a
    read-only root."""
    assert pod.spec.containers[0].image == image
    status = pod.status.container_statuses[0]
    assert status.image.endswith(image.split("/", 1)[1]), status.image
    got = _exec(
        cluster,
        pod,
        "tr '\\0' ' ' < /proc/1/cmdline; echo; grep -E '^Cap(Eff|Prm|Bnd):' /proc/1/status; "
        "touch /kd-write-test && echo WROTE || echo READONLY",
    )
    lines = got.stdout.splitlines()
    assert lines[0].startswith("dumb-init -- kubedevice "), got.stdout + got.stderr
    caps = dict(ln.split(":\t") for ln in lines[1:4])
    assert caps == {"CapEff": "0000000000000000", "CapPrm": "0000000000000000",
                    "CapBnd": "0000000000000000"}, caps  # fmt: skip
    assert lines[-1] == "READONLY", got.stdout + got.stderr
    assert "Read-only file system" in got.stderr


def test_default_chart_runs_our_image_and_registers(cluster: Cluster, ns: str, image: str) -> None:
    docs = render(namespace=ns, values=_values(cluster))
    [ds] = by_kind(docs, "DaemonSet")
    with _chart(cluster, ns, docs):
        pod = _running(cluster, ns, ds)
        with _logs_on_failure(ns, pod):
            # the daemon inside registered through the hostPath it mounts: the Node shows it
            cluster.wait_resource(FUSE, capacity=10, allocatable=10, timeout=60)
            _security_holds(cluster, pod, image)
    cluster.wait_resource(FUSE, allocatable=0, timeout=60)


def test_gpu_chart_on_a_fake_gpu_node(cluster: Cluster, ns: str, image: str) -> None:
    docs = render(namespace=ns, values={"nvidia.enabled": "true", **_values(cluster)})
    gpu = daemonset(docs, "nvidia")
    _with_env(gpu, FAKE_NVML)
    from kubedevice.nvidia.fake import FakeNvml

    machine = FakeNvml.from_file("dgx-8gpu")
    try:
        nodes = machine.machine.dev_nodes
    finally:
        machine.close()
    with (
        real_nvidia_nodes(nodes),
        _node_label(cluster, GPU_LABEL),
        _chart(cluster, ns, docs),
    ):
        pod = _running(cluster, ns, gpu)
        with _logs_on_failure(ns, pod):
            cluster.wait_resource(GPU, capacity=8, allocatable=8, timeout=60)
            cluster.wait_resource(FUSE, allocatable=10, timeout=60)
            _security_holds(cluster, pod, image)
    cluster.wait_resource(GPU, allocatable=0, timeout=60)


def test_dra_daemonsets_publish_from_inside(cluster: Cluster, ns: str, image: str) -> None:
    assert cluster.kubelet is not None
    docs = render(
        namespace=ns,
        release=f"dra-{ns[-5:]}",
        values={
            "image.repository": REPOSITORY,
            "image.tag": TAG,
            "dra.nvidia.enabled": "true",
            "dra.generic.enabled": "true",
            "generic.enabled": "false",
            "dra.kubeletDir": str(cluster.kubelet.root),
            "dra.cdiDir": str(cluster.cdi_dir),
        },
    )
    gpu, gen = daemonset(docs, "dra-nvidia"), daemonset(docs, "dra-generic")
    api = {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"}
    port = {"name": "KUBERNETES_SERVICE_PORT", "value": str(cluster.api_port)}
    for ds in (gpu, gen):  # no kube-proxy here: the API server's own address, host network
        ds["spec"]["template"]["spec"]["hostNetwork"] = True
        _with_env(ds, api, port)
    _with_env(gpu, FAKE_NVML)
    from kubedevice.nvidia.fake import FakeNvml

    machine = FakeNvml.from_file("dgx-8gpu")
    try:
        nodes = machine.machine.dev_nodes
    finally:
        machine.close()
    with (
        real_nvidia_nodes(nodes),
        _node_label(cluster, GPU_LABEL),
        _chart(cluster, ns, docs),
    ):
        pods = [_running(cluster, ns, ds) for ds in (gpu, gen)]
        with _logs_on_failure(ns, *pods):
            wait_slices(cluster, "gpu.kubedevice.io", lambda n: len(n) == 8, "8 GPUs", 90)
            wait_slices(cluster, "dev.kubedevice.io", lambda n: len(n) == 10, "10 fuse", 90)
            for pod in pods:
                _security_holds(cluster, pod, image)

"""The project's image, built from the Dockerfile's steps without a registry
(``scripts/build-image``: mmdebstrap + pip + mkimage), imported into the test's containerd, and
run by the chart's DaemonSets on the real runtime: the daemon inside registers with the kubelet
through the hostPath it mounts, the DRA drivers publish their slices from inside, and the
chart's security context holds (read-only root, no capabilities, dumb-init as pid 1). With
``dra.nvidia.mps``, and with the GPU plugin's ``sharing.mps``, the GPU's MPS control daemon
outlives a rollout of the driver's or the plugin's pod.

Two things stand in for a real node's: the GPU components run the fake NVML
(``KUBEDEVICE_NVML=fake:dgx-8gpu`` added to their env, real char nodes for its /dev/nvidia*),
and the DRA drivers, which talk to the API server, use the host's network and the API server's
address (no kube-proxy here: the ``kubernetes`` Service's ClusterIP leads nowhere).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from deploy.render import by_kind, daemonset, render
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kubedevice.nvidia import hostcgroup
from kubedevice.nvidia.mps import CGROUP, running_daemons

from .cluster import NODE, Cluster, ClusterError, poll_until, wait_for
from .conftest import GPU, IMAGE, cluster_on
from .dra import (
    allocated,
    create_template,
    delete_pod,
    device_class,
    pod_claim,
    slice_devices,
    wait_pod_gone,
    wait_slices,
)
from .real import Seen, claim_show_pod, real_nvidia_nodes, run_holding, show_pod
from .runtime import container_output

pytestmark = [pytest.mark.containerd, pytest.mark.timeout(600)]

REPOSITORY, TAG = IMAGE.split(":")
FUSE = "kubedevice.io/fuse"  # the chart's default generic config: /dev/fuse, count 10
GPU_LABEL = "nvidia.com/gpu.present"
FAKE_NVML = {"name": "KUBEDEVICE_NVML", "value": "fake:dgx-8gpu"}
DRA_GPU = "gpu.kubedevice.io"
#: a share's container prints the pid in its MPS pipe dir (the daemon it is a client of)
MPS_LOOK = "echo PID $(cat /run/nvidia-mps/*.pid)"


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


def _fake_nodes() -> tuple[str, ...]:
    """The /dev/nvidia* nodes of the fake machine the GPU components run on (FAKE_NVML)."""
    from kubedevice.nvidia.fake import FakeNvml

    machine = FakeNvml.from_file("dgx-8gpu")
    try:
        return tuple(machine.machine.dev_nodes)
    finally:
        machine.close()


def _dra_values(cluster: Cluster, **values: str) -> dict[str, str]:
    assert cluster.kubelet is not None
    return {
        "image.repository": REPOSITORY,
        "image.tag": TAG,
        "generic.enabled": "false",
        "dra.kubeletDir": str(cluster.kubelet.root),
        "dra.cdiDir": str(cluster.cdi_dir),
        **values,
    }


def _api_from_host_network(cluster: Cluster, ds: dict[str, Any]) -> None:
    """No kube-proxy here: the API server's own address, from the host's network."""
    ds["spec"]["template"]["spec"]["hostNetwork"] = True
    _with_env(
        ds,
        {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
        {"name": "KUBERNETES_SERVICE_PORT", "value": str(cluster.api_port)},
    )


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


def _running(cluster: Cluster, ns: str, ds: dict[str, Any], *, but: str = "") -> Any:
    """A Running, ready pod of the DaemonSet (other than the pod named ``but``)."""
    selector = ",".join(f"{k}={v}" for k, v in ds["spec"]["selector"]["matchLabels"].items())
    return wait_for(
        cluster.core.list_namespaced_pod,
        lambda p: (
            p.metadata.name != but
            and p.metadata.deletion_timestamp is None
            and p.status.phase == "Running"
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
    with (
        real_nvidia_nodes(_fake_nodes()),
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
    values = _dra_values(cluster, **{"dra.nvidia.enabled": "true", "dra.generic.enabled": "true"})
    docs = render(namespace=ns, release=f"dra-{ns[-5:]}", values=values)
    gpu, gen = daemonset(docs, "dra-nvidia"), daemonset(docs, "dra-generic")
    for ds in (gpu, gen):
        _api_from_host_network(cluster, ds)
    _with_env(gpu, FAKE_NVML)
    with (
        real_nvidia_nodes(_fake_nodes()),
        _node_label(cluster, GPU_LABEL),
        _chart(cluster, ns, docs),
    ):
        pods = [_running(cluster, ns, ds) for ds in (gpu, gen)]
        with _logs_on_failure(ns, *pods):
            wait_slices(cluster, "gpu.kubedevice.io", lambda n: len(n) == 8, "8 GPUs", 90)
            wait_slices(cluster, "dev.kubedevice.io", lambda n: len(n) == 10, "10 fuse", 90)
            for pod in pods:
                _security_holds(cluster, pod, image)


def _mps_pid(seen: Seen) -> str:
    """The daemon pid a share's container read from its pipe dir (``MPS_LOOK``)."""
    [line] = [ln for ln in seen.output.splitlines() if ln.startswith("PID ")]
    return line.split(" ", 1)[1].strip()


def _gone(pid: int) -> bool:
    """Whether ``pid`` has ended (a zombie not yet reaped counts as ended)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] == "Z"


def _mps_cgroups() -> list[Path]:
    """The MPS daemons' cgroups on this host (``kubedevice-mps/<key>``, every hierarchy)."""
    root = Path("/sys/fs/cgroup")
    return [p for h in hostcgroup.hierarchies(root) for p in (h / CGROUP).glob("*/")]


def _roll(cluster: Cluster, ns: str, ds: dict[str, Any], patch: Any, old: Any) -> Any:
    """Roll the DaemonSet (``patch`` its template): its new pod Running and ready beside the
    old one (maxSurge 1), then the old one gone; the new pod."""
    client.AppsV1Api(cluster.api).patch_namespaced_daemon_set(ds["metadata"]["name"], ns, patch)
    new = _running(cluster, ns, ds, but=old.metadata.name)
    wait_pod_gone(cluster, ns, old.metadata.name, 60)
    return new


def _still_running(cluster: Cluster, ns: str, before: Any) -> None:
    """The pod ``before`` is the same pod, Running, its container never restarted."""
    held = cluster.core.read_namespaced_pod(before.metadata.name, ns)
    assert held.metadata.uid == before.metadata.uid
    assert held.status.phase == "Running"
    [status] = held.status.container_statuses
    assert status.restart_count == 0
    assert status.state.running is not None


def test_dra_mps_daemon_outlives_a_rollout_of_the_driver(
    cluster: Cluster, ns: str, image: str
) -> None:
    """dra.nvidia.mps: the GPU's MPS control daemon, started by the driver's pod for a share,
    is in a cgroup of its own on the host (--host-cgroup-root), so when a rollout replaces
    the pod (containerd kills every process of the old container's cgroup) it lives on: the
    new pod adopts it (same pid), the GPU is not tainted, the share's pod keeps running and a
    second share gets the same daemon; the last unprepare stops it."""
    assert cluster.kubelet is not None
    root = cluster.kubelet.root / "plugins" / DRA_GPU / "mps"

    def driver(metrics_port: int) -> dict[str, Any]:
        values = {"dra.nvidia.enabled": "true", "dra.nvidia.mps": "true",
                  "dra.nvidia.metricsPort": str(metrics_port)}  # fmt: skip
        docs = render(namespace=ns, release=f"mps-{ns[-5:]}", values=_dra_values(cluster, **values))
        ds = daemonset(docs, "dra-nvidia")
        _api_from_host_network(cluster, ds)
        _with_env(ds, FAKE_NVML)
        return docs

    docs = driver(9482)
    gpu = daemonset(docs, "dra-nvidia")
    # the upgrade: another metrics port (on the host's network two pods cannot share one)
    upgrade = [{"op": "replace", "path": "/spec/template",
                "value": daemonset(driver(9483), "dra-nvidia")["spec"]["template"]}]  # fmt: skip
    marks = [("start", time.monotonic())]
    index0 = f'device.driver == "{DRA_GPU}" && device.attributes["{DRA_GPU}"].index == 0'
    with (
        real_nvidia_nodes(_fake_nodes()),
        _node_label(cluster, GPU_LABEL),
        _chart(cluster, ns, docs),
        device_class(cluster, index0) as cls,
    ):
        old = _running(cluster, ns, gpu)
        try:
            with _logs_on_failure(ns, old):
                wait_slices(cluster, DRA_GPU, lambda n: "gpu-0" in n, "gpu-0", 60)
                marks.append(("driver up", time.monotonic()))
                exactly = {"deviceClassName": cls, "capacity": {"requests": {"memory": "20Gi"}}}
                spec = {"devices": {"requests": [{"name": "dev", "exactly": exactly}]}}
                create_template(cluster, ns, "mem", spec)
                a = run_holding(cluster, ns, [claim_show_pod("a", template="mem", extra=MPS_LOOK)])
                [pid] = running_daemons(root)
                assert _mps_pid(a["a"]) == str(pid), a["a"].output
                a_pod = cluster.core.read_namespaced_pod("a", ns)
                marks.append(("share a runs", time.monotonic()))
                new = _roll(cluster, ns, gpu, upgrade, old)
                marks.append(("rolled", time.monotonic()))
            with _logs_on_failure(ns, new):
                poll_until("a live MPS daemon", lambda: bool(running_daemons(root)), 15)
                now = running_daemons(root)
                assert now == [pid], (
                    f"the MPS daemon (pid {pid}) did not outlive the old driver's pod: now {now}"
                )
                assert not slice_devices(cluster, DRA_GPU)["gpu-0"].taints
                _still_running(cluster, ns, a_pod)
                b = run_holding(cluster, ns, [claim_show_pod("b", template="mem", extra=MPS_LOOK)])
                assert _mps_pid(b["b"]) == str(pid), b["b"].output
                for name in ("a", "b"):
                    assert allocated(pod_claim(cluster, ns, name)) == ["gpu-0"]
                assert running_daemons(root) == [pid]
                marks.append(("share b runs", time.monotonic()))
                for name in ("a", "b"):
                    delete_pod(cluster, ns, name)
                poll_until("the daemon gone", lambda: not running_daemons(root), 30)
                assert _gone(pid)  # quit, not only its pid file removed
                marks.append(("daemon gone", time.monotonic()))
                poll_until("its cgroups removed", lambda: not _mps_cgroups(), 35)
                marks.append(("cgroups removed", time.monotonic()))
        finally:
            for name in ("a", "b"):  # unprepared while the driver runs
                with contextlib.suppress(ApiException, ClusterError):
                    delete_pod(cluster, ns, name)
            for left in running_daemons(root):  # the driver's, should a step above fail
                with contextlib.suppress(ProcessLookupError):
                    os.kill(left, signal.SIGKILL)
    steps = ", ".join(f"{w} {t - marks[0][1]:.1f}s" for w, t in marks[1:])
    print(f"MPS rollout timings: {steps}")


#: the GPU plugin's config with ``sharing.mps`` (``{root}``: its ``flags.mpsRoot``)
MPS_PLUGIN_CONFIG = """\
version: v1
flags:
  migStrategy: none
  failOnInitError: true
  deviceListStrategy: envvar
  deviceIDStrategy: uuid
  mpsRoot: {root}
sharing:
  mps:
    resources:
      - name: nvidia.com/gpu
        replicas: 4
"""


@contextlib.contextmanager
def _no_mps_left(cluster: Cluster, ns: str, ds: dict[str, Any], root: Path) -> Iterator[None]:
    """On the way out, once the DaemonSet's pods are gone: end the MPS daemons the plugin
    left running (it leaves them for the pods that use them) and remove their cgroups."""
    try:
        yield
    finally:
        selector = ",".join(f"{k}={v}" for k, v in ds["spec"]["selector"]["matchLabels"].items())
        with contextlib.suppress(ClusterError):  # else its supervisor would restart them
            poll_until(
                "the plugin's pods gone",
                lambda: not cluster.core.list_namespaced_pod(ns, label_selector=selector).items,
                60,
            )
        groups = _mps_cgroups()
        pids = {int(p) for g in groups for p in (g / "cgroup.procs").read_text().split()}
        for pid in pids | set(running_daemons(root)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ClusterError):
            poll_until("the MPS daemons ended", lambda: all(_gone(p) for p in pids), 15)
        for key in {g.name for g in groups}:
            hostcgroup.remove(Path("/sys/fs/cgroup"), f"{CGROUP}/{key}")


def test_gpu_plugin_mps_daemon_outlives_a_rollout_of_the_plugin(
    cluster: Cluster, ns: str, image: str
) -> None:
    """The chart's GPU plugin with sharing.mps (nvidia.mpsOutlivesPod, the default): a pod
    given one replica of nvidia.com/gpu sees its MPS env and its GPU's control daemon; a
    rollout of the plugin's pod leaves that daemon running (same pid, in a cgroup of its own
    on the host), the new pod adopts it, the holding pod keeps running and every replica is
    Healthy (no MPS fault)."""
    root = cluster.workdir / "mps"
    config = cluster.workdir / "nvidia-mps.yaml"
    config.write_text(MPS_PLUGIN_CONFIG.format(root=root))
    docs = render(
        namespace=ns,
        values={"nvidia.enabled": "true", "generic.enabled": "false", **_values(cluster)},
        set_files={"nvidia.config": config},
    )
    gpu = daemonset(docs, "nvidia")
    _with_env(gpu, FAKE_NVML)
    from kubedevice.nvidia.fake import FakeNvml

    machine = FakeNvml.from_file("dgx-8gpu")
    try:
        mib = {g.info.uuid: g.info.memory_total // 4 // 2**20 for g in machine.machine.gpus}
    finally:
        machine.close()
    roll = {"spec": {"template": {"metadata": {"annotations": {"kubedevice.io/roll": "1"}}}}}
    marks = [("start", time.monotonic())]
    with (
        real_nvidia_nodes(_fake_nodes()),
        _node_label(cluster, GPU_LABEL),
        _no_mps_left(cluster, ns, gpu, root),
        _chart(cluster, ns, docs),
    ):
        old = _running(cluster, ns, gpu)
        with _logs_on_failure(ns, old):
            cluster.wait_resource(GPU, capacity=32, allocatable=32, timeout=60)
            marks.append(("plugin up", time.monotonic()))
            pod = show_pod("a", {GPU: 1}, extra=MPS_LOOK, keep_running=True)
            seen = run_holding(cluster, ns, [pod])["a"]
            uuid = seen.env["NVIDIA_VISIBLE_DEVICES"]
            assert seen.env["CUDA_MPS_PIPE_DIRECTORY"] == "/run/nvidia-mps", seen.output
            assert seen.env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"0={mib[uuid]}M"
            assert seen.env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
            pid = int(_mps_pid(seen))
            daemons = running_daemons(root)
            assert len(daemons) == 8, daemons  # one per GPU
            assert pid in daemons, (pid, daemons)
            [key] = [f.parent.parent.name for f in root.glob("*/pipe/*.pid")
                     if f.read_text().strip() == str(pid)]  # fmt: skip
            a_pod = cluster.core.read_namespaced_pod("a", ns)
            marks.append(("replica runs", time.monotonic()))
            new = _roll(cluster, ns, gpu, roll, old)
            marks.append(("rolled", time.monotonic()))
        with _logs_on_failure(ns, new):
            assert not _gone(pid), f"the MPS daemon (pid {pid}) ended with the old plugin's pod"
            assert pid in running_daemons(root), running_daemons(root)
            assert hostcgroup.member(pid, f"{CGROUP}/{key}")
            assert key in {g.name for g in _mps_cgroups()}
            _still_running(cluster, ns, a_pod)
            # every replica Healthy: the new pod adopted the daemons, no MPS fault
            cluster.wait_resource(GPU, capacity=32, allocatable=32, timeout=30)
            assert not _gone(pid)
            marks.append(("checked", time.monotonic()))
            delete_pod(cluster, ns, "a")
    steps = ", ".join(f"{w} {t - marks[0][1]:.1f}s" for w, t in marks[1:])
    print(f"plugin MPS rollout timings: {steps}")

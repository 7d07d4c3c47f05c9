"""Item 4: restarts. The kubelet restarts (process stopped and started again): both plugins
register again, running pods keep their devices, a new pod gets the free ones. A plugin
restarts (killed, stale socket left) with pods running: no device is given twice."""

from __future__ import annotations

from .cluster import Cluster, envs, pod_manifest, poll_until
from .conftest import GENERIC_CONFIG, GENERIC_RESOURCE, GPU


def _gpus(cluster: Cluster, ns: str, pod: str) -> set[str]:
    return set(envs(cluster.kubelet.created(ns, pod, "main"))["NVIDIA_VISIBLE_DEVICES"].split(","))


def _generic(cluster: Cluster, ns: str, pod: str) -> set[str]:
    return set(envs(cluster.kubelet.created(ns, pod, "main"))["E2E_DEVICES"].split(","))


def test_kubelet_restart(cluster: Cluster, ns: str, gpu_plugin, generic_plugin) -> None:
    gpu = gpu_plugin()
    generic = generic_plugin(GENERIC_CONFIG, start=False)
    for i in range(3):
        generic.host.add_char_device(f"/dev/e2e{i}")
    generic.start()
    cluster.wait_resource(GPU, allocatable=8)
    cluster.wait_resource(GENERIC_RESOURCE, allocatable=3)
    before = pod_manifest("before", {GPU: 3, GENERIC_RESOURCE: 1})
    uid = cluster.run_pod(ns, before).metadata.uid
    held_gpus, held_generic = _gpus(cluster, ns, "before"), _generic(cluster, ns, "before")
    assert len(held_gpus) == 3
    assert len(held_generic) == 1

    cluster.restart_kubelet()

    # both plugins registered a second time, with the new kubelet
    for plugin, resource in ((gpu, GPU), (generic, GENERIC_RESOURCE)):
        poll_until(
            f"{resource} registered again",
            lambda p=plugin, r=resource: (
                p.metric("kubedevice_plugin_registrations_total", resource=r) >= 2
            ),
        )
    cluster.kubelet.wait_plugin_devices(GPU, healthy=8)
    cluster.kubelet.wait_plugin_devices(GENERIC_RESOURCE, healthy=3)
    cluster.wait_resource(GPU, capacity=8, allocatable=8)
    cluster.wait_resource(GENERIC_RESOURCE, capacity=3, allocatable=3)
    # the running pod is the same pod, still Running, and its container was not created again
    pod = cluster.wait_running(ns, "before")
    assert pod.metadata.uid == uid
    # (by UID: another test's pod may have the same name in its own namespace)
    assert len([r for r in cluster.kubelet.records() if r.get("podUid") == uid]) == 1

    # a new pod asking for every free device gets exactly the free ones
    cluster.run_pod(ns, pod_manifest("after", {GPU: 5, GENERIC_RESOURCE: 2}))
    assert _gpus(cluster, ns, "after") == set(gpu.uuids) - held_gpus
    assert _generic(cluster, ns, "after") == {"e2e0", "e2e1", "e2e2"} - held_generic


def test_plugin_restart_gives_no_device_twice(cluster: Cluster, ns: str, gpu_plugin) -> None:
    first = gpu_plugin()
    cluster.wait_resource(GPU, allocatable=8)
    cluster.run_pod(ns, pod_manifest("one", {GPU: 4}))
    held = _gpus(cluster, ns, "one")

    first.kill()  # a crash: its socket stays in the directory
    cluster.wait_resource(GPU, capacity=8, allocatable=0)
    second = gpu_plugin()
    cluster.wait_resource(GPU, capacity=8, allocatable=8)
    assert second.metric("kubedevice_plugin_registrations_total", resource=GPU) == 1

    cluster.run_pod(ns, pod_manifest("two", {GPU: 4}))
    assert _gpus(cluster, ns, "two") == set(second.uuids) - held
    # nothing is left: a fifth GPU cannot be placed
    cluster.create_pod(ns, pod_manifest("three", {GPU: 1}))
    pod = cluster.wait_pod(
        ns,
        "three",
        lambda p: any(
            c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable"
            for c in p.status.conditions or []
        ),
        what="Unschedulable",
    )
    assert pod.spec.node_name is None


def _serving_metrics(daemon) -> bool:
    try:
        daemon.metrics()
    except OSError:
        return False
    return True


def test_plugins_started_while_the_kubelet_is_down_register_when_it_starts(
    cluster: Cluster, gpu_plugin, generic_plugin
) -> None:
    # the kubelet's stale kubelet.sock refuses connections; when the kubelet starts it wipes
    # the directory (our sockets too) and creates kubelet.sock afresh
    cluster.kubelet.stop()
    try:
        gpu = gpu_plugin()
        generic = generic_plugin(GENERIC_CONFIG, start=False)
        generic.host.add_char_device("/dev/e2e0")
        generic.start()
        poll_until("both daemons up", lambda: _serving_metrics(gpu) and _serving_metrics(generic))
    finally:
        cluster.kubelet.start()
    cluster.wait_node_ready()
    cluster.wait_resource(GPU, capacity=8, allocatable=8)
    cluster.wait_resource(GENERIC_RESOURCE, capacity=1, allocatable=1)
    assert gpu.metric("kubedevice_plugin_registrations_total", resource=GPU) == 1

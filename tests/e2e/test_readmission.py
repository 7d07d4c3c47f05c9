"""After a restart the real kubelet admits its pods again. A container that holds devices but
is not running goes through the device manager's checks once more, and its pod is rejected
when the plugin has not registered again (docs/contract.md, Checkpoint): why a plugin must
register as soon as the new kubelet.sock appears. The fake runtime never ends an init
container, so here the container not running is the app container waiting for it (on a
real node, typically a finished init container)."""

from __future__ import annotations

from .cluster import Cluster, container, pod_manifest
from .conftest import GPU


def test_a_pod_with_a_container_not_running_is_rejected_without_its_plugin(
    cluster: Cluster, ns: str, gpu_plugin
) -> None:
    gpu = gpu_plugin()
    cluster.wait_resource(GPU, allocatable=8)
    cluster.create_pod(
        ns,
        pod_manifest(
            "with-init",
            containers=[container("main", {GPU: 1})],
            init_containers=[container("init", {GPU: 1})],
        ),
    )
    cluster.wait_pod(
        ns,
        "with-init",
        lambda p: any(s.state.running for s in p.status.init_container_statuses or []),
        60,
        "init container running",
    )
    cluster.run_pod(ns, pod_manifest("plain", {GPU: 1}))
    gpu.stop()  # the plugin is gone while the kubelet restarts

    cluster.restart_kubelet()

    rejected = cluster.wait_pod(
        ns, "with-init", lambda p: p.status.phase == "Failed", 60, "rejected at re-admission"
    )
    assert rejected.status.reason == "UnexpectedAdmissionError"
    assert (
        f"no healthy devices present; cannot allocate unhealthy devices {GPU}"
        in rejected.status.message
    )
    # the pod whose only container is running costs the plugin nothing and stays
    plain = cluster.core.read_namespaced_pod("plain", ns)
    assert plain.status.phase == "Running"

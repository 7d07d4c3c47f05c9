"""Item 6: ``kubedevice advertise`` against the real API server, with the real kubelet copying
capacity to allocatable and the real scheduler placing a pod on it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from .cluster import NODE, Cluster, pod_manifest

RESOURCE = "example.com/dongle"


def advertise(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``kubedevice advertise`` as a process, with only ``kubeconfig``'s credentials."""
    return subprocess.run(
        [sys.executable, "-m", "kubedevice", "advertise", "--kubeconfig", str(kubeconfig),
         "--timeout", "20", *args],
        capture_output=True, text=True, timeout=60,
        env={"PATH": "/usr/bin:/bin", "HOME": str(kubeconfig.parent)},
    )  # fmt: skip


def test_add_is_copied_to_allocatable_and_schedules_a_pod_then_remove(
    cluster: Cluster, ns: str
) -> None:
    proc = advertise(cluster.admin_kubeconfig, NODE, f"{RESOURCE}=3")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [f"{NODE}: add {RESOURCE}: capacity 3"]
    # the kubelet copies capacity to allocatable at its next status update
    cluster.wait_resource(RESOURCE, capacity=3, allocatable=3)
    cluster.create_pod(ns, pod_manifest("dongle-user", {RESOURCE: 2}))
    pod = cluster.wait_running(ns, "dongle-user")
    assert pod.spec.node_name == NODE
    # a pod asking for more than there is stays Pending, refused by the scheduler
    cluster.create_pod(ns, pod_manifest("too-many", {RESOURCE: 2}))
    cluster.wait_pod(
        ns,
        "too-many",
        lambda p: any(
            c.type == "PodScheduled" and c.status == "False" and "Insufficient" in (c.message or "")
            for c in p.status.conditions or []
        ),
    )

    proc = advertise(cluster.admin_kubeconfig, NODE, "--remove", RESOURCE)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [f"{NODE}: remove {RESOURCE}: not in capacity"]
    cluster.wait_resource(RESOURCE, capacity=0, allocatable=0)

    # removing it again: the real API server answers a bare 422; we say what it means
    proc = advertise(cluster.admin_kubeconfig, NODE, "--remove", RESOURCE)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        f"error: node {NODE} has no {RESOURCE} in its capacity: nothing to remove; "
        "nothing was changed (the patch is all or nothing)"
    ]


def test_dry_run_sends_nothing(cluster: Cluster) -> None:
    proc = advertise(cluster.admin_kubeconfig, NODE, f"{RESOURCE}=5", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"PATCH {cluster.server}/api/v1/nodes/{NODE}/status\n")
    assert cluster.tokens["admin"] not in proc.stdout
    assert RESOURCE not in (cluster.node().status.capacity or {})


def test_another_nodes_token_gets_the_403_line(cluster: Cluster) -> None:
    other = cluster.workdir / "other-node.kubeconfig"  # system:node:other-node
    proc = advertise(other, NODE, f"{RESOURCE}=1")
    assert proc.returncode == 2
    [line] = proc.stderr.splitlines()
    assert line.startswith(f"error: forbidden (403): not allowed to patch nodes/status of {NODE}")
    assert RESOURCE not in (cluster.node().status.capacity or {})


def test_unknown_node_gets_the_404_line(cluster: Cluster) -> None:
    proc = advertise(cluster.admin_kubeconfig, "no-such-node", f"{RESOURCE}=1")
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == ["error: no such node: no-such-node (404)"]

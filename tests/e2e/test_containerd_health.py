"""Device-plugin health on the real runtime: a device a running container holds turns bad (an XID
on its GPU; its node removed from the host). What the Node's allocatable, the pod's status,
the container itself (``ctr tasks exec``, from inside) and the next pods see."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from .cluster import Cluster, wait_for
from .conftest import GENERIC_RESOURCE, GPU
from .real import (
    REAL_GENERIC_CONFIG,
    real_generic_nodes,
    real_nvidia_nodes,
    run_all,
    run_holding,
    show_pod,
)

pytestmark = pytest.mark.containerd


def _exec(cluster: Cluster, ns: str, pod: str, *argv: str) -> str:
    """Run ``argv`` inside the pod's running container ``main``; its output."""
    assert cluster.containerd is not None
    p = cluster.core.read_namespaced_pod(pod, ns)
    cid = p.status.container_statuses[0].container_id.removeprefix("containerd://")
    return cluster.containerd.ctr("tasks", "exec", "--exec-id", f"t{cid[:8]}", cid, *argv)


def _health(cluster: Cluster, ns: str, pod: str, resource: str) -> dict[str, str]:
    """The pod status's allocatedResourcesStatus of ``resource``: device id -> health."""
    p = cluster.core.read_namespaced_pod(pod, ns)
    out: dict[str, str] = {}
    for status in p.status.container_statuses[0].allocated_resources_status or []:
        if status.name == resource:
            out.update({r.resource_id: r.health for r in status.resources or []})
    return out


def _unschedulable(p: Any) -> bool:
    return any(
        c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable"
        for c in p.status.conditions or []
    )


def test_an_xid_on_a_held_gpu(cluster: Cluster, ns: str, gpu_plugin) -> None:
    gpus = gpu_plugin(start=False)
    with real_nvidia_nodes(gpus.nvml.machine.dev_nodes):
        gpus.start()
        cluster.wait_resource(GPU, allocatable=8)
        holder = run_holding(cluster, ns, [show_pod("holder", {GPU: 2}, keep_running=True)])
        held = holder["holder"].env["NVIDIA_VISIBLE_DEVICES"].split(",")
        bad = held[0]
        node = f"/dev/nvidia{gpus.uuids.index(bad)}"
        gpus.xid(bad)

        # the Node: one GPU less allocatable, the same capacity
        cluster.wait_resource(GPU, capacity=8, allocatable=7)
        # the pod: still Running in its first container; its status says which GPU is bad
        wait_for(
            cluster.core.list_namespaced_pod,
            lambda _p: _health(cluster, ns, "holder", GPU).get(bad) == "Unhealthy",
            30,
            "holder's allocatedResourcesStatus: the GPU Unhealthy",
            ns,
        )
        assert _health(cluster, ns, "holder", GPU) == {bad: "Unhealthy", held[1]: "Healthy"}
        p = cluster.core.read_namespaced_pod("holder", ns)
        assert p.status.phase == "Running"
        assert p.status.container_statuses[0].restart_count == 0
        # inside: the runtime leaves the container its node (nothing takes a device away)
        assert _exec(cluster, ns, "holder", "stat", "-c", "%t %T", node).split() == [
            "c3",
            format(gpus.uuids.index(bad), "x"),
        ]
        # the next pod: the scheduler counts 7 - 2 = 5 free; it gets 5 GPUs, none of them bad
        nxt = run_all(cluster, ns, [show_pod("next", {GPU: 5})])["next"]
        assert nxt.phase == "Succeeded", nxt.output
        got = nxt.env["NVIDIA_VISIBLE_DEVICES"].split(",")
        assert len(got) == 5
        assert not set(got) & set(held)


def test_a_removed_device_node(cluster: Cluster, ns: str, generic_plugin) -> None:
    with real_generic_nodes([3, 5, 7]) as nodes:
        plugin = generic_plugin(REAL_GENERIC_CONFIG, start=False, dev_root=Path("/dev"))
        plugin.start()
        cluster.wait_resource(GENERIC_RESOURCE, allocatable=3)
        holder = run_holding(
            cluster, ns, [show_pod("holder", {GENERIC_RESOURCE: 1}, keep_running=True)]
        )
        [(mine, mm)] = holder["holder"].under("/dev/kde2e/").items()
        free = sorted(set(nodes) - {mine})

        Path(mine).unlink()  # the held device's node leaves the host
        # still counted (Unhealthy) in the capacity, no longer allocatable
        cluster.wait_resource(GENERIC_RESOURCE, capacity=3, allocatable=2)
        p = cluster.core.read_namespaced_pod("holder", ns)
        assert p.status.phase == "Running"
        assert p.status.container_statuses[0].restart_count == 0
        # inside, the container keeps the node runc made for it
        assert _exec(cluster, ns, "holder", "stat", "-c", "%t %T", mine).split() == [
            format(x, "x") for x in mm
        ]
        # the scheduler counts the held device against the 2 left: a pod asking for both
        # waits, though both are free on the host; one asking for one runs, on a node that
        # is there
        cluster.create_pod(ns, show_pod("both", {GENERIC_RESOURCE: 2}))
        cluster.wait_pod(ns, "both", _unschedulable, 30, "Unschedulable")
        one = run_all(cluster, ns, [show_pod("one", {GENERIC_RESOURCE: 1})])["one"]
        assert one.phase == "Succeeded", one.output
        assert set(one.under("/dev/kde2e/")) <= set(free)
        assert len(one.under("/dev/kde2e/")) == 1

"""A rolling upgrade of the GPU DRA driver on the real kubelet: instance B (its own pod UID,
so its own sockets) starts beside instance A, A gets SIGTERM, while pods with a 1-GPU claim
are created and deleted every 100 ms. No prepare fails, no ResourceSlice is written, a claim
A prepared is unprepared by B; and a B that cannot start leaves A serving."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from kubedevice.nvidia.fake.control import CONTROL_ENV

from .churn import FAILED_PREPARE, PodChurn, authorizer_race
from .cluster import NODE, Cluster
from .dra import (
    PREPARED,
    REGISTERED,
    UNPREPARED,
    GpuDra,
    claim_pod,
    claim_spec,
    create_template,
    delete_pod,
    device_class,
    log_count,
    pod_claim,
    request,
    resource_api,
    run_claim_pod,
    wait_slices,
)

pytestmark = pytest.mark.timeout(240)

DRIVER = "gpu.kubedevice.io"
IS_GPU = f'device.driver == "{DRIVER}"'
UID_A = "aaaaaaaa-0000-4000-8000-000000000001"
UID_B = "bbbbbbbb-0000-4000-8000-000000000002"


def _slice_versions(cluster: Cluster) -> dict[str, str]:
    """The driver's slices on the node: name -> resourceVersion (any write changes it)."""
    items = resource_api(cluster).list_resource_slice(field_selector=f"spec.driver={DRIVER}")
    return {
        s.metadata.name: s.metadata.resource_version
        for s in items.items
        if s.spec.node_name == NODE
    }


def _failed_prepares(cluster: Cluster, ns: str) -> list[str]:
    """The namespace's FailedPrepareDynamicResources events that a driver caused (not the
    kubelet's read of a new claim refused by the node authorizer: see churn.py)."""
    events = cluster.core.list_namespaced_event(ns).items
    return [
        text
        for e in events
        if e.reason == FAILED_PREPARE
        and not authorizer_race(text := f"{e.involved_object.name}: {e.message}")
    ]


def _checkpoint(drv: GpuDra) -> dict[str, Any]:
    assert drv.cluster.kubelet is not None
    path = drv.cluster.kubelet.root / "plugins" / DRIVER / "checkpoint.json"
    claims: dict[str, Any] = json.loads(path.read_text())["claims"]
    return claims


def test_a_rolling_upgrade_under_pod_churn_fails_no_pod_and_writes_no_slice(
    cluster: Cluster, ns: str, gpu_dra: Callable[..., GpuDra]
) -> None:
    a = gpu_dra(extra=("--pod-uid", UID_A))
    wait_slices(cluster, DRIVER, lambda n: len(n) == 8, "8 GPUs")
    b = a.sibling(["--pod-uid", UID_B], env={CONTROL_ENV: str(a.root / "nvml-b.sock")})
    with device_class(cluster, IS_GPU) as cls:
        create_template(cluster, ns, "one", claim_spec(request("gpu", cls)))
        run_claim_pod(cluster, ns, claim_pod("kept", template="one"))  # prepared by A
        kept = pod_claim(cluster, ns, "kept").metadata
        before = _slice_versions(cluster)
        churn = PodChurn(cluster, ns, claim_spec(request("gpu", cls)), interval=0.1, in_flight=3)
        churn.start()
        try:
            churn.wait_running(3)  # pods flow through A
            b.start()  # until the kubelet has registered B beside A
            assert a.process.alive()
            seen = len(churn.running)
            assert a.stop() == 0  # SIGTERM: A stops cleanly
            churn.wait_running(seen + 5)  # pods flow through B alone
        finally:
            churn.stop()
        handed_over = _slice_versions(cluster)
        delete_pod(cluster, ns, "kept")  # A prepared it; B must unprepare it
        b.wait_specs(lambda specs: not any(kept.uid in n for n in specs), "kept's spec gone")
    try:
        assert churn.errors == []
        assert churn.failed_prepares == []  # no NodePrepareResources failed
        assert log_count(a.log, "cannot prepare claim") == 0
        assert log_count(b.log, "cannot prepare claim") == 0
        assert _failed_prepares(cluster, ns) == []
        assert handed_over == before  # no slice created, replaced or deleted
        assert len(churn.running) >= 8
        assert log_count(a.log, f"{PREPARED}{ns}/{kept.name} ") == 1
        assert log_count(b.log, f"{UNPREPARED}{ns}/{kept.name} ") == 1
        assert log_count(b.log, "checkpoint changed by another instance") >= 1
        assert kept.uid not in _checkpoint(b)
        # each removed only its own sockets: A's are gone, B's serve
        assert cluster.kubelet is not None
        root = cluster.kubelet.root
        assert not (root / "plugins" / DRIVER / f"dra-{UID_A}.sock").exists()
        assert not (root / "plugins_registry" / f"{DRIVER}-{UID_A}-reg.sock").exists()
        assert (root / "plugins" / DRIVER / f"dra-{UID_B}.sock").exists()
        assert (root / "plugins_registry" / f"{DRIVER}-{UID_B}-reg.sock").exists()
    finally:
        b.stop()  # (the fixture starts A again if a pod is left to unprepare)


def test_a_new_instance_that_cannot_start_leaves_the_old_one_serving(
    cluster: Cluster, ns: str, gpu_dra: Callable[..., GpuDra]
) -> None:
    a = gpu_dra(extra=("--pod-uid", UID_A))
    wait_slices(cluster, DRIVER, lambda n: len(n) == 8, "8 GPUs")
    assert cluster.kubelet is not None
    blocked = cluster.kubelet.root / "plugins" / DRIVER / f"dra-{UID_B}.sock"
    blocked.mkdir(parents=True)  # B's DRA socket path is taken by a directory
    b = a.sibling(["--pod-uid", UID_B], env={CONTROL_ENV: str(a.root / "nvml-b.sock")})
    try:
        with device_class(cluster, IS_GPU) as cls:
            create_template(cluster, ns, "one", claim_spec(request("gpu", cls)))
            run_claim_pod(cluster, ns, claim_pod("before", template="one"))
            prepared = pod_claim(cluster, ns, "before").metadata
            before = _slice_versions(cluster)
            b.start(wait=False)
            assert b.process.popen is not None
            assert b.process.popen.wait(60) == 2
            [line] = [ln for ln in b.log.read_text().splitlines() if ln.startswith("error:")]
            assert f"{blocked} exists and is not a socket" in line, line
            assert log_count(b.log, REGISTERED) == 0
            # A still serves: its claim is still prepared, a new pod runs, slices untouched
            a.process.check_alive()
            assert prepared.uid in _checkpoint(a)
            assert any(prepared.uid in n for n in a.cdi_specs())
            run_claim_pod(cluster, ns, claim_pod("after", template="one"))
            assert log_count(a.log, PREPARED) == 2
            assert _slice_versions(cluster) == before
            assert _failed_prepares(cluster, ns) == []
    finally:
        blocked.rmdir()

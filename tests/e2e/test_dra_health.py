"""Device health a user can act on, on the real kubelet, API server and controller-manager.

An XID on an allocated GPU (through the fake NVML's control socket) reaches the pod's
``allocatedResourcesStatus`` as Unhealthy with the reason, and taints the GPU
``<driver>/xid=79`` (NoSchedule: the next pod gets another GPU). With ``evictOn`` (the GPU
driver's config) or ``--evict-on`` (the /dev driver's flag) the taint is NoExecute and the
controller-manager's device-taint eviction deletes the pods on the device, except those
whose claim tolerates the taint. Each test prints the seconds it measured.
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import watch

from .cluster import Cluster, ClusterError, free_port
from .dra import (
    CHECKED_DEV_CONFIG,
    POD_TIMEOUT,
    GenericDra,
    GpuDra,
    allocated,
    claim_pod,
    claim_spec,
    create_claim,
    create_template,
    delete_pod,
    device_class,
    device_health,
    pod_claim,
    release,
    request,
    resource_api,
    run_claim_pod,
    slice_devices,
    wait_for,
    wait_unschedulable,
)

pytestmark = pytest.mark.timeout(360)

GPU_DRIVER = "gpu.kubedevice.io"
DEV_DRIVER = "dev.kubedevice.io"
IS_GPU = f'device.driver == "{GPU_DRIVER}" && device.attributes["{GPU_DRIVER}"].type == "gpu"'


@pytest.fixture
def drivers(cluster: Cluster, ns: str) -> Iterator[list[Any]]:
    made: list[Any] = []
    yield made
    release(cluster, ns, made)
    for d in made:
        d.close()


def _uuid_is(uuid: str) -> str:
    return f'device.attributes["{GPU_DRIVER}"].uuid == "{uuid}"'


def _tolerating(req: dict[str, Any], key: str) -> dict[str, Any]:
    req["exactly"]["tolerations"] = [{"key": key, "operator": "Exists", "effect": "NoExecute"}]
    return req


def _wait_taint(cluster: Cluster, driver: str, device: str, what: str) -> Any:
    """Watch the slices until ``device`` has a taint; that taint."""

    def tainted(_s: Any) -> bool:
        d = slice_devices(cluster, driver).get(device)
        return d is not None and bool(d.taints)

    if not tainted(None):
        wait_for(
            resource_api(cluster).list_resource_slice,
            tainted,
            30,
            f"{driver} {device} tainted ({what})",
            field_selector=f"spec.driver={driver}",
        )
    [taint] = slice_devices(cluster, driver)[device].taints
    return taint


def _wait_evicted(cluster: Cluster, ns: str, name: str, timeout: float = 60) -> None:
    """Watch until the pod is being deleted (or gone)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        listing = cluster.core.list_namespaced_pod(ns, field_selector=f"metadata.name={name}")
        if not listing.items or listing.items[0].metadata.deletion_timestamp is not None:
            return
        w = watch.Watch()
        try:
            for ev in w.stream(
                cluster.core.list_namespaced_pod,
                ns,
                field_selector=f"metadata.name={name}",
                resource_version=listing.metadata.resource_version,
                timeout_seconds=max(1, int(deadline - time.monotonic())),
            ):
                pod = ev["object"]
                if ev["type"] == "DELETED" or pod.metadata.deletion_timestamp is not None:
                    return
        finally:
            w.stop()
    raise ClusterError(f"pod {ns}/{name} was not evicted in {timeout:.0f} s")


def _condition(entry: Any, kind: str) -> tuple[str, str]:
    [c] = [c for c in entry.conditions or [] if c.type == kind]
    return c.status, c.reason


def _wait_claim_device(cluster: Cluster, ns: str, claim: str, kind: str, status: str) -> Any:
    """Watch the claim until its status.devices entry of the GPU driver has ``kind`` at
    ``status``; that entry."""

    def entry(c: Any) -> Any:
        for d in c.status.devices or []:
            if d.driver == GPU_DRIVER and any(
                x.type == kind and x.status == status for x in d.conditions or []
            ):
                return d
        return None

    found = wait_for(
        resource_api(cluster).list_namespaced_resource_claim,
        lambda c: c.metadata.name == claim and entry(c) is not None,
        30,
        f"claim {claim}: {kind}={status} in status.devices",
        ns,
        field_selector=f"metadata.name={claim}",
    )
    return entry(found)


def _metrics(port: int) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


def _gpu_dra(
    cluster: Cluster, drivers: list[Any], config: str = "version: v1\n", **kwargs: Any
) -> GpuDra:
    drv = GpuDra(cluster, "dgx-8gpu", config=config, **kwargs)
    drivers.append(drv)
    drv.start()
    _wait_untainted(cluster, GPU_DRIVER, 8)
    return drv


def _wait_untainted(cluster: Cluster, driver: str, count: int) -> None:
    def ready(_s: Any) -> bool:
        devices = slice_devices(cluster, driver)
        return len(devices) == count and not any(d.taints for d in devices.values())

    if not ready(None):
        wait_for(
            resource_api(cluster).list_resource_slice,
            ready,
            30,
            f"{count} untainted devices of {driver}",
            field_selector=f"spec.driver={driver}",
        )


def test_a_watch_sees_a_claim_change(cluster: Cluster, ns: str) -> None:
    # the waits on a claim's status.devices watch ResourceClaims; the client could not build
    # the watched claims (no model V1ResourceClaim), so a wait failed unless the first list
    # already held what it waited for
    with device_class(cluster, IS_GPU) as cls:
        create_claim(cluster, ns, "c", claim_spec(request("gpu", cls)))
    api = resource_api(cluster)
    patched: list[bool] = []

    def labelled(c: Any) -> bool:
        if not patched:  # listed: change it now, so only the watch can see the change
            patched.append(True)
            api.patch_namespaced_resource_claim("c", ns, {"metadata": {"labels": {"x": "1"}}})
        return (c.metadata.labels or {}).get("x") == "1"

    found = wait_for(api.list_namespaced_resource_claim, labelled, 30, "claim labelled", ns)
    assert found.metadata.name == "c"
    assert patched == [True]


def test_an_xid_reaches_the_pod_status_with_its_reason_and_the_next_pod_gets_another_gpu(
    cluster: Cluster, ns: str, drivers: list[Any]
) -> None:
    port = free_port()
    drv = _gpu_dra(cluster, drivers, extra=("--metrics-address", f"127.0.0.1:{port}"))
    with device_class(cluster, IS_GPU) as cls:
        create_template(cluster, ns, "one", claim_spec(request("gpu", cls)))
        pod = run_claim_pod(cluster, ns, claim_pod("p", template="one"))
        assert device_health(pod) in ([], [("Healthy", None)], [("Healthy", "")])
        claim = pod_claim(cluster, ns, "p")
        [name] = allocated(claim)
        uuid = drv.uuids[int(name.removeprefix("gpu-"))]
        # the driver wrote the claim's status.devices: Ready, Healthy, which GPU
        entry = _wait_claim_device(cluster, ns, claim.metadata.name, "Healthy", "True")
        assert entry.data["uuid"] == uuid
        assert entry.data["pciBusID"]
        assert _condition(entry, "Ready") == ("True", "Prepared")
        # registered by the real kubelet: ready; serving: live
        for path in ("/readyz", "/healthz"):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
                assert (answer.status, answer.read()) == (200, b"ok\n")
        metrics = _metrics(port)  # the kubelet's prepare, counted (a pod sync may ask again)
        assert metrics['kubedevice_dra_requests_total{operation="prepare",result="ok"}'] >= 1
        assert metrics['kubedevice_dra_requests_total{operation="prepare",result="error"}'] == 0
        assert metrics["kubedevice_dra_prepared_devices"] == 1
        start = time.monotonic()
        drv.send({"op": "xid", "uuid": uuid, "xid": 79})
        taint = _wait_taint(cluster, GPU_DRIVER, name, "XID 79")
        tainted_s = time.monotonic() - start
        assert (taint.key, taint.value, taint.effect) == (f"{GPU_DRIVER}/xid", "79", "NoSchedule")

        def unhealthy(p: Any) -> bool:
            return ("Unhealthy", "XID 79: GPU has fallen off the bus") in device_health(p)

        cluster.wait_pod(ns, "p", unhealthy, 60, "allocatedResourcesStatus Unhealthy, XID 79")
        status_s = time.monotonic() - start
        entry = _wait_claim_device(cluster, ns, claim.metadata.name, "Healthy", "False")
        claim_s = time.monotonic() - start
        assert _condition(entry, "Healthy") == ("False", "Xid")
        print(
            f"\nXID -> taint on the slice {tainted_s:.2f} s; -> pod status {status_s:.2f} s; "
            f"-> claim status {claim_s:.2f} s"
        )
        # the pod keeps running (NoSchedule); once it is gone, the tainted GPU is free but
        # no new claim gets it: one that can have only it stays Pending, one offered it and
        # a spare gets the spare
        assert cluster.core.read_namespaced_pod("p", ns).metadata.deletion_timestamp is None
        delete_pod(cluster, ns, "p")
        spare = "gpu-1" if name == "gpu-0" else "gpu-0"
        spare_uuid = drv.uuids[int(spare.removeprefix("gpu-"))]
        by_uuid = f'device.attributes["{GPU_DRIVER}"].uuid'
        only_bad = f'{by_uuid} == "{uuid}"'
        either = f'{by_uuid} in ["{uuid}", "{spare_uuid}"]'
        create_template(cluster, ns, "bad", claim_spec(request("gpu", cls, 1, only_bad)))
        create_template(cluster, ns, "either", claim_spec(request("gpu", cls, 1, either)))
        cluster.core.create_namespaced_pod(ns, claim_pod("r", template="bad"))
        wait_unschedulable(cluster, ns, "r")
        run_claim_pod(cluster, ns, claim_pod("q", template="either"))
        assert allocated(pod_claim(cluster, ns, "q")) == [spare]


def test_evict_on_xid_moves_pods_off_the_gpu_unless_their_claim_tolerates_it(
    cluster: Cluster, ns: str, drivers: list[Any]
) -> None:
    drv = _gpu_dra(cluster, drivers, "version: v1\nhealth:\n  evictOn: [xid]\n")
    key = f"{GPU_DRIVER}/xid"
    with device_class(cluster, IS_GPU) as cls:
        u0, u1 = drv.uuids[0], drv.uuids[1]
        create_template(cluster, ns, "gpu0", claim_spec(request("gpu", cls, 1, _uuid_is(u0))))
        tolerant = _tolerating(request("gpu", cls, 1, _uuid_is(u1)), key)
        create_template(cluster, ns, "gpu1", claim_spec(tolerant))
        create_template(cluster, ns, "any", claim_spec(request("gpu", cls)))
        run_claim_pod(cluster, ns, claim_pod("victim", template="gpu0"))
        run_claim_pod(cluster, ns, claim_pod("tolerant", template="gpu1"))
        start = time.monotonic()
        drv.send({"op": "xid", "uuid": u1, "xid": 79})
        drv.send({"op": "xid", "uuid": u0, "xid": 79})
        taint = _wait_taint(cluster, GPU_DRIVER, "gpu-0", "XID 79, evict")
        assert (taint.key, taint.value, taint.effect) == (key, "79", "NoExecute")
        _wait_evicted(cluster, ns, "victim")
        evicted_s = time.monotonic() - start
        print(f"\nXID -> pod evicted (evictOn: [xid]) {evicted_s:.2f} s")
        events = [e.reason for e in cluster.events(ns, "victim")]
        assert "TaintManagerEviction" in events or "DeviceTaintManagerEviction" in events, events
        # the claim that tolerates the taint keeps its pod
        _wait_taint(cluster, GPU_DRIVER, "gpu-1", "XID 79, tolerated")
        pod = cluster.core.read_namespaced_pod("tolerant", ns)
        assert pod.metadata.deletion_timestamp is None
        assert pod.status.phase == "Running"
        # a new pod lands on a GPU without the XID
        run_claim_pod(cluster, ns, claim_pod("next", template="any"))
        [got] = allocated(pod_claim(cluster, ns, "next"))
        assert got not in ("gpu-0", "gpu-1")
        assert cluster.core.read_namespaced_pod("tolerant", ns).metadata.deletion_timestamp is None


def test_evict_on_a_failing_check_moves_the_pod_off_the_dev_device(
    cluster: Cluster, ns: str, drivers: list[Any]
) -> None:
    drv = GenericDra(cluster, CHECKED_DEV_CONFIG, extra=("--evict-on", "health-check"))
    drivers.append(drv)
    drv.host.add_char_device("/dev/e2e0")
    ok = drv.host.sys("/sys/class/e2e/e2e0")
    ok.mkdir(parents=True)
    (ok / "ok").write_text("1\n")
    drv.start()
    _wait_untainted(cluster, DEV_DRIVER, 1)
    [name] = slice_devices(cluster, DEV_DRIVER)
    is_dev = f'device.driver == "{DEV_DRIVER}"'
    with device_class(cluster, is_dev) as cls:
        create_template(cluster, ns, "dev", claim_spec(request("dev", cls)))
        pod = run_claim_pod(cluster, ns, claim_pod("p", template="dev"))
        assert pod.status.phase == "Running"
        (ok / "ok").write_text("0\n")
        taint = _wait_taint(cluster, DEV_DRIVER, name, "check failed")
        assert (taint.key, taint.value, taint.effect) == (
            f"{DEV_DRIVER}/health-check",
            "e2e",
            "NoExecute",
        )
        _wait_evicted(cluster, ns, "p", timeout=POD_TIMEOUT)

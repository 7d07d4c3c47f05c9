"""The DRA driver kit on the real scheduler and kubelet, with examples/dra_minimal.py.

The kubelet registers the driver through its plugin watcher, the scheduler allocates from
the driver's ResourceSlices with a CEL selector, the kubelet calls NodePrepareResources and
hands the runtime the claim's CDI device; a kubelet restart registers the driver again; a
driver restarted with the claim prepared unprepares it from its checkpoint when the pod goes.
"""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from .cluster import NODE, Cluster, Process, container, pod_manifest, poll_until, wait_for
from .dra import POD_TIMEOUT

pytestmark = pytest.mark.timeout(360)  # a DRA pod may wait for a pod resync (POD_TIMEOUT)

REPO = Path(__file__).resolve().parents[2]
DRIVER = "counter.example.com"


class ExampleDriver:
    """examples/dra_minimal.py as a process on the cluster's kubelet (restartable)."""

    def __init__(self, cluster: Cluster) -> None:
        assert cluster.kubelet is not None
        self.cluster = cluster
        work = cluster.workdir / f"dra-{uuid.uuid4().hex[:6]}"
        self.cdi = work / "cdi"
        self.cdi.mkdir(parents=True)
        self.log = work / "driver.log"
        argv = [
            sys.executable,
            str(REPO / "examples" / "dra_minimal.py"),
            "--node-name",
            NODE,
            "--kubeconfig",
            str(cluster.admin_kubeconfig),
            "--kubelet-dir",
            str(cluster.kubelet.root),
            "--cdi-dir",
            str(self.cdi),
        ]
        self.process = Process("dra-minimal", argv, self.log, work)
        cluster.add_log("dra-minimal", self.log)

    def start(self) -> None:
        self.process.start()

    def stop(self) -> int | None:
        return self.process.stop(timeout=30)

    def logged(self, text: str) -> int:
        return self.log.read_text().count(text)


@pytest.fixture
def dra_driver(cluster: Cluster) -> Iterator[ExampleDriver]:
    driver = ExampleDriver(cluster)
    driver.start()
    try:
        yield driver
    finally:
        assert driver.stop() == 0, driver.log.read_text()


def _resource(cluster: Cluster) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(cluster.api)


def test_pod_with_a_claim_gets_the_cdi_device_and_unprepares(
    cluster: Cluster, ns: str, dra_driver: ExampleDriver
) -> None:
    slices = client.ResourceV1Api(cluster.api)
    wait_for(
        slices.list_resource_slice,
        lambda s: len(s.spec.devices or []) == 4,
        60,
        "the driver's ResourceSlice with 4 devices",
        field_selector=f"spec.driver={DRIVER},spec.nodeName={NODE}",
    )
    # a pod the kubelet sees before the driver registered waits for a retry (a sync back-off
    # or the next pod sync): this test is about the claim, not about that race
    poll_until(
        "the driver registered with the kubelet",
        lambda: dra_driver.logged("registered with the kubelet") >= 1,
        timeout=60,
    )
    klass = f"counter-{uuid.uuid4().hex[:6]}"
    _resource(cluster).create_cluster_custom_object(
        "resource.k8s.io",
        "v1",
        "deviceclasses",
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": klass},
            "spec": {
                "selectors": [
                    {
                        "cel": {
                            "expression": (
                                f'device.driver == "{DRIVER}" && '
                                f'device.attributes["{DRIVER}"].index >= 2 && '
                                f'device.capacity["{DRIVER}"].memory'
                                '.compareTo(quantity("512Mi")) >= 0'
                            )
                        }
                    }
                ]
            },
        },
    )
    try:
        _resource(cluster).create_namespaced_custom_object(
            "resource.k8s.io",
            "v1",
            ns,
            "resourceclaimtemplates",
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaimTemplate",
                "metadata": {"name": "one-counter"},
                "spec": {
                    "spec": {
                        "devices": {
                            "requests": [
                                {"name": "c", "exactly": {"deviceClassName": klass, "count": 1}}
                            ],
                            "config": [
                                {
                                    "requests": ["c"],
                                    "opaque": {
                                        "driver": DRIVER,
                                        "parameters": {"greeting": "from e2e"},
                                    },
                                }
                            ],
                        }
                    }
                },
            },
        )
        main = container("main", {})
        main["resources"] = {"claims": [{"name": "counter"}]}
        manifest = pod_manifest("dra-pod", containers=[main])
        manifest["spec"]["resourceClaims"] = [
            {"name": "counter", "resourceClaimTemplateName": "one-counter"}
        ]
        cluster.run_pod(ns, manifest, timeout=POD_TIMEOUT)  # may wait for a pod resync

        pod = cluster.core.read_namespaced_pod("dra-pod", ns)
        claim_name = pod.status.resource_claim_statuses[0].resource_claim_name
        claim = _resource(cluster).get_namespaced_custom_object(
            "resource.k8s.io", "v1", ns, "resourceclaims", claim_name
        )
        uid = claim["metadata"]["uid"]
        device = claim["status"]["allocation"]["devices"]["results"][0]["device"]
        assert device in ("counter-2", "counter-3")  # the CEL selector's index >= 2
        assert cluster.kubelet is not None
        record = cluster.kubelet.created(ns, "dra-pod", "main")
        assert [d["name"] for d in record["cdiDevices"]] == [f"k8s.{DRIVER}/claim={uid}-{device}"]
        spec_file = dra_driver.cdi / f"k8s.{DRIVER}-claim_{uid}.json"
        spec = json.loads(spec_file.read_text())
        assert spec["devices"][0]["containerEdits"]["env"] == [
            f"COUNTER={device[-1]}",
            "GREETING=from e2e",
        ]

        # the health stream reaches the pod's status (ResourceHealthStatus, on in v1.36)
        def healthy(p: object) -> bool:
            statuses = p.status.container_statuses or []  # type: ignore[attr-defined]
            found = [
                (r.resource_id, r.health)
                for c in statuses
                for s in c.allocated_resources_status or []
                for r in s.resources or []
            ]
            return (f"k8s.{DRIVER}/claim={uid}-{device}", "Healthy") in found  # by CDI ID

        cluster.wait_pod(ns, "dra-pod", healthy, 60, "with its device Healthy in its status")

        # the kubelet restarts: it registers the driver again, the pod keeps its claim
        registered = dra_driver.logged("registered with the kubelet")
        cluster.restart_kubelet()
        poll_until(
            "the driver registered again",
            lambda: dra_driver.logged("registered with the kubelet") > registered,
            timeout=60,
        )
        # the driver restarts with the claim prepared: it unprepares it from its checkpoint
        assert dra_driver.stop() == 0
        dra_driver.start()
        poll_until(
            "the restarted driver registered",
            lambda: dra_driver.logged("registered with the kubelet") > registered + 1,
            timeout=60,
        )
        assert spec_file.exists()
        cluster.core.delete_namespaced_pod("dra-pod", ns, grace_period_seconds=0)
        poll_until("the claim's CDI spec removed", lambda: not spec_file.exists(), timeout=60)
    finally:
        _resource(cluster).delete_cluster_custom_object(
            "resource.k8s.io", "v1", "deviceclasses", klass
        )

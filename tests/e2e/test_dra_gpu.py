"""``kubedevice nvidia dra`` on the real scheduler, kubelet and runtime (fake NVML machines).

The real scheduler allocates from the driver's ResourceSlices with CEL, the real kubelet calls
NodePrepareResources, and kd-fakecri records the CDI device names the container gets; the CDI
spec in the driver's CDI dir names the right /dev/nvidiaN.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from .cluster import Cluster
from .dra import (
    POD_TIMEOUT,
    UNPREPARED,
    GpuDra,
    allocated,
    claim_pod,
    claim_spec,
    create_template,
    delete_pod,
    device_class,
    docs_yaml,
    log_count,
    pod_claim,
    request,
    run_claim_pod,
    share_one_claim,
    slice_devices,
    wait_file,
    wait_slices,
    wait_unschedulable,
)

# a DRA pod may wait for the kubelet's next pod sync (see dra.POD_TIMEOUT)
pytestmark = pytest.mark.timeout(360)

DRIVER = "gpu.kubedevice.io"
IS_GPU = f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].type == "gpu"'


def _cdi_ids(record: dict[str, Any]) -> list[str]:
    return [d["name"] for d in record.get("cdiDevices") or []]


def _spec_nodes(spec: dict[str, Any]) -> dict[str, list[str]]:
    """CDI device name -> its device nodes' host paths."""
    return {
        d["name"]: [n["hostPath"] for n in d["containerEdits"].get("deviceNodes", [])]
        for d in spec["devices"]
    }


def test_two_gpus_of_one_nvlink_domain_reach_the_container(
    cluster: Cluster, ns: str, gpu_dra: Callable[..., GpuDra]
) -> None:
    drv = gpu_dra()
    names = wait_slices(cluster, DRIVER, lambda n: len(n) == 8, "8 GPUs")
    assert names == {f"gpu-{i}" for i in range(8)}
    with device_class(cluster, IS_GPU) as cls:
        # GPUs 3..7 are candidates; 3 is alone in NVLink domain 0 among them, so the
        # matchAttribute constraint leaves two of 4..7 (domain 4)
        create_template(
            cluster,
            ns,
            "two",
            claim_spec(
                request("gpus", cls, 2, f'device.attributes["{DRIVER}"].index >= 3'),
                match_attribute=f"{DRIVER}/nvlinkDomain",
            ),
        )
        run_claim_pod(cluster, ns, claim_pod("p", template="two"))
        claim = pod_claim(cluster, ns, "p")
        got = allocated(claim)
        assert len(got) == 2
        assert set(got) <= {"gpu-4", "gpu-5", "gpu-6", "gpu-7"}
        record = cluster.kubelet.created(ns, "p", "main")  # type: ignore[union-attr]
        ids = _cdi_ids(record)
        assert len(ids) == 2
        assert all(i.startswith(f"k8s.{DRIVER}/claim=") for i in ids)
        [(_file, spec)] = drv.cdi_specs().items()
        nodes = _spec_nodes(spec)
        for cdi_id, device in zip(sorted(ids), sorted(got), strict=True):
            name = cdi_id.split("=", 1)[1]
            assert nodes[name][0] == f"/dev/nvidia{device.removeprefix('gpu-')}"
        assert f"{spec['kind']}={name}" in ids
        delete_pod(cluster, ns, "p")
        drv.wait_specs(lambda specs: not specs, "the claim's CDI spec removed")


def test_capacity_selector_with_quantity(
    cluster: Cluster, ns: str, gpu_dra: Callable[..., GpuDra]
) -> None:
    gpu_dra()
    wait_slices(cluster, DRIVER, lambda n: len(n) == 8, "8 GPUs")
    memory = f'device.capacity["{DRIVER}"].memory'
    with (
        device_class(cluster, IS_GPU, f'{memory}.compareTo(quantity("79Gi")) >= 0') as big,
        device_class(cluster, IS_GPU, f'{memory}.compareTo(quantity("100Gi")) >= 0') as huge,
    ):
        create_template(cluster, ns, "big", claim_spec(request("gpu", big)))
        create_template(cluster, ns, "huge", claim_spec(request("gpu", huge)))
        run_claim_pod(cluster, ns, claim_pod("fits", template="big"))
        cluster.create_pod(ns, claim_pod("too-big", template="huge"))
        wait_unschedulable(cluster, ns, "too-big")


def test_a_claim_shared_by_two_pods_is_prepared_once(
    cluster: Cluster, ns: str, gpu_dra: Callable[..., GpuDra]
) -> None:
    drv = gpu_dra()
    wait_slices(cluster, DRIVER, lambda n: len(n) == 8, "8 GPUs")
    with device_class(cluster, IS_GPU) as cls:
        share_one_claim(cluster, ns, drv, cls)


def test_a_restarted_driver_unprepares_what_it_prepared(
    cluster: Cluster, ns: str, gpu_dra: Callable[..., GpuDra]
) -> None:
    drv = gpu_dra()
    wait_slices(cluster, DRIVER, lambda n: len(n) == 8, "8 GPUs")
    with device_class(cluster, IS_GPU) as cls:
        create_template(cluster, ns, "one", claim_spec(request("gpu", cls)))
        run_claim_pod(cluster, ns, claim_pod("p", template="one"))
        assert len(drv.cdi_specs()) == 1
        drv.kill()  # a crash: no clean-up
        drv.start()
        delete_pod(cluster, ns, "p")
        drv.wait_specs(lambda specs: not specs, "the spec removed by the restarted driver")
        # the restarted process did it (the spec goes just before the line is logged)
        wait_file(drv.log, lambda p: log_count(p, UNPREPARED) >= 1, 30, "unprepared, logged")
        assert log_count(drv.log, UNPREPARED) == 1


def test_kubelet_restart_registers_again(
    cluster: Cluster, ns: str, gpu_dra: Callable[..., GpuDra]
) -> None:
    drv = gpu_dra()
    wait_slices(cluster, DRIVER, lambda n: len(n) == 8, "8 GPUs")
    with device_class(cluster, IS_GPU) as cls:
        create_template(cluster, ns, "one", claim_spec(request("gpu", cls)))
        run_claim_pod(cluster, ns, claim_pod("dra-before", template="one"))
        registered = log_count(drv.log, "registered with the kubelet as DRA driver")
        cluster.restart_kubelet()
        drv.wait_registered(registered + 1)
        run_claim_pod(cluster, ns, claim_pod("dra-after", template="one"))
        got = allocated(pod_claim(cluster, ns, "dra-after"))
        assert got != allocated(pod_claim(cluster, ns, "dra-before"))
        wait_slices(cluster, DRIVER, lambda n: len(n) == 8, "still 8 GPUs")


def test_a_lost_gpu_is_tainted_and_not_allocated(
    cluster: Cluster, ns: str, gpu_dra: Callable[..., GpuDra]
) -> None:
    drv = gpu_dra()
    wait_slices(cluster, DRIVER, lambda n: len(n) == 8, "8 GPUs")
    lost = drv.uuids[1]
    drv.send({"op": "lost", "uuid": lost})
    names = wait_slices(cluster, DRIVER, lambda n: "gpu-1" not in n, "gpu-1 tainted")
    assert names == {f"gpu-{i}" for i in range(8)} - {"gpu-1"}
    [taint] = slice_devices(cluster, DRIVER)["gpu-1"].taints  # still published, tainted
    assert (taint.key, taint.value) == (f"{DRIVER}/gpu-lost", None)  # keyed by why
    assert taint.effect == "NoSchedule"
    assert taint.time_added is not None
    with device_class(cluster, IS_GPU) as cls:
        create_template(
            cluster,
            ns,
            "that-one",
            claim_spec(request("gpu", cls, 1, f'device.attributes["{DRIVER}"].uuid == "{lost}"')),
        )
        cluster.create_pod(ns, claim_pod("p", template="that-one"))
        wait_unschedulable(cluster, ns, "p")
        drv.send({"op": "recover", "uuid": lost})
        wait_slices(cluster, DRIVER, lambda n: "gpu-1" in n, "gpu-1 back", timeout=90)
        cluster.wait_running(ns, "p", timeout=POD_TIMEOUT)
        assert allocated(pod_claim(cluster, ns, "p")) == ["gpu-1"]


def test_claims_written_for_nvidias_driver_select_the_same_gpus(
    cluster: Cluster, ns: str, gpu_dra: Callable[..., GpuDra]
) -> None:
    nv = "gpu.nvidia.com"
    gpu_dra(driver=nv)
    wait_slices(cluster, nv, lambda n: len(n) == 8, "8 GPUs")
    attrs = f"device.attributes['{nv}']"
    # NVIDIA's DeviceClass gpu.nvidia.com and a claim on its documented attributes
    with device_class(
        cluster, f"device.driver == '{nv}' && {attrs}.type == 'gpu'", prefix="gpu-nvidia-com"
    ) as cls:
        create_template(
            cluster,
            ns,
            "nv",
            claim_spec(
                request(
                    "gpu",
                    cls,
                    1,
                    f"{attrs}.productName == 'NVIDIA H100 80GB HBM3'",
                    f"{attrs}.architecture == 'Hopper' && {attrs}.brand == 'Nvidia'",
                    f"{attrs}.cudaComputeCapability.isGreaterThan(semver('8.9.0'))",
                    f"{attrs}.driverVersion.compareTo(semver('570.0.0')) >= 0",
                    f"{attrs}.cudaDriverVersion.isGreaterThan(semver('12.0.0'))",
                    f"{attrs}.migEnabled == false",
                )
            ),
        )
        run_claim_pod(cluster, ns, claim_pod("p", template="nv"))
        assert allocated(pod_claim(cluster, ns, "p"))[0].startswith("gpu-")


def test_a_bad_gpu_config_fails_prepare_naming_the_field(
    cluster: Cluster, ns: str, gpu_dra: Callable[..., GpuDra]
) -> None:
    gpu_dra()
    wait_slices(cluster, DRIVER, lambda n: len(n) == 8, "8 GPUs")
    bad = {
        "apiVersion": "resource.kubedevice.io/v1",
        "kind": "GpuConfig",
        "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Forever"}},
    }
    with device_class(cluster, IS_GPU) as cls:
        create_template(
            cluster, ns, "bad", claim_spec(request("gpu", cls), config=bad, driver=DRIVER)
        )
        cluster.create_pod(ns, claim_pod("p", template="bad"))
        cluster.wait_scheduled(ns, "p")

        def failed() -> bool:
            return any(
                "sharing.timeSlicingConfig.interval" in (e.message or "")
                for e in cluster.events(ns, "p")
            )

        from .cluster import wait_for

        wait_for(
            cluster.core.list_namespaced_event,
            lambda _e: failed(),
            60,
            "an event naming sharing.timeSlicingConfig.interval",
            ns,
        )
        pod = cluster.core.read_namespaced_pod("p", ns)
        assert pod.status.phase == "Pending"


def test_the_charts_rbac_is_enough(
    cluster: Cluster, ns: str, gpu_dra: Callable[..., GpuDra], tmp_path: Path
) -> None:
    """The driver runs as a ServiceAccount bound to the chart's own ClusterRole, nothing more,
    with a token bound to a pod on the node (as the kubelet gives the chart's DaemonSet pod:
    the API server then knows the driver's node, which status writes need)."""
    from deploy.render import render
    from kubernetes import client

    from .cluster import NODE, wait_for, write_kubeconfig
    from .dra import resource_api

    [role] = [
        d
        for d in render(values={"dra.nvidia.enabled": "true"})
        if d["kind"] == "ClusterRole" and d["metadata"]["name"].endswith("dra-nvidia")
    ]
    rbac = client.RbacAuthorizationV1Api(cluster.api)
    name = f"dra-rbac-{ns}"[:60]
    role["metadata"] = {"name": name}
    rbac.create_cluster_role(role)
    try:
        cluster.core.create_namespaced_service_account(ns, {"metadata": {"name": "driver"}})
        rbac.create_cluster_role_binding(
            {
                "metadata": {"name": name},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": name,
                },
                "subjects": [{"kind": "ServiceAccount", "name": "driver", "namespace": ns}],
            }
        )
        holder = cluster.core.create_namespaced_pod(
            ns,
            {
                "metadata": {"name": "driver"},
                "spec": {
                    "nodeName": NODE,
                    "serviceAccountName": "driver",
                    "automountServiceAccountToken": False,
                    "terminationGracePeriodSeconds": 0,
                    "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}],
                },
            },
        )
        bound = {"apiVersion": "v1", "kind": "Pod", "name": "driver", "uid": holder.metadata.uid}
        token = cluster.core.create_namespaced_service_account_token(
            "driver", ns, {"spec": {"expirationSeconds": 3600, "boundObjectRef": bound}}
        ).status.token
        kubeconfig = write_kubeconfig(
            tmp_path / "driver.kubeconfig",
            cluster.server,
            cluster.pki / "ca.crt",
            f"system:serviceaccount:{ns}:driver",
            token,
        )
        drv = gpu_dra(kubeconfig=kubeconfig)
        wait_slices(cluster, DRIVER, lambda n: len(n) == 8, "8 GPUs")
        with device_class(cluster, IS_GPU) as cls:
            create_template(cluster, ns, "one", claim_spec(request("gpu", cls)))
            run_claim_pod(cluster, ns, claim_pod("p", template="one"))
            claim = pod_claim(cluster, ns, "p").metadata.name
            wait_for(  # the claim's status.devices, written with the chart's RBAC
                resource_api(cluster).list_namespaced_resource_claim,
                lambda c: c.metadata.name == claim and bool(c.status.devices),
                30,
                f"claim {claim}: status.devices written",
                ns,
            )
            delete_pod(cluster, ns, "p")
            drv.wait_specs(lambda specs: not specs, "the claim's CDI spec removed")
        assert "Forbidden" not in drv.log.read_text()
        assert " 403" not in drv.log.read_text()
    finally:
        rbac.delete_cluster_role_binding(name)
        rbac.delete_cluster_role(name)


def test_the_docs_examples_run_as_written(
    cluster: Cluster, ns: str, gpu_dra: Callable[..., GpuDra]
) -> None:
    from .dra import resource_api

    docs = docs_yaml()
    kinds = [d["kind"] for d in docs]
    assert kinds == [
        "DeviceClass", "ResourceClaimTemplate", "Pod", "DeviceClass", "ResourceClaim", "Pod"
    ]  # fmt: skip
    gpu_dra()
    wait_slices(cluster, DRIVER, lambda n: len(n) == 8, "8 GPUs")
    api = resource_api(cluster)
    classes = [d for d in docs if d["kind"] == "DeviceClass"]
    for cls in classes:
        api.create_device_class(cls)
    try:
        [template] = [d for d in docs if d["kind"] == "ResourceClaimTemplate"]
        api.create_namespaced_resource_claim_template(ns, template)
        [pod] = [d for d in docs if d["kind"] == "Pod" and "two-linked-gpus" in str(d)]
        run_claim_pod(cluster, ns, pod)
        got = sorted(allocated(pod_claim(cluster, ns, pod["metadata"]["name"])))
        # two GPUs of one NVLink clique of the dgx-8gpu machine (0-3 or 4-7)
        assert len(got) == 2
        assert len({int(g.removeprefix("gpu-")) // 4 for g in got}) == 1
    finally:
        for cls in classes:
            api.delete_device_class(cls["metadata"]["name"])


def test_mig_devices_with_their_capability_nodes(
    cluster: Cluster, ns: str, gpu_dra: Callable[..., GpuDra]
) -> None:
    drv = gpu_dra("mig-mixed", config="version: v1\nflags:\n  migStrategy: mixed\n")
    names = wait_slices(cluster, DRIVER, lambda n: len(n) > 4, "the MIG devices")
    assert "gpu-2" in names  # MIG-capable but disabled: whole
    assert "gpu-0-mig-1g-18gb-9-0" in names
    attrs = f'device.attributes["{DRIVER}"]'
    with device_class(cluster, f'device.driver == "{DRIVER}" && {attrs}.type == "mig"') as cls:
        create_template(
            cluster,
            ns,
            "slice",
            claim_spec(
                request("mig", cls, 1, f'{attrs}.profile == "1g.18gb" && {attrs}.parentIndex == 0')
            ),
        )
        run_claim_pod(cluster, ns, claim_pod("p", template="slice"))
        [got] = allocated(pod_claim(cluster, ns, "p"))
        assert got.startswith("gpu-0-mig-1g-18gb-")
        [spec] = drv.cdi_specs().values()
        [nodes] = _spec_nodes(spec).values()
        assert nodes[0] == "/dev/nvidia0"
        caps = [n for n in nodes if n.startswith("/dev/nvidia-caps/nvidia-cap")]
        assert len(caps) == 2


def test_an_xid_on_an_allocated_gpu_reaches_the_pod_status(
    cluster: Cluster, ns: str, gpu_dra: Callable[..., GpuDra]
) -> None:
    drv = gpu_dra()
    wait_slices(cluster, DRIVER, lambda n: len(n) == 8, "8 GPUs")
    with device_class(cluster, IS_GPU) as cls:
        create_template(cluster, ns, "one", claim_spec(request("gpu", cls)))
        run_claim_pod(cluster, ns, claim_pod("p", template="one"))
        [name] = allocated(pod_claim(cluster, ns, "p"))
        uuid = drv.uuids[int(name.removeprefix("gpu-"))]
        drv.send({"op": "xid", "uuid": uuid, "xid": 79})
        wait_slices(cluster, DRIVER, lambda n: name not in n, f"{name} tainted")

        def unhealthy(p: Any) -> bool:
            for status in p.status.container_statuses or []:
                for res in status.allocated_resources_status or []:
                    if any(r.health == "Unhealthy" for r in res.resources or []):
                        return True
            return False

        pod = cluster.wait_pod(ns, "p", unhealthy, 60, "allocatedResourcesStatus Unhealthy")
        [res] = pod.status.container_statuses[0].allocated_resources_status
        assert res.name.startswith("claim:")
        assert [r.health for r in res.resources] == ["Unhealthy"]


def test_cleanup_removes_the_slices_and_specs(
    cluster: Cluster, ns: str, gpu_dra: Callable[..., GpuDra]
) -> None:
    import subprocess

    from .cluster import NODE
    from .dra import KUBEDEVICE

    drv = gpu_dra()
    wait_slices(cluster, DRIVER, lambda n: len(n) == 8, "8 GPUs")
    with device_class(cluster, IS_GPU) as cls:
        create_template(cluster, ns, "one", claim_spec(request("gpu", cls)))
        run_claim_pod(cluster, ns, claim_pod("p", template="one"))
        assert len(drv.cdi_specs()) == 1
        drv.stop()
        proc = subprocess.run(
            [KUBEDEVICE, "nvidia", "dra", "--cleanup", "--node-name", NODE,
             "--cdi-dir", str(drv.cdi_dir), "--kubeconfig", str(cluster.admin_kubeconfig)],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert "removed 2 " in proc.stdout  # one slice, one spec
        assert wait_slices(cluster, DRIVER, lambda n: not n, "no slices") == set()
        assert drv.cdi_specs() == {}

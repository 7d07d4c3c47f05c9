"""The claim path of ``kubedevice nvidia dra`` on the real scheduler and kubelet: a
prioritized-list request's devices reach the container that names the request, a CDI spec
lost with a reboot is written again, a device already prepared for one claim is refused to a
hand-written second claim, and claims written for NVIDIA's driver select MIG devices by
NVIDIA's capacities."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest

from .cluster import NODE, Cluster, wait_for
from .dra import (
    GpuDra,
    allocated,
    claim_pod,
    claim_spec,
    create_claim,
    create_template,
    device_class,
    pod_claim,
    request,
    resource_api,
    run_claim_pod,
    slice_devices,
    wait_slices,
)

pytestmark = pytest.mark.timeout(360)  # a DRA pod may wait for a pod resync (POD_TIMEOUT)

DRIVER = "gpu.kubedevice.io"
IS_GPU = f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].type == "gpu"'
CAP = f'device.capacity["{DRIVER}"]'


def _cdi_ids(cluster: Cluster, ns: str, pod: str, container: str) -> list[str]:
    assert cluster.kubelet is not None
    record = cluster.kubelet.created(ns, pod, container)
    return sorted(d["name"] for d in record.get("cdiDevices") or [])


def test_a_first_available_requests_devices_reach_the_container_naming_it(
    cluster: Cluster, ns: str, gpu_dra: Callable[..., GpuDra]
) -> None:
    gpu_dra()
    wait_slices(cluster, DRIVER, lambda n: len(n) == 8, "8 GPUs")
    with device_class(cluster, IS_GPU) as cls:
        spec = claim_spec(request("other", cls))
        spec["devices"]["requests"].insert(
            0,
            {
                "name": "gpu",
                "firstAvailable": [  # no GPU has 1 TiB: the scheduler takes "small"
                    {
                        "name": "big",
                        "deviceClassName": cls,
                        "selectors": [
                            {"cel": {"expression": f'{CAP}.memory.compareTo(quantity("1Ti")) >= 0'}}
                        ],
                    },
                    {"name": "small", "deviceClassName": cls, "count": 2},
                ],
            },
        )
        create_template(cluster, ns, "first", spec)
        pod = claim_pod("p", template="first")
        main = pod["spec"]["containers"][0]
        main["resources"] = {"claims": [{"name": "dev", "request": "gpu"}]}
        pod["spec"]["containers"].append(
            {"name": "all", "image": main["image"], "resources": {"claims": [{"name": "dev"}]}}
        )
        run_claim_pod(cluster, ns, pod)
        claim = pod_claim(cluster, ns, "p")
        results = claim.status.allocation.devices.results
        assert sorted(r.request for r in results) == ["gpu/small", "gpu/small", "other"]
        named = _cdi_ids(cluster, ns, "p", "main")
        everything = _cdi_ids(cluster, ns, "p", "all")
        gpu_devices = sorted(r.device for r in results if r.request == "gpu/small")
        uid = claim.metadata.uid
        assert named == sorted(f"k8s.{DRIVER}/claim={uid}-{d}" for d in gpu_devices)
        assert len(everything) == 3
        assert set(named) < set(everything)


def test_a_spec_lost_with_the_cdi_dir_comes_back_from_the_checkpoint(
    cluster: Cluster, ns: str, gpu_dra: Callable[..., GpuDra]
) -> None:
    drv = gpu_dra()
    wait_slices(cluster, DRIVER, lambda n: len(n) == 8, "8 GPUs")
    with device_class(cluster, IS_GPU) as cls:
        create_template(cluster, ns, "one", claim_spec(request("gpu", cls)))
        run_claim_pod(cluster, ns, claim_pod("p", template="one"))
        before = drv.cdi_specs()
        assert len(before) == 1
        drv.stop()
        for path in drv.cdi_dir.iterdir():  # a reboot empties the CDI dir (a tmpfs)
            path.unlink()
        drv.start()
        drv.wait_specs(lambda specs: specs == before, "the spec written again at start")


def test_a_device_prepared_for_one_claim_is_refused_to_a_hand_written_second(
    cluster: Cluster, ns: str, gpu_dra: Callable[..., GpuDra]
) -> None:
    gpu_dra()
    wait_slices(cluster, DRIVER, lambda n: len(n) == 8, "8 GPUs")
    api = resource_api(cluster)
    with device_class(cluster, IS_GPU) as cls:
        create_template(cluster, ns, "one", claim_spec(request("gpu", cls)))
        run_claim_pod(cluster, ns, claim_pod("first", template="one"))
        owner = pod_claim(cluster, ns, "first")
        [device] = allocated(owner)
        create_claim(cluster, ns, "dup", claim_spec(request("gpu", cls)))
        api.patch_namespaced_resource_claim_status(
            "dup",
            ns,
            {
                "status": {
                    "allocation": {
                        # as the scheduler writes it (it would add one: immutable then)
                        "allocationTimestamp": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                        "devices": {
                            "results": [
                                {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": device}
                            ]
                        },
                    }
                }
            },
        )
        dup = api.read_namespaced_resource_claim("dup", ns)
        cluster.create_pod(ns, claim_pod("second", claim="dup"))
        want = (
            f"device {device} (pool {NODE}) is already prepared for claim "
            f"{ns}/{owner.metadata.name} ({owner.metadata.uid}); claim {ns}/dup "
            f"({dup.metadata.uid}) is allocated the same device"
        )

        def refused(_events: Any) -> bool:
            return any(
                e.reason == "FailedPrepareDynamicResources" and want in (e.message or "")
                for e in cluster.events(ns, "second")
            )

        wait_for(cluster.core.list_namespaced_event, refused, 120, "the refusal event", ns)
        assert cluster.core.read_namespaced_pod("second", ns).status.phase == "Pending"


def test_claims_written_for_nvidias_driver_select_mig_devices_by_its_capacities(
    cluster: Cluster, ns: str, gpu_dra: Callable[..., GpuDra]
) -> None:
    gpu_dra("mig-mixed", config="version: v1\nflags:\n  migStrategy: mixed\n")
    wait_slices(cluster, DRIVER, lambda n: len(n) > 4, "the MIG devices")
    published = slice_devices(cluster, DRIVER)
    big = published["gpu-0-mig-3g-71gb-2-0"].capacity
    assert {k: v.value for k, v in big.items() if k != "memory"} == {
        "multiprocessors": "60",
        "copyEngines": "3",
        "decoders": "3",
        "encoders": "0",
        "jpegEngines": "3",
        "ofaEngines": "0",
        **{f"memorySlice{i}": "1" for i in range(4, 8)},
    }
    q = 'quantity("{}")'.format
    selector = " && ".join(
        [
            f'device.attributes["{DRIVER}"].type == "mig"',
            f"{CAP}.multiprocessors.compareTo({q(60)}) >= 0",
            f"{CAP}.copyEngines.compareTo({q(3)}) >= 0",
            f"{CAP}.decoders.compareTo({q(3)}) >= 0",
            f"{CAP}.encoders.compareTo({q(0)}) == 0",
            f"{CAP}.jpegEngines.compareTo({q(3)}) >= 0",
            f"{CAP}.ofaEngines.compareTo({q(0)}) == 0",
            f'"memorySlice4" in {CAP}',
        ]
    )
    with device_class(cluster, f'device.driver == "{DRIVER}"') as cls:
        create_template(cluster, ns, "nv", claim_spec(request("mig", cls, 1, selector)))
        run_claim_pod(cluster, ns, claim_pod("p", template="nv"))
        [got] = allocated(pod_claim(cluster, ns, "p"))
    # 3g/4g instances (60 or 64 SMs) placed at memory slice 4
    assert got in {"gpu-0-mig-3g-71gb-2-0", "gpu-1-mig-3g-71gb-2-0"}

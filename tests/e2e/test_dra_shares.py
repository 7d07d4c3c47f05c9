"""Consumable capacity end to end: the real scheduler shares one device between claims
(``allowMultipleAllocations``, request policies, share IDs), the real kubelet prepares each
share, and a driver killed between two prepares restores the shares from its checkpoint.

* ``kubedevice nvidia dra --memory-shares`` on a fake machine with one 80 GiB GPU: four
  claims of 20Gi each get a share of it, a fifth waits until one is deleted.
* ``kubedevice run --dra`` with ``shares: 3`` on a /dev group: three pods in two
  namespaces share one node, the fourth waits.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from .cluster import Cluster, namespace
from .dra import (
    POD_TIMEOUT,
    UNPREPARED,
    GenericDra,
    GpuDra,
    claim_pod,
    create_template,
    delete_pod,
    device_class,
    log_count,
    pod_claim,
    release,
    slice_devices,
    wait_file,
    wait_slices,
    wait_unschedulable,
)

pytestmark = pytest.mark.timeout(600)

GPU = "gpu.kubedevice.io"
DEV = "dev.kubedevice.io"
GIB = 1 << 30
LIMIT = "KUBEDEVICE_GPU_MEMORY_LIMIT"


def _template(cluster: Cluster, ns: str, name: str, cls: str, **capacity: str) -> None:
    exactly: dict[str, Any] = {"deviceClassName": cls, "allocationMode": "ExactCount", "count": 1}
    if capacity:
        exactly["capacity"] = {"requests": capacity}
    create_template(
        cluster, ns, name, {"devices": {"requests": [{"name": "dev", "exactly": exactly}]}}
    )


def _docs_manifests() -> dict[str, dict[str, Any]]:
    """The manifests of docs/dra.md, "Sharing a device between claims", by kind."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "dra.md").read_text()
    section = text[text.index("## Sharing a device between claims") :]
    section = section[: section.index("\n## ", 1)]
    block = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    return {d["kind"]: d for d in yaml.safe_load_all(block) if d}


def _share(cluster: Cluster, ns: str, pod: str) -> tuple[str, str, dict[str, str]]:
    """(device, share ID, consumed capacity) of the pod's claim."""
    [result] = pod_claim(cluster, ns, pod).status.allocation.devices.results
    consumed = {k: str(v) for k, v in (result.consumed_capacity or {}).items()}
    return result.device, result.share_id, consumed


def _spec_env(drv: GpuDra | GenericDra) -> dict[str, list[str]]:
    """CDI device name -> its env, over every spec in the driver's CDI dir."""
    return {
        d["name"]: d["containerEdits"].get("env", [])
        for spec in drv.cdi_specs().values()
        for d in spec["devices"]
    }


@pytest.fixture
def drivers(cluster: Cluster, ns: str) -> Iterator[list[GpuDra | GenericDra]]:
    made: list[GpuDra | GenericDra] = []
    yield made
    release(cluster, ns, list(made))
    for d in made:
        d.close()


def test_four_20gi_shares_of_one_80gi_gpu_and_a_fifth_waits(
    cluster: Cluster, ns: str, drivers: list[GpuDra | GenericDra]
) -> None:
    drv = GpuDra(cluster, "one-gpu-80gib", extra=("--memory-shares",))
    drivers.append(drv)
    drv.start()
    wait_slices(cluster, GPU, lambda n: n == {"gpu-0"}, "the one GPU")
    published = slice_devices(cluster, GPU)["gpu-0"]
    assert published.allow_multiple_allocations is True
    policy = published.capacity["memory"].request_policy
    assert (policy.default, policy.valid_range.min, policy.valid_range.step) == (
        "80Gi",
        "1Gi",
        "1Gi",
    )
    kubelet = cluster.kubelet
    assert kubelet is not None
    docs = _docs_manifests()  # the DeviceClass and claim template of docs/dra.md
    [selector] = docs["DeviceClass"]["spec"]["selectors"]
    with device_class(cluster, selector["cel"]["expression"]) as cls:
        template = docs["ResourceClaimTemplate"]
        [req] = template["spec"]["spec"]["devices"]["requests"]
        assert req["exactly"]["capacity"] == {"requests": {"memory": "20Gi"}}
        req["exactly"]["deviceClassName"] = cls
        create_template(cluster, ns, "quarter", template["spec"]["spec"])
        # two shares prepared, then the driver is killed (-9) and started again...
        # one pod at a time: two created at once once left the second Unschedulable
        # with 60Gi of 80Gi allocated, and the scheduler did not retry it within 150 s
        for pod in ("p1", "p2"):
            cluster.run_pod(ns, claim_pod(pod, template="quarter"), timeout=POD_TIMEOUT)
        assert len(drv.cdi_specs()) == 2
        drv.kill()
        drv.start()
        # ...and the next two are prepared by the new process beside the restored two
        for pod in ("p3", "p4"):
            cluster.run_pod(ns, claim_pod(pod, template="quarter"), timeout=POD_TIMEOUT)
        shares = {pod: _share(cluster, ns, pod) for pod in ("p1", "p2", "p3", "p4")}
        assert {s[0] for s in shares.values()} == {"gpu-0"}
        assert len({s[1] for s in shares.values()}) == 4  # four distinct share IDs
        assert all(s[2] == {"memory": "20Gi"} for s in shares.values())
        # each container got its own CDI device, named for its share, told 20Gi
        envs = _spec_env(drv)
        assert len(envs) == 4
        for pod, (_device, share, _used) in shares.items():
            [cdi] = [d["name"] for d in kubelet.created(ns, pod, "main")["cdiDevices"]]
            name = cdi.split("=", 1)[1]
            assert name.endswith(f"-gpu-0-{share}")
            assert f"{LIMIT}={20 * GIB}" in envs[name]
        # the GPU is full: a fifth 20Gi claim waits, and runs once a share is given back
        cluster.create_pod(ns, claim_pod("p5", template="quarter"))
        wait_unschedulable(cluster, ns, "p5")
        delete_pod(cluster, ns, "p1")
        cluster.wait_running(ns, "p5", timeout=POD_TIMEOUT)
        assert _share(cluster, ns, "p5")[1] not in {s[1] for s in shares.values()}
        # every share is unprepared by the restarted process, p1 and p2 from its checkpoint
        for pod in ("p2", "p3", "p4", "p5"):
            delete_pod(cluster, ns, pod)
        drv.wait_specs(lambda specs: not specs, "every share's spec removed")
        wait_file(drv.log, lambda p: log_count(p, UNPREPARED) >= 5, 60, "5 unprepared")
        assert log_count(drv.log, UNPREPARED) == 5


def test_a_dev_group_with_three_shares_serves_three_pods_in_two_namespaces(
    cluster: Cluster, ns: str, drivers: list[GpuDra | GenericDra]
) -> None:
    config = """\
version: v1
resources:
  - name: example.com/serial
    groups:
      - name: ports
        paths:
          - path: /dev/ttyS9*
        shares: 3
"""
    drv = GenericDra(cluster, config)
    drivers.append(drv)
    drv.host.add_char_device("/dev/ttyS90")
    drv.start()
    [name] = wait_slices(cluster, DEV, lambda n: len(n) == 1, "one shared port")
    assert slice_devices(cluster, DEV)[name].capacity["shares"].value == "3"
    other = f"shares-other-{uuid.uuid4().hex[:5]}"
    is_port = f'device.driver == "{DEV}"'
    with device_class(cluster, is_port) as cls, namespace(cluster, other):
        try:
            for where in (ns, other):
                _template(cluster, where, "port", cls)  # no amount: the default, 1
            placed = [(ns, "a"), (ns, "b"), (other, "c")]
            for where, pod in placed:  # one at a time (see the GPU test)
                cluster.run_pod(where, claim_pod(pod, template="port"), timeout=POD_TIMEOUT)
            shares = [_share(cluster, where, pod) for where, pod in placed]
            assert {s[0] for s in shares} == {name}
            assert len({s[1] for s in shares}) == 3
            assert all(s[2] == {"shares": "1"} for s in shares)
            assert len(drv.cdi_specs()) == 3
            cluster.create_pod(ns, claim_pod("d", template="port"))
            wait_unschedulable(cluster, ns, "d")
        finally:
            cluster.delete_pods(other)

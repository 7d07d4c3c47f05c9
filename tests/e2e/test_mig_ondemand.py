"""MIG on demand on the real scheduler and kubelet: the counters alone decide what fits.

``kubedevice nvidia dra --mig-on-demand`` on the fake 8x H100 box in MIG mode publishes
every placement of every MIG profile, each consuming its GPU's memory-slice counters. The
real scheduler allocates claims for 3g + 2g + 2g on one GPU and leaves a 4g Pending (the
driver is never asked for it); the fake NVML holds each MIG device while its pod runs and
has destroyed it once the pod is gone.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubedevice.nvidia.fake.partitions import cap_minors

from .cluster import Cluster, poll_until
from .dra import (
    POD_TIMEOUT,
    PREPARED,
    REGISTERED,
    GpuDra,
    allocated,
    claim_pod,
    claim_spec,
    create_claim,
    delete_pod,
    device_class,
    log_count,
    pod_claim,
    release,
    request,
    resource_api,
    run_claim_pod,
    wait_file,
    wait_slices,
    wait_unschedulable,
)

pytestmark = pytest.mark.timeout(420)

DRIVER = "gpu.kubedevice.io"
ON_DEMAND = "version: v1\ndra:\n  migOnDemand: true\n"
IS_MIG = f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].type == "mig"'


@pytest.fixture
def mig_dra(cluster: Cluster, ns: str) -> Iterator[Callable[..., GpuDra]]:
    made: list[GpuDra] = []

    def make() -> GpuDra:
        d = GpuDra(cluster, "dgx-8gpu-mig", config=ON_DEMAND, name="mig-dra")
        made.append(d)
        d.start()
        return d

    yield make
    release(cluster, ns, list(made))
    for d in made:
        d.close()


def _instances(state: Path) -> list[dict[str, Any]]:
    try:
        return list(json.loads(state.read_text())["instances"])
    except (OSError, ValueError):
        return []


def _wait_instances(
    drv: GpuDra, predicate: Callable[[list[dict[str, Any]]], bool], what: str
) -> None:
    wait_file(drv.nvml_state, lambda p: predicate(_instances(p)), 60, what)


def _mig_claim(cluster: Cluster, ns: str, name: str, cls: str, profile: str) -> None:
    on_gpu0 = f'device.attributes["{DRIVER}"].parentIndex == 0'
    is_profile = f'device.attributes["{DRIVER}"].profile == "{profile}"'
    # a selector written for NVIDIA's MIG devices: a CEL error if the capacity were missing
    has_sms = f'device.capacity["{DRIVER}"].multiprocessors.compareTo(quantity("16")) >= 0'
    spec = claim_spec(request("mig", cls, 1, on_gpu0, is_profile, has_sms))
    create_claim(cluster, ns, name, spec)


def test_3g_2g_2g_fit_a_4g_stays_pending_and_instances_follow_the_pods(
    cluster: Cluster, ns: str, mig_dra: Callable[..., GpuDra]
) -> None:
    drv = mig_dra()
    wait_slices(cluster, DRIVER, lambda n: len(n) == 8 * 26, "8 GPUs x 26 devices", 60)
    slices = resource_api(cluster).list_resource_slice(field_selector=f"spec.driver={DRIVER}")
    assert sum(1 for s in slices.items if s.spec.shared_counters) == 1  # 8 counter sets
    with device_class(cluster, IS_MIG) as cls:
        started = time.monotonic()
        for name, profile in (("a", "3g.40gb"), ("b", "2g.20gb"), ("c", "2g.20gb")):
            _mig_claim(cluster, ns, name, cls, profile)
            run_claim_pod(cluster, ns, claim_pod(f"p-{name}", claim=name))
        elapsed = time.monotonic() - started
        got = {
            n: allocated(resource_api(cluster).read_namespaced_resource_claim(n, ns)) for n in "abc"
        }
        assert got["a"] == ["gpu-0-mig-3g-40gb-4"]
        assert sorted(got["b"] + got["c"]) == ["gpu-0-mig-2g-20gb-0", "gpu-0-mig-2g-20gb-2"]
        made = _instances(drv.nvml_state)
        assert sorted((i["name"], tuple(i["placement"])) for i in made) == [
            ("2g.20gb", (0, 2)),
            ("2g.20gb", (2, 2)),
            ("3g.40gb", (4, 4)),
        ]
        assert {i["gpu"] for i in made} == {drv.uuids[0]}

        # a 4g needs slices 0-3: the scheduler finds nothing that fits; the driver is not asked
        _mig_claim(cluster, ns, "d", cls, "4g.40gb")
        cluster.create_pod(ns, claim_pod("p-d", claim="d"))
        wait_unschedulable(cluster, ns, "p-d", 60)
        assert log_count(drv.log, PREPARED) == 3
        assert len(_instances(drv.nvml_state)) == 3

        # the 4g pod that did not fit goes first, with its claim: had it stayed while the 2g
        # devices were freed, the scheduler could allocate its claim as it is deleted (a
        # claim then held by no pod, until the claim controller frees it)
        delete_pod(cluster, ns, "p-d")
        resource_api(cluster).delete_namespaced_resource_claim("d", ns)
        # the pods with the 2g devices go: their instances are destroyed, and a 4g runs
        delete_pod(cluster, ns, "p-b")
        delete_pod(cluster, ns, "p-c")
        _mig_claim(cluster, ns, "e", cls, "4g.40gb")
        run_claim_pod(cluster, ns, claim_pod("p-e", claim="e"))
        _wait_instances(
            drv,
            lambda m: sorted(i["name"] for i in m) == ["3g.40gb", "4g.40gb"],
            "the 2g instances destroyed, a 4g made",
        )
        delete_pod(cluster, ns, "p-a")
        delete_pod(cluster, ns, "p-e")
        _wait_instances(drv, lambda m: not m, "every instance destroyed")
    print(f"\nMIG on demand: 3 pods with a MIG claim each Running in {elapsed:.1f} s")
    assert elapsed < 3 * POD_TIMEOUT


def test_a_driver_killed_after_making_an_instance_destroys_the_orphan_and_prepares_again(
    cluster: Cluster, ns: str, mig_dra: Callable[..., GpuDra]
) -> None:
    drv = mig_dra()
    wait_slices(cluster, DRIVER, lambda n: len(n) == 8 * 26, "8 GPUs x 26 devices", 60)
    drv.crash_marker.touch()  # the driver dies right after making the next instance
    with device_class(cluster, IS_MIG) as cls:
        _mig_claim(cluster, ns, "a", cls, "3g.40gb")
        cluster.create_pod(ns, claim_pod("p-a", claim="a"))
        popen = drv.process.popen
        assert popen is not None
        assert popen.wait(POD_TIMEOUT) == 137
        [orphan] = _instances(drv.nvml_state)  # made, never checkpointed
        assert log_count(drv.log, PREPARED) == 0
        drv.start()  # the kubelet asks again once it is back
        cluster.wait_running(ns, "p-a", POD_TIMEOUT)
        [made] = _instances(drv.nvml_state)
        assert made["uuid"] != orphan["uuid"]
        assert (made["name"], made["placement"]) == ("3g.40gb", [4, 4])
        assert log_count(drv.log, "owned by no claim: destroyed") == 1
        assert log_count(drv.log, PREPARED) == 1
        delete_pod(cluster, ns, "p-a")
        _wait_instances(drv, lambda m: not m, "the instance destroyed")


def test_a_prepare_cut_off_by_the_kubelets_deadline_is_retried_on_the_same_placement(
    cluster: Cluster, ns: str, mig_dra: Callable[..., GpuDra]
) -> None:
    """NVML takes longer than the kubelet's 45 s deadline for NodePrepareResources: the call is
    cut off, NVML's thread makes the GPU instance after all, and the kubelet's retry must get
    the claim's placement (not ``InsufficientResources ... overlaps GPU instance 1``)."""
    drv = mig_dra()
    wait_slices(cluster, DRIVER, lambda n: len(n) == 8 * 26, "8 GPUs x 26 devices", 60)
    kubelet = cluster.kubelet
    assert kubelet is not None
    cut_before = kubelet.log_since_start().count("DeadlineExceeded")
    os.mkfifo(drv.hold_create)  # the next instance made waits until it is written to
    with device_class(cluster, IS_MIG) as cls:
        _mig_claim(cluster, ns, "a", cls, "3g.40gb")
        started = time.monotonic()
        cluster.create_pod(ns, claim_pod("p-a", claim="a"))
        wait_file(drv.log, lambda p: log_count(p, "held until") == 1, POD_TIMEOUT, "NVML held")
        poll_until(
            "the kubelet's deadline to cut the prepare off",
            lambda: kubelet.log_since_start().count("DeadlineExceeded") > cut_before,
            90,
        )
        cut_at = time.monotonic() - started
        fd = os.open(drv.hold_create, os.O_WRONLY | os.O_NONBLOCK)  # NVML's thread goes on
        os.write(fd, b"1")
        os.close(fd)
        cluster.wait_running(ns, "p-a", POD_TIMEOUT)
        running_at = time.monotonic() - started
        [made] = _instances(drv.nvml_state)
        assert (made["name"], made["placement"]) == ("3g.40gb", [4, 4])
        assert log_count(drv.log, "overlaps GPU instance") == 0
        assert log_count(drv.log, PREPARED) == 1
        delete_pod(cluster, ns, "p-a")
        _wait_instances(drv, lambda m: not m, "the instance destroyed")
    print(
        f"\nMIG on demand: prepare cut off by the kubelet at {cut_at:.1f} s, "
        f"the pod Running at {running_at:.1f} s"
    )


def test_after_a_reboot_the_pods_mig_device_is_made_again_at_its_placement(
    cluster: Cluster, ns: str, mig_dra: Callable[..., GpuDra]
) -> None:
    """A reboot: the kubelet, the runtime (every container) and the driver stop, the GPUs
    lose their MIG instances (the fake NVML's state file goes), the CDI dir (a tmpfs) is
    emptied; all start again, the driver first. The pod runs again, in a new container, with
    a MIG device at its claim's placement and that device's ``nvidia-caps`` nodes."""
    drv = mig_dra()
    wait_slices(cluster, DRIVER, lambda n: len(n) == 8 * 26, "8 GPUs x 26 devices", 60)
    kubelet = cluster.kubelet
    assert kubelet is not None
    with device_class(cluster, IS_MIG) as cls:
        _mig_claim(cluster, ns, "a", cls, "3g.40gb")
        run_claim_pod(cluster, ns, claim_pod("p-a", claim="a"))
        [before] = _instances(drv.nvml_state)
        cdi = {d["name"] for d in kubelet.created(ns, "p-a", "main").get("cdiDevices")}
        created = len(kubelet.records())
        # the reboot
        kubelet.stop()
        drv.stop()
        kubelet.stop_runtime()
        drv.nvml_state.unlink()  # every MIG instance gone
        for path in drv.cdi_dir.iterdir():
            path.unlink()
        started = time.monotonic()
        kubelet.start_runtime()
        registered = log_count(drv.log, REGISTERED)
        drv.start(wait=False)
        kubelet.start()
        cluster.wait_node_ready()
        drv.wait_registered(registered + 1)
        poll_until(
            "the pod's container created again",
            lambda: any(
                r.get("pod") == "p-a" and r.get("namespace") == ns
                for r in kubelet.records()[created:]
            ),
            POD_TIMEOUT,
        )
        cluster.wait_running(ns, "p-a", POD_TIMEOUT)
        again = time.monotonic() - started
        [after] = _instances(drv.nvml_state)
        assert (after["name"], after["placement"]) == ("3g.40gb", [4, 4])
        assert after["uuid"] != before["uuid"]
        # the same CDI device (the kubelet, restarted, may name it twice: its checkpoint's
        # and the re-prepare's)
        assert {d["name"] for d in kubelet.created(ns, "p-a", "main").get("cdiDevices")} == cdi
        gpu_minor = next(g.info.minor for g in drv.nvml.machine.gpus if g.info.uuid == after["gpu"])
        want = [f"/dev/nvidia-caps/nvidia-cap{m}" for m in cap_minors(gpu_minor, after["gi"], 0)]
        nodes = [
            n["path"]
            for spec in drv.cdi_specs().values()
            for d in spec["devices"]
            for n in d["containerEdits"].get("deviceNodes", [])
        ]
        assert [n for n in nodes if n.startswith("/dev/nvidia-caps/")] == want
        delete_pod(cluster, ns, "p-a")
        _wait_instances(drv, lambda m: not m, "the instance destroyed")
    print(f"\nMIG on demand: the pod Running again {again:.1f} s after the reboot")


def _doc_manifests() -> list[dict[str, Any]]:
    """The YAML of docs/nvidia-dra.md, section "MIG on demand (DRA)"."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "nvidia-dra.md").read_text()
    section = text[text.index("## MIG on demand (DRA)") :]
    section = section[: section.index("\n## ", 1)]
    blocks = [b.split("```", 1)[0] for b in section.split("```yaml\n")[1:]]
    return [d for b in blocks for d in yaml.safe_load_all(b) if d]


def test_the_documented_manifest_gets_a_3g_made_for_its_pod(
    cluster: Cluster, ns: str, mig_dra: Callable[..., GpuDra]
) -> None:
    drv = mig_dra()
    wait_slices(cluster, DRIVER, lambda n: len(n) == 8 * 26, "8 GPUs x 26 devices", 60)
    cls, template, pod = _doc_manifests()
    assert [cls["kind"], template["kind"], pod["kind"]] == [
        "DeviceClass",
        "ResourceClaimTemplate",
        "Pod",
    ]
    api = resource_api(cluster)
    api.create_device_class(cls)
    try:
        api.create_namespaced_resource_claim_template(ns, template)
        started = time.monotonic()
        run_claim_pod(cluster, ns, pod)
        elapsed = time.monotonic() - started
        [device] = allocated(pod_claim(cluster, ns, pod["metadata"]["name"]))
        assert re.fullmatch(r"gpu-[0-7]-mig-3g-40gb-[04]", device), device
        [made] = _instances(drv.nvml_state)
        assert made["name"] == "3g.40gb"
        kubelet = cluster.kubelet
        assert kubelet is not None
        assert len(kubelet.created(ns, pod["metadata"]["name"], "main").get("cdiDevices")) == 1
        nodes = [
            n["hostPath"]
            for spec in drv.cdi_specs().values()
            for d in spec["devices"]
            for n in d["containerEdits"].get("deviceNodes", [])
        ]
        gi = made["gi"]
        caps = [p for p in nodes if p.startswith("/dev/nvidia-caps/nvidia-cap")]
        assert len(caps) == 2, nodes  # the GPU instance's and the compute instance's
        print(f"\nMIG on demand: the documented pod Running in {elapsed:.2f} s (GI {gi})")
        delete_pod(cluster, ns, pod["metadata"]["name"])
        _wait_instances(drv, lambda m: not m, "the instance destroyed")
    finally:
        api.delete_device_class(cls["metadata"]["name"])

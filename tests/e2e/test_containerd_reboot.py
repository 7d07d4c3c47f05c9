"""A node reboot, as far as one machine can play it, on the real runtime.

Pods hold a device-plugin device (generic plugin, real nodes) and a DRA claim (GPU driver, fake
NVML, real nodes). Then the kubelet, the runtime (every container, shim and mount: gone), the
plugin and the driver stop; the CDI dir is emptied, as a reboot empties the tmpfs
``/var/run/cdi``; all start again (plugin and driver first, as host services; then the
kubelet). The pods must run again, each in a new container, with the same devices.
"""

from __future__ import annotations

import contextlib
import datetime
import math
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from .cluster import Cluster, ClusterError, namespace, poll_until
from .conftest import GENERIC_RESOURCE, cluster_on
from .dra import (
    REGISTERED,
    GpuDra,
    claim_spec,
    create_template,
    device_class,
    log_count,
    request as claim_request,
    wait_slices,
)
from .plugins import GenericDaemon
from .real import (
    REAL_GENERIC_CONFIG,
    Seen,
    claim_show_pod,
    real_generic_nodes,
    real_nvidia_nodes,
    run_holding,
    seen,
    show_pod,
)
from .runtime import container_output

pytestmark = [pytest.mark.containerd, pytest.mark.timeout(360)]

GPU_DRIVER = "gpu.kubedevice.io"
IS_GPU = f'device.driver == "{GPU_DRIVER}" && device.attributes["{GPU_DRIVER}"].type == "gpu"'
#: the kubelet's reasons for a container it could not create or start
NOT_CREATED = ("CreateContainerError", "CreateContainerConfigError", "RunContainerError")


@dataclass
class Reboot:
    before: dict[str, Seen]
    #: what each pod's new container saw, or why there is none
    after: dict[str, Seen | str]
    cdi_files_after: list[str]


def _again(c: Cluster, ns: str, name: str, since: datetime.datetime, before: Seen) -> Seen | str:
    """Wait until the pod runs a container started after ``since`` (and it printed what it
    sees), or the kubelet gives up on creating one; return what it saw, or why not."""

    def settled(p: Any) -> bool:
        if p.status.phase == "Failed":
            return True
        for s in p.status.container_statuses or []:
            if s.state.running and s.state.running.started_at >= since:
                return True
            if s.state.waiting and s.state.waiting.reason in NOT_CREATED:
                return True
        return False

    try:
        pod = c.wait_pod(ns, name, settled, 120, "running again or failed")
    except ClusterError as e:
        return f"not running again: {e}"
    if pod.status.phase == "Failed":
        return f"Failed: {pod.status.reason}: {pod.status.message}"
    [status] = pod.status.container_statuses
    if status.state.waiting:
        return f"{status.state.waiting.reason}: {status.state.waiting.message}"

    def printed() -> bool:
        out = container_output(ns, name, pod.metadata.uid, "main")
        tokens = [ln.split()[1] for ln in out.splitlines() if ln.startswith("SHOWN ")]
        return bool(tokens) and tokens[-1] != before.token

    poll_until(f"{ns}/{name}'s new container printed what it sees", printed, 30)
    return seen(ns, pod)


@pytest.fixture(scope="module")
def rebooted() -> Iterator[Reboot]:
    c = cluster_on("containerd")
    assert c.kubelet is not None
    assert c.cdi_dir is not None
    with namespace(c, f"reboot-{uuid.uuid4().hex[:5]}") as ns:
        gen = GenericDaemon(c, REAL_GENERIC_CONFIG, name="reboot-generic", dev_root=Path("/dev"))
        gpu = GpuDra(c)
        with (
            real_generic_nodes([3, 5, 7]),
            real_nvidia_nodes(gpu.nvml.machine.dev_nodes),
            device_class(c, IS_GPU) as gcls,
        ):
            try:
                gen.start()
                gpu.start()
                c.wait_resource(GENERIC_RESOURCE, allocatable=3)
                wait_slices(c, GPU_DRIVER, lambda n: len(n) == 8, "8 GPUs")
                create_template(c, ns, "one-gpu", claim_spec(claim_request("gpu", gcls)))
                before = run_holding(
                    c,
                    ns,
                    [
                        show_pod("dp", {GENERIC_RESOURCE: 2}, keep_running=True),
                        claim_show_pod("dra", template="one-gpu"),
                    ],
                )
                # the reboot: everything stops, the containers with the runtime
                since = datetime.datetime.fromtimestamp(math.floor(time.time()), datetime.UTC)
                c.kubelet.stop()
                gen.stop()
                gpu.stop()
                c.kubelet.stop_runtime()
                for f in c.cdi_dir.iterdir():  # /var/run/cdi is a tmpfs on a real node
                    f.unlink()
                # host services first (the runtime, the plugin, the driver), then the kubelet
                c.kubelet.start_runtime()
                gen.start()
                registered = log_count(gpu.log, REGISTERED)
                gpu.start(wait=False)
                c.kubelet.start()
                c.wait_node_ready()
                gpu.wait_registered(registered + 1)
                after = {n: _again(c, ns, n, since, before[n]) for n in ("dp", "dra")}
                yield Reboot(before, after, sorted(p.name for p in c.cdi_dir.iterdir()))
            finally:
                with contextlib.suppress(ClusterError):
                    c.delete_pods(ns)  # the driver still runs: the kubelet unprepares
                gen.close()
                gpu.close()


def test_device_plugin_pod_runs_again_with_the_same_devices(rebooted: Reboot) -> None:
    before, after = rebooted.before["dp"], rebooted.after["dp"]
    assert isinstance(after, Seen), after
    assert len(before.under("/dev/kde2e/")) == 2
    assert after.under("/dev/kde2e/") == before.under("/dev/kde2e/"), after.output
    assert after.env["E2E_PATHS"] == before.env["E2E_PATHS"]


def test_dra_pod_runs_again_with_the_same_gpu(rebooted: Reboot) -> None:
    before, after = rebooted.before["dra"], rebooted.after["dra"]
    gpus = [p for p in before.under("/dev/nvidia") if p[len("/dev/nvidia") :].isdigit()]
    assert len(gpus) == 1
    assert isinstance(after, Seen), f"{after}; CDI dir after the reboot: {rebooted.cdi_files_after}"
    assert after.under("/dev/nvidia") == before.under("/dev/nvidia"), after.output

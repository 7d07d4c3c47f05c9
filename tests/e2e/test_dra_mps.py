"""MPS behind the GPU DRA driver's memory shares end to end (``kubedevice nvidia dra --mps``
on a fake machine with one 80 GiB GPU and the fake's MPS control daemon stand-in), on the
real scheduler and kubelet: each share's container is given the daemon's pipe directory and
its limits (the memory and compute the scheduler counted); the daemon starts at the first
prepare, is adopted (same pid) by a driver killed with -9 and started again, is started
again when it is killed itself, and is gone after the last unprepare; in a rolling upgrade
the new instance takes the old one's daemon over (same pid) and stops it at the last
unprepare.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kubedevice.nvidia.fake import CONTROL_ENV
from kubedevice.nvidia.mps import running_daemons

from .cluster import Cluster
from .dra import (
    POD_TIMEOUT,
    GpuDra,
    claim_pod,
    create_template,
    delete_pod,
    device_class,
    pod_claim,
    release,
    slice_devices,
    wait_slices,
)

pytestmark = pytest.mark.timeout(600)

GPU = "gpu.kubedevice.io"
PID_FILE = "nvidia-cuda-mps-control.pid"


def _daemon_pid(root: Path) -> int | None:
    """The pid of the one live control daemon under the driver's MPS root."""
    return next(iter(running_daemons(root)), None)


def _wait_pid(root: Path, want: Any, what: str, timeout: float = 30) -> int | None:
    deadline = time.monotonic() + timeout
    while True:
        pid = _daemon_pid(root)
        if want(pid):
            return pid
        assert time.monotonic() < deadline, f"timed out waiting for {what} (pid {pid})"
        time.sleep(0.05)


def _edits(drv: GpuDra) -> dict[str, dict[str, Any]]:
    """CDI device name -> its containerEdits, over the driver's CDI specs."""
    return {
        d["name"]: d.get("containerEdits", {})
        for spec in drv.cdi_specs().values()
        for d in spec["devices"]
    }


def _wait_taint(cluster: Cluster, timeout: float = 30) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        taints = slice_devices(cluster, GPU)["gpu-0"].taints
        if taints:
            return taints[0]
        assert time.monotonic() < deadline, "gpu-0 not tainted"
        time.sleep(0.05)


@pytest.fixture
def gpu(cluster: Cluster, ns: str) -> Iterator[GpuDra]:
    drv = GpuDra(cluster, "one-gpu-80gib", extra=("--mps",))
    yield drv
    release(cluster, ns, [drv])
    drv.close()


def test_each_share_is_an_mps_client_and_the_daemon_lives_from_first_to_last(
    cluster: Cluster, ns: str, gpu: GpuDra
) -> None:
    kubelet = cluster.kubelet
    assert kubelet is not None
    root = kubelet.root / "plugins" / GPU / "mps"
    gpu.start()
    wait_slices(cluster, GPU, lambda n: n == {"gpu-0"}, "the one GPU")
    assert _daemon_pid(root) is None  # nothing before the first share
    with device_class(cluster, f'device.driver == "{GPU}"') as cls:
        for name, capacity in (
            ("mem", {"memory": "20Gi"}),
            ("both", {"memory": "20Gi", "compute": "25"}),
        ):
            exactly = {"deviceClassName": cls, "capacity": {"requests": capacity}}
            create_template(
                cluster, ns, name, {"devices": {"requests": [{"name": "dev", "exactly": exactly}]}}
            )
        cluster.run_pod(ns, claim_pod("p1", template="both"), timeout=POD_TIMEOUT)
        pid = _wait_pid(root, lambda p: p is not None, "the daemon after the first prepare")
        cluster.run_pod(ns, claim_pod("p2", template="mem"), timeout=POD_TIMEOUT)
        assert _daemon_pid(root) == pid  # one daemon for the GPU's shares
        # the driver killed (-9) and started again adopts the daemon
        gpu.kill()
        gpu.start()
        cluster.run_pod(ns, claim_pod("p3", template="mem"), timeout=POD_TIMEOUT)
        assert _daemon_pid(root) == pid
        # each container: the pipe dir mounted, its limits in its env
        pods = {p: pod_claim(cluster, ns, p) for p in ("p1", "p2", "p3")}
        edits = _edits(gpu)
        for pod, claim in pods.items():
            [cdi] = [d["name"] for d in kubelet.created(ns, pod, "main")["cdiDevices"]]
            mine = edits[cdi.split("=", 1)[1]]
            env = dict(e.split("=", 1) for e in mine["env"])
            assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/run/nvidia-mps"
            assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20480M"
            [result] = claim.status.allocation.devices.results
            if pod == "p1":
                assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
                assert str(result.consumed_capacity["compute"]) == "25"
            else:
                assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in env
            [pipe] = [m for m in mine["mounts"] if m["containerPath"] == "/run/nvidia-mps"]
            assert Path(pipe["hostPath"]).parent.parent == root
            assert (Path(pipe["hostPath"]) / PID_FILE).read_text().strip() == str(pid)
        # the daemon killed: the driver starts another for the shares still held
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        new = _wait_pid(root, lambda p: p not in (None, pid), "a new daemon")
        # ...and the GPU tainted with why, until the shares that lost it are gone
        taint = _wait_taint(cluster)
        assert (taint.key, taint.value, taint.effect) == (f"{GPU}/mps-daemon", "restarted",
                                                          "NoSchedule")  # fmt: skip
        # the last unprepare stops it
        for pod in ("p1", "p2", "p3"):
            delete_pod(cluster, ns, pod)
        gpu.wait_specs(lambda specs: not specs, "every share's spec removed")
        _wait_pid(root, lambda p: p is None, "the daemon stopped after the last unprepare")
        deadline = time.monotonic() + 30
        while slice_devices(cluster, GPU)["gpu-0"].taints:  # its shares gone: healthy again
            assert time.monotonic() < deadline, "gpu-0 still tainted"
            time.sleep(0.05)
        assert new is not None
        assert not Path(f"/proc/{new}").exists() or _daemon_pid(root) is None


def test_a_rolling_upgrade_hands_the_daemon_over(cluster: Cluster, ns: str) -> None:
    kubelet = cluster.kubelet
    assert kubelet is not None
    root = kubelet.root / "plugins" / GPU / "mps"
    a = GpuDra(cluster, "one-gpu-80gib", extra=("--mps", "--pod-uid", "mps-a"))
    b = a.sibling(["--pod-uid", "mps-b"], env={CONTROL_ENV: str(a.root / "nvml-b.sock")})
    try:
        a.start()
        wait_slices(cluster, GPU, lambda n: n == {"gpu-0"}, "the one GPU")
        with device_class(cluster, f'device.driver == "{GPU}"') as cls:
            exactly = {"deviceClassName": cls, "capacity": {"requests": {"memory": "20Gi"}}}
            spec = {"devices": {"requests": [{"name": "dev", "exactly": exactly}]}}
            create_template(cluster, ns, "mem", spec)
            cluster.run_pod(ns, claim_pod("old", template="mem"), timeout=POD_TIMEOUT)  # by A
            pid = _wait_pid(root, lambda p: p is not None, "A's daemon")
            b.start()  # registered beside A
            assert a.stop() == 0  # SIGTERM: A goes, its daemon stays
            assert _daemon_pid(root) == pid
            cluster.run_pod(ns, claim_pod("new", template="mem"), timeout=POD_TIMEOUT)  # by B
            assert _daemon_pid(root) == pid  # B adopted it, no client disturbed
            for pod in ("old", "new"):  # B unprepares both, A's claim from the checkpoint
                delete_pod(cluster, ns, pod)
            b.wait_specs(lambda specs: not specs, "every share's spec removed")
            _wait_pid(root, lambda p: p is None, "the daemon stopped by B")
    finally:
        release(cluster, ns, [b])
        b.stop()
        a.close()

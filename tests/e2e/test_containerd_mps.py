"""MPS behind GPU memory shares on the real runtime (containerd + runc): containerd applies
each share's CDI edits, and the container sees from INSIDE its MPS env and the control
daemon's pipe directory (the daemon's pid file and control socket), one daemon for both
shares; the daemon is gone after the last pod."""

from __future__ import annotations

import time

import pytest

from kubedevice.nvidia.mps import running_daemons

from .cluster import Cluster
from .dra import GpuDra, create_template, device_class, release, wait_slices
from .real import claim_show_pod, real_nvidia_nodes, run_holding

pytestmark = [pytest.mark.containerd, pytest.mark.timeout(360)]

GPU = "gpu.kubedevice.io"
LOOK = (
    "echo PIPE $(ls /run/nvidia-mps | busybox tr '\\n' ' '); echo PID $(cat /run/nvidia-mps/*.pid)"
)


def test_each_share_sees_its_mps_env_and_the_daemons_pipe_dir_from_inside(
    cluster: Cluster, ns: str
) -> None:
    assert cluster.kubelet is not None
    root = cluster.kubelet.root / "plugins" / GPU / "mps"
    gpu = GpuDra(cluster, "one-gpu-80gib", extra=("--mps",))
    with real_nvidia_nodes(gpu.nvml.machine.dev_nodes):
        try:
            gpu.start()
            wait_slices(cluster, GPU, lambda n: n == {"gpu-0"}, "the one GPU")
            with device_class(cluster, f'device.driver == "{GPU}"') as cls:
                for name, capacity in (
                    ("quarter", {"memory": "20Gi", "compute": "25"}),
                    ("half", {"memory": "40Gi"}),
                ):
                    exactly = {"deviceClassName": cls, "capacity": {"requests": capacity}}
                    spec = {"devices": {"requests": [{"name": "dev", "exactly": exactly}]}}
                    create_template(cluster, ns, name, spec)
                got = run_holding(
                    cluster,
                    ns,
                    [
                        claim_show_pod("a", template="quarter", extra=LOOK),
                        claim_show_pod("b", template="half", extra=LOOK),
                    ],
                )
                [pid] = running_daemons(root)
                for pod, limit, percent in (("a", "0=20480M", "25"), ("b", "0=40960M", None)):
                    seen = got[pod]
                    assert seen.env["CUDA_MPS_PIPE_DIRECTORY"] == "/run/nvidia-mps", seen.output
                    assert seen.env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == limit
                    assert seen.env.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") == percent
                    lines = dict(ln.split(" ", 1) for ln in seen.output.splitlines()
                                 if ln.startswith(("PIPE ", "PID ")))  # fmt: skip
                    assert "control" in lines["PIPE"].split(), seen.output
                    assert lines["PID"].strip() == str(pid), seen.output  # the one daemon
                release(cluster, ns, [gpu])
                deadline = time.monotonic() + 30
                while running_daemons(root):  # stopped at the last unprepare
                    assert time.monotonic() < deadline, "the daemon still runs"
                    time.sleep(0.05)
        finally:
            release(cluster, ns, [gpu])
            gpu.close()

"""DRA drivers on the real runtime (containerd + runc): containerd resolves the CDI names the
kubelet got from NodePrepareResources against the specs the drivers wrote in its CDI dir, and
the container sees the device nodes and env from INSIDE."""

from __future__ import annotations

from pathlib import Path

import pytest

from .cluster import Cluster
from .dra import (
    PREPARED,
    UNPREPARED,
    GenericDra,
    GpuDra,
    allocated,
    claim_spec,
    create_claim,
    create_template,
    device_class,
    log_count,
    pod_claim,
    release,
    request,
    wait_file,
    wait_slices,
)
from .real import claim_show_pod, real_generic_nodes, real_nvidia_nodes, run_holding

pytestmark = [pytest.mark.containerd, pytest.mark.timeout(360)]

GPU_DRIVER = "gpu.kubedevice.io"
DEV_DRIVER = "dev.kubedevice.io"
IS_GPU = f'device.driver == "{GPU_DRIVER}" && device.attributes["{GPU_DRIVER}"].type == "gpu"'
IS_DEV = f'device.driver == "{DEV_DRIVER}"'
DEV_CONFIG = """\
version: v1
resources:
  - name: example.com/e2e
    groups:
      - name: e2e
        paths:
          - path: /dev/kde2e/e2e*
        envs:
          E2E_PATHS: "{paths}"
"""


def _gpu_nodes(devices: dict[str, tuple[int, int]]) -> dict[str, tuple[int, int]]:
    return {p: mm for p, mm in devices.items() if p[len("/dev/nvidia") :].isdigit()}


def test_claims_reach_the_container_and_their_specs_go_with_the_pods(
    cluster: Cluster, ns: str
) -> None:
    assert cluster.cdi_dir is not None
    gpu = GpuDra(cluster)
    dev = GenericDra(cluster, DEV_CONFIG, dev_root=Path("/dev"))
    assert gpu.cdi_dir == dev.cdi_dir == cluster.cdi_dir  # the dir containerd reads
    with real_generic_nodes([3, 5]) as generic, real_nvidia_nodes(gpu.nvml.machine.dev_nodes) as nv:
        try:
            gpu.start()
            dev.start()
            wait_slices(cluster, GPU_DRIVER, lambda n: len(n) == 8, "8 GPUs")
            wait_slices(cluster, DEV_DRIVER, lambda n: len(n) == 2, "2 devices")
            with device_class(cluster, IS_GPU) as gcls, device_class(cluster, IS_DEV) as dcls:
                create_template(cluster, ns, "two-gpus", claim_spec(request("gpus", gcls, 2)))
                create_template(cluster, ns, "one-dev", claim_spec(request("dev", dcls)))
                create_claim(cluster, ns, "shared", claim_spec(request("gpu", gcls)))
                got = run_holding(
                    cluster,
                    ns,
                    [
                        claim_show_pod("gpus", template="two-gpus"),
                        claim_show_pod("dev", template="one-dev"),
                        claim_show_pod("share-a", claim="shared"),
                        claim_show_pod("share-b", claim="shared"),
                    ],
                )

                # the 2-GPU claim: exactly its GPUs' nodes, with the host's major:minor
                want = {f"/dev/nvidia{d.removeprefix('gpu-')}" for d in allocated(
                    pod_claim(cluster, ns, "gpus"))}  # fmt: skip
                assert len(want) == 2
                assert set(_gpu_nodes(got["gpus"].devices)) == want, got["gpus"].output
                for p in [*want, "/dev/nvidiactl"]:
                    assert got["gpus"].devices[p] == nv[p], (p, got["gpus"].output)
                assert not got["gpus"].under("/dev/kde2e/")

                # the generic claim: its one node and the env the driver's spec sets
                [(node, mm)] = got["dev"].under("/dev/kde2e/").items()
                assert generic[node] == mm, got["dev"].output
                assert got["dev"].env["E2E_PATHS"] == node
                assert not _gpu_nodes(got["dev"].devices)

                # one claim, two pods: the same single GPU in both, prepared once
                a, b = _gpu_nodes(got["share-a"].devices), _gpu_nodes(got["share-b"].devices)
                assert a == b, (got["share-a"].output, got["share-b"].output)
                assert len(a) == 1
                assert not set(a) & want
                assert log_count(gpu.log, PREPARED) == 2  # two-gpus and shared
                assert len(gpu.cdi_specs()) == 2
                assert len(dev.cdi_specs()) == 1

                # deleting the pods unprepares the claims: their specs leave containerd's dir
                release(cluster, ns, [gpu, dev])
                # each spec goes just before its claim's line is logged
                for drv, n in ((gpu, 2), (dev, 1)):
                    wait_file(drv.log, lambda p, n=n: log_count(p, UNPREPARED) >= n, 30)
                    assert log_count(drv.log, UNPREPARED) == n
                assert not list(cluster.cdi_dir.glob("k8s.*-claim_*.json"))
        finally:
            release(cluster, ns, [gpu, dev])
            gpu.close()
            dev.close()

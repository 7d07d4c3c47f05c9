"""Device plugins on the real runtime (containerd + runc): what a container sees from INSIDE.

The generic plugin hands out real char nodes (``/dev/kde2e/e2e*``, made with mknod in the
tier's private /dev), the GPU plugin the fake NVML's ``/dev/nvidia*`` (real nodes, major 195);
each pod prints its char nodes with ``stat -c '%t %T'`` and its env, and ends.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .cluster import Cluster
from .conftest import GENERIC_RESOURCE, GPU
from .real import (
    REAL_GENERIC_CONFIG,
    real_generic_nodes,
    real_nvidia_nodes,
    run_all,
    show_pod,
)

pytestmark = pytest.mark.containerd

CDI_CRI = "version: v1\nflags:\n  deviceListStrategy: cdi-cri\n"


def test_generic_and_gpu_pods_see_exactly_their_nodes_env_and_mounts(
    cluster: Cluster, ns: str, generic_plugin, gpu_plugin
) -> None:
    with real_generic_nodes([3, 5, 7]) as generic_nodes:
        generic = generic_plugin(REAL_GENERIC_CONFIG, start=False, dev_root=Path("/dev"))
        gpus = gpu_plugin(start=False)
        with real_nvidia_nodes(gpus.nvml.machine.dev_nodes) as nvidia:
            generic.start()
            gpus.start()
            cluster.wait_resource(GENERIC_RESOURCE, allocatable=3)
            cluster.wait_resource(GPU, allocatable=8)
            got = run_all(
                cluster,
                ns,
                [
                    show_pod("two-devs", {GENERIC_RESOURCE: 2}, extra="cat /etc/e2e-hostname"),
                    show_pod("two-gpus", {GPU: 2}),
                ],
            )

    devs = got["two-devs"]
    assert devs.phase == "Succeeded", devs.output
    inside = devs.under("/dev/kde2e/")
    assert len(inside) == 2, devs.output
    # the container's nodes are the host's, major:minor included
    assert {p: generic_nodes[p] for p in inside} == inside
    assert sorted(devs.env["E2E_PATHS"].split(",")) == sorted(inside)
    assert Path("/etc/hostname").read_text().strip() in devs.output.splitlines()
    assert not devs.under("/dev/nvidia"), devs.output

    two = got["two-gpus"]
    assert two.phase == "Succeeded", two.output
    visible = two.env["NVIDIA_VISIBLE_DEVICES"].split(",")
    assert len(visible) == 2, two.output
    assert set(visible) <= set(gpus.uuids)
    assert gpus.nvlinks(*visible) == 18  # the NVLink pair the plugin prefers
    want = {f"/dev/nvidia{gpus.uuids.index(u)}" for u in visible}
    gpu_nodes = {p for p in two.under("/dev/nvidia") if p[len("/dev/nvidia") :].isdigit()}
    assert gpu_nodes == want, two.output
    for p in [*want, "/dev/nvidiactl", "/dev/nvidia-uvm"]:
        assert two.devices[p] == nvidia[p], (p, two.output)
    assert not two.under("/dev/kde2e/"), two.output


def test_cdi_cri_names_are_resolved_by_the_runtime(cluster: Cluster, ns: str, gpu_plugin) -> None:
    gpus = gpu_plugin(CDI_CRI, start=False)
    assert gpus.cdi_dir == cluster.cdi_dir  # the spec goes where containerd reads
    with real_nvidia_nodes(gpus.nvml.machine.dev_nodes) as nvidia:
        gpus.start()
        cluster.wait_resource(GPU, allocatable=8)
        got = run_all(cluster, ns, [show_pod("cdi", {GPU: 2})])["cdi"]
    assert got.phase == "Succeeded", got.output
    # no env strategy: the devices came from the spec the plugin wrote, resolved by containerd
    assert "NVIDIA_VISIBLE_DEVICES" not in got.env
    gpu_nodes = {p for p in got.under("/dev/nvidia") if p[len("/dev/nvidia") :].isdigit()}
    assert len(gpu_nodes) == 2, got.output
    minors = sorted(int(p[len("/dev/nvidia") :]) for p in gpu_nodes)
    assert gpus.nvlinks(gpus.uuids[minors[0]], gpus.uuids[minors[1]]) == 18
    for p in [*gpu_nodes, "/dev/nvidiactl"]:
        assert got.devices[p] == nvidia[p], (p, got.output)

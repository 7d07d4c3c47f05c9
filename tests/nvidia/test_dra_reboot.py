"""A reboot under the GPU DRA driver, on the kit and the fake NVML: the MIG devices made on
demand and the time slices are gone, the checkpoint (on disk) is not. At start, and on every
answer from the checkpoint, what the checkpoint says exists is made again.

Real gRPC over the driver's Unix socket, a real kube-apiserver (tests/dra's fixtures), a new
driver object over the same kubelet dir for the restart; ``FakeNvml.reboot`` plays the GPUs'
side of the reboot and emptying the CDI dir the tmpfs's.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import dra.conftest as dra_fixtures
import pytest
from dra import clients
from dra.api import Api
from dra.conftest import create_claim, result
from dra.fakes import server

from kubedevice.dra.node.settings import CHECKPOINT_FILE
from kubedevice.dra.state.checkpoint import Checkpoint
from kubedevice.nvidia.config import Config
from kubedevice.nvidia.dra import DEFAULT_DRIVER_NAME, GpuDraDriver

pytestmark = pytest.mark.timeout(60)

api = dra_fixtures.api
kdir = dra_fixtures.kdir
kubeconfig = dra_fixtures.kubeconfig
node_name = dra_fixtures.node_name

DRIVER = DEFAULT_DRIVER_NAME
NAMESPACE = "default"
THREE_G = "gpu-0-mig-3g-40gb-4"


def _driver(host: Any) -> GpuDraDriver:
    config = Config(version="v1").with_overrides(**host.overrides())
    config = dataclasses.replace(config, dra=dataclasses.replace(config.dra, mig_on_demand=True))
    return GpuDraDriver(config, host.nvml)


def _mig_claim(api: Api, name: str, node: str, device: str) -> tuple[str, str, str]:
    claim = create_claim(
        api, NAMESPACE, name, requests=["mig"], results=[result("mig", DRIVER, node, device)]
    )
    return NAMESPACE, name, claim["metadata"]["uid"]


async def _prepare(kdir: Path, ref: tuple[str, str, str]) -> list[str]:
    answer = await clients.prepare(kdir / "plugins" / DRIVER / "dra.sock", [ref])
    claim = answer.claims[ref[2]]
    assert claim.error == ""
    return [i for d in claim.devices for i in d.cdi_device_ids]


async def _unprepare(kdir: Path, ref: tuple[str, str, str]) -> None:
    answer = await clients.unprepare(kdir / "plugins" / DRIVER / "dra.sock", [ref])
    assert answer.claims[ref[2]].error == ""


def _caps(kdir: Path, uid: str) -> list[str]:
    spec = json.loads((kdir / "cdi" / f"k8s.{DRIVER}-claim_{uid}.json").read_text())
    return [
        n["path"]
        for d in spec["devices"]
        for n in d["containerEdits"].get("deviceNodes", [])
        if n["path"].startswith("/dev/nvidia-caps/")
    ]


def _made(host: Any) -> list[tuple[int, int, str, tuple[int, ...]]]:
    """(placement start, size, MIG UUID, cap minors) of each GPU instance on GPU 0."""
    gpu = host.nvml.machine.gpus[0].info.uuid
    return [
        (g.placement.start, g.placement.size, g.devices[0].uuid, g.devices[0].cap_minors)
        for g in host.nvml.partitions.instances(gpu)  # read with NVML started or not
    ]


def _reboot(host: Any, kdir: Path) -> None:
    host.nvml.reboot()  # every MIG instance gone, time slices Default
    for path in (kdir / "cdi").iterdir():  # the CDI dir is a tmpfs
        path.unlink()


async def test_a_restart_after_a_reboot_makes_the_mig_device_again_at_its_placement(
    gpu_host: Any, kdir: Path, kubeconfig: Path, node_name: str, api: Api
) -> None:
    host = gpu_host("dgx-8gpu-mig")
    ref = _mig_claim(api, f"mig-{node_name}", node_name, THREE_G)
    async with server(_driver(host), kdir, kubeconfig, node_name):
        ids = await _prepare(kdir, ref)
        [(_, _, before, _)] = _made(host)
    _reboot(host, kdir)
    assert _made(host) == []
    async with server(_driver(host), kdir, kubeconfig, node_name):
        # made again at start, before serving: at its placement, a new MIG device
        [(start, size, after, minors)] = _made(host)
        assert (start, size) == (4, 4)
        assert after != before
        assert _caps(kdir, ref[2]) == [f"/dev/nvidia-caps/nvidia-cap{m}" for m in minors]
        checkpoint = Checkpoint(kdir / "plugins" / DRIVER / CHECKPOINT_FILE, DRIVER)
        checkpoint.load()
        [data] = checkpoint.claims[ref[2]].data
        assert data["mig"]["uuid"] == after
        # the kubelet's re-prepare is answered with the same CDI IDs (it holds them)
        assert await _prepare(kdir, ref) == ids
        assert [m[2] for m in _made(host)] == [after]
        await _unprepare(kdir, ref)
        assert _made(host) == []


async def test_a_reboot_under_a_running_driver_is_mended_at_the_next_re_prepare(
    gpu_host: Any, kdir: Path, kubeconfig: Path, node_name: str, api: Api
) -> None:
    """The GPUs lose their MIG instances while the driver runs (a GPU reset, or a driver
    started before the reboot finished): the kubelet's next prepare of the claim, answered
    from the checkpoint, makes the instance again and rewrites the spec."""
    host = gpu_host("dgx-8gpu-mig")
    ref = _mig_claim(api, f"mig-run-{node_name}", node_name, THREE_G)
    async with server(_driver(host), kdir, kubeconfig, node_name):
        ids = await _prepare(kdir, ref)
        _reboot(host, kdir)
        assert await _prepare(kdir, ref) == ids
        [(start, size, _, minors)] = _made(host)
        assert (start, size) == (4, 4)
        assert _caps(kdir, ref[2]) == [f"/dev/nvidia-caps/nvidia-cap{m}" for m in minors]
        await _prepare(kdir, ref)  # nothing gone now: the same instance
        assert [m[3] for m in _made(host)] == [minors]


async def test_a_restart_after_a_reboot_sets_the_time_slice_in_force_again(
    gpu_host: Any, kdir: Path, kubeconfig: Path, node_name: str, api: Api
) -> None:
    host = gpu_host("dgx-8gpu")
    parameters = {
        "apiVersion": "resource.kubedevice.io/v1",
        "kind": "GpuConfig",
        "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}},
    }
    claim = create_claim(
        api,
        NAMESPACE,
        f"ts-{node_name}",
        requests=["gpu"],
        results=[result("gpu", DRIVER, node_name, "gpu-2")],
        config=[{"source": "FromClaim", "requests": ["gpu"],
                 "opaque": {"driver": DRIVER, "parameters": parameters}}],
    )  # fmt: skip
    ref = (NAMESPACE, f"ts-{node_name}", claim["metadata"]["uid"])
    config = Config(version="v1").with_overrides(**host.overrides())
    first = GpuDraDriver(config, host.nvml)
    async with server(first, kdir, kubeconfig, node_name):
        await _prepare(kdir, ref)
        uuid = {gd.device.name: gd.gpu.uuid for gd in first.gpu_devices}["gpu-2"]
    _reboot(host, kdir)
    assert host.nvml.time_slice(uuid) == 0
    async with server(GpuDraDriver(config, host.nvml), kdir, kubeconfig, node_name):
        assert host.nvml.time_slice(uuid) == 3  # Long again, before serving
        await _unprepare(kdir, ref)
        assert host.nvml.time_slice(uuid) == 0

"""The GPU DRA driver restarted between prepare and unprepare, on the kit and the fake NVML:
each claim's time slice is kept in the checkpoint, so the GPU still gets its level back.

Real gRPC over the driver's Unix socket, a real kube-apiserver (tests/dra's fixtures), a new
driver object over the same kubelet dir for the restart, the same fake GPUs (which keep
their time slice, as GPUs do when a driver process goes).
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import dra.conftest as dra_fixtures
import pytest
from dra import clients
from dra.api import Api
from dra.conftest import create_claim, result
from dra.fakes import server

from kubedevice.dra.model.types import PreparedClaim
from kubedevice.dra.node.settings import CHECKPOINT_FILE
from kubedevice.dra.state.checkpoint import Checkpoint
from kubedevice.nvidia.config import Config
from kubedevice.nvidia.dra import DEFAULT_DRIVER_NAME, GpuDraDriver

pytestmark = pytest.mark.timeout(60)

# tests/dra's fixtures, here too: a real kube-apiserver, a Node, a short kubelet dir
api = dra_fixtures.api
kdir = dra_fixtures.kdir
kubeconfig = dra_fixtures.kubeconfig
node_name = dra_fixtures.node_name

DRIVER = DEFAULT_DRIVER_NAME
NAMESPACE = "default"


def _claim(api: Api, name: str, node: str, gpu: str, interval: str) -> tuple[str, str, str]:
    parameters = {
        "apiVersion": "resource.kubedevice.io/v1",
        "kind": "GpuConfig",
        "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": interval}},
    }
    claim = create_claim(
        api,
        NAMESPACE,
        name,
        requests=["gpu"],
        # two claims on one GPU hold distinct shares of it (the kit refuses a device to a
        # second claim otherwise; the driver shares GPUs by memory, below)
        results=[{**result("gpu", DRIVER, node, gpu), "shareID": str(uuid.uuid4())}],
        config=[
            {
                "source": "FromClaim",
                "requests": ["gpu"],
                "opaque": {"driver": DRIVER, "parameters": parameters},
            }
        ],
    )
    return NAMESPACE, name, claim["metadata"]["uid"]


def _driver(host: Any) -> GpuDraDriver:
    config = Config(version="v1").with_overrides(**host.overrides()).with_memory_shares()
    return GpuDraDriver(config, host.nvml)


async def _call(kdir: Path, rpc: Any, ref: tuple[str, str, str]) -> None:
    answer = await rpc(kdir / "plugins" / DRIVER / "dra.sock", [ref])
    assert answer.claims[ref[2]].error == ""


async def test_a_restarted_driver_gives_the_gpu_its_default_back(
    gpu_host: Any, kdir: Path, kubeconfig: Path, node_name: str, api: Api
) -> None:
    host = gpu_host("dgx-8gpu")
    ref = _claim(api, f"ts-{node_name}", node_name, "gpu-2", "Long")
    first = _driver(host)
    async with server(first, kdir, kubeconfig, node_name):
        await _call(kdir, clients.prepare, ref)
        uuid = {gd.device.name: gd.gpu.uuid for gd in first.gpu_devices}["gpu-2"]
        assert host.nvml.time_slice(uuid) == 3
    assert host.nvml.time_slice(uuid) == 3  # the driver went; the GPU keeps its setting
    async with server(_driver(host), kdir, kubeconfig, node_name):
        await _call(kdir, clients.unprepare, ref)
        assert host.nvml.time_slice(uuid) == 0


async def test_after_a_restart_unpreparing_one_of_two_claims_leaves_the_others_level(
    gpu_host: Any, kdir: Path, kubeconfig: Path, node_name: str, api: Api
) -> None:
    host = gpu_host("dgx-8gpu")
    older = _claim(api, f"old-{node_name}", node_name, "gpu-2", "Long")
    newer = _claim(api, f"new-{node_name}", node_name, "gpu-2", "Short")
    first = _driver(host)
    async with server(first, kdir, kubeconfig, node_name):
        await _call(kdir, clients.prepare, older)
        await _call(kdir, clients.prepare, newer)
        uuid = {gd.device.name: gd.gpu.uuid for gd in first.gpu_devices}["gpu-2"]
        assert host.nvml.time_slice(uuid) == 1  # the newer claim's
    async with server(_driver(host), kdir, kubeconfig, node_name):
        await _call(kdir, clients.unprepare, newer)
        assert host.nvml.time_slice(uuid) == 3  # the older claim's setting stands again
    async with server(_driver(host), kdir, kubeconfig, node_name):  # and once more
        await _call(kdir, clients.unprepare, older)
        assert host.nvml.time_slice(uuid) == 0


async def test_a_prepare_cut_short_gives_the_gpu_the_level_in_force_back(
    gpu_host: Any, kdir: Path, kubeconfig: Path, node_name: str, api: Api
) -> None:
    """A prepare whose hook set a time slice and never returned (the driver killed in it)
    records nothing of it; the restarted driver's undo gives the GPU the level in force."""
    host = gpu_host("dgx-8gpu")
    ref = _claim(api, f"cut-{node_name}", node_name, "gpu-2", "Long")
    first = _driver(host)
    async with server(first, kdir, kubeconfig, node_name):
        await _call(kdir, clients.prepare, ref)
        uuid = {gd.device.name: gd.gpu.uuid for gd in first.gpu_devices}["gpu-2"]
    assert host.nvml.time_slice(uuid) == 3
    # what a kill -9 inside the hook leaves on disk: the claim "preparing", no data recorded
    checkpoint = Checkpoint(kdir / "plugins" / DRIVER / CHECKPOINT_FILE, DRIVER)
    checkpoint.load()
    done = checkpoint.claims.pop(ref[2])
    checkpoint.preparing[ref[2]] = PreparedClaim(
        ref=done.ref, devices=done.devices, cdi_ids=tuple(() for _ in done.devices)
    )
    checkpoint.save()
    async with server(_driver(host), kdir, kubeconfig, node_name):
        assert host.nvml.time_slice(uuid) == 0  # undone at start, before serving


async def test_two_instances_of_an_upgrade_keep_the_levels_each_other_set(
    gpu_host: Any, kdir: Path, kubeconfig: Path, node_name: str, api: Api
) -> None:
    """A rolling upgrade: b starts beside a; a unprepares one claim, b the other. b's time
    slices are rebuilt from the checkpoint a changed, so the GPU gets its default back (b,
    merging instead, would still count a's unprepared claim and leave its level)."""
    host = gpu_host("dgx-8gpu")
    older = _claim(api, f"up-old-{node_name}", node_name, "gpu-2", "Long")
    newer = _claim(api, f"up-new-{node_name}", node_name, "gpu-2", "Short")
    a_driver = _driver(host)
    uid_a, uid_b = "0a0a0a0a-0000-4000-8000-00000000000a", "0b0b0b0b-0000-4000-8000-00000000000b"
    async with server(a_driver, kdir, kubeconfig, node_name, pod_uid=uid_a) as a:
        a_sock = a.settings.dra_socket
        assert (await clients.prepare(a_sock, [older])).claims[older[2]].error == ""
        assert (await clients.prepare(a_sock, [newer])).claims[newer[2]].error == ""
        uuid = {gd.device.name: gd.gpu.uuid for gd in a_driver.gpu_devices}["gpu-2"]
        assert host.nvml.time_slice(uuid) == 1  # the newer claim's
        async with server(_driver(host), kdir, kubeconfig, node_name, pod_uid=uid_b) as b:
            b_sock = b.settings.dra_socket
            assert (await clients.unprepare(a_sock, [newer])).claims[newer[2]].error == ""
            assert host.nvml.time_slice(uuid) == 3  # the older claim's stands again
            assert (await clients.unprepare(b_sock, [older])).claims[older[2]].error == ""
            assert host.nvml.time_slice(uuid) == 0

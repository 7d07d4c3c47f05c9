"""The GPU DRA driver in-process on the fake NVML: health in the device lists, prepare."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

from kubedevice.dra import (
    AllocatedDevice,
    Claim,
    ClaimError,
    ClaimRef,
    Device,
    Health,
    OpaqueConfig,
    PreparedClaim,
)
from kubedevice.dra.model.taints import TaintPolicy
from kubedevice.dra.node.rules import check_claim
from kubedevice.errors import NvmlError
from kubedevice.nvidia.backend import EventKind, HealthEvent
from kubedevice.nvidia.config import Config
from kubedevice.nvidia.dra import GpuDraDriver
from kubedevice.nvidia.fake import FakeNvml


def _config(host: Any, **health: Any) -> Config:
    config = Config(version="v1").with_overrides(dev_root=str(host.dev), sys_root=str(host.sys))
    return dataclasses.replace(config, health=dataclasses.replace(config.health, **health))


def _claim(driver: GpuDraDriver, names: Sequence[str], *configs: Any, uid: str = "u1") -> Claim:
    devices = tuple(
        AllocatedDevice(
            request="gpus",
            pool="node-1",
            name=name,
            device=None,
            configs=tuple(OpaqueConfig(c) for c in configs),
        )
        for name in names
    )
    return Claim(ref=ClaimRef("default", "c", uid), devices=devices)


def _slicing(interval: str, kind: str = "GpuConfig") -> dict[str, Any]:
    return {
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": kind,
        "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": interval}},
    }


async def _next(gen: AsyncIterator[Sequence[Device]]) -> dict[str, Device]:
    devices = await asyncio.wait_for(anext(gen), 10)
    return {d.name: d for d in devices}


@contextlib.asynccontextmanager
async def _listed(host: Any, **health: Any) -> AsyncIterator[GpuDraDriver]:
    """A GPU DRA driver on ``host`` whose first device list has been read."""
    driver = GpuDraDriver(_config(host, **health), host.nvml)
    gen = driver.devices()
    try:
        await _next(gen)
        yield driver
    finally:
        await gen.aclose()


async def test_a_lost_gpu_turns_unhealthy_and_back(gpu_host: Any) -> None:
    host = gpu_host("gpu-lost")  # GPU 1 falls off the bus 2 s after watching starts
    driver = GpuDraDriver(_config(host, reset_check_interval=0.2), host.nvml)
    gen = driver.devices()
    try:
        first = await _next(gen)
        assert {n: d.health for n, d in first.items()} == {
            "gpu-0": Health.HEALTHY,
            "gpu-1": Health.HEALTHY,
        }
        second = await _next(gen)
        assert second["gpu-1"].health == Health.UNHEALTHY
        assert second["gpu-1"].fault is not None
        assert (second["gpu-1"].fault.kind, second["gpu-1"].fault.value) == ("gpu-lost", "")
        assert second["gpu-1"].fault.message.startswith("GPU lost")
        assert second["gpu-0"].health == Health.HEALTHY
        # the kit refuses a claim on it before the hook (the rule of every driver)
        with pytest.raises(ClaimError, match=r"device gpu-1 is Unhealthy .*does not tolerate"):
            check_claim(
                _claim(driver, ["gpu-1"]),
                driver_name="gpu.kubedevice.io",
                node_name="node-1",
                devices=second,
                taints=TaintPolicy("gpu.kubedevice.io"),
                held=[],
            )
        host.nvml.set_lost(driver.gpu_devices[1].gpu.uuid, False)
        third = await _next(gen)
        assert third["gpu-1"].health == Health.HEALTHY
    finally:
        await gen.aclose()


async def test_an_xid_follows_the_health_policy(gpu_host: Any) -> None:
    host = gpu_host("dgx-8gpu")
    driver = GpuDraDriver(_config(host, quiet_period=3600), host.nvml)
    gen = driver.devices()
    try:
        await _next(gen)
        uuid = driver.gpu_devices[3].gpu.uuid
        host.nvml.inject(HealthEvent(EventKind.XID, uuid, xid=13))  # the app's fault: ignored
        host.nvml.inject(HealthEvent(EventKind.XID, uuid, xid=79))
        devices = await _next(gen)
        assert [n for n, d in devices.items() if d.health != Health.HEALTHY] == ["gpu-3"]
        fault = devices["gpu-3"].fault
        assert fault is not None
        assert (fault.kind, fault.value) == ("xid", "79")  # the taint gpu.kubedevice.io/xid=79
        assert fault.message == "XID 79: GPU has fallen off the bus"
    finally:
        await gen.aclose()


async def test_prepare_applies_the_time_slice_and_gives_each_gpu_its_node(
    gpu_host: Any,
) -> None:
    host = gpu_host("dgx-8gpu")
    async with _listed(host) as driver:
        claim = _claim(driver, ["gpu-2", "gpu-5"], _slicing("Short"), _slicing("Long"))
        prepared = await driver.prepare(claim)
        first, second = ([(n.path, n.host_path) for n in p.edits.device_nodes] for p in prepared)
        assert first[0] == ("/dev/nvidia2", "/dev/nvidia2")
        assert ("/dev/nvidiactl", "/dev/nvidiactl") in first  # control nodes once per claim
        assert second == [("/dev/nvidia5", "/dev/nvidia5")]
        gpus = {gd.device.name: gd.gpu.uuid for gd in driver.gpu_devices}
        # the claim's config comes after the class's: Long wins
        assert host.nvml.time_slice(gpus["gpu-2"]) == 3
        assert host.nvml.time_slice(gpus["gpu-5"]) == 3
        assert host.nvml.time_slice(gpus["gpu-0"]) == 0
        # a second claim on gpu-2 keeps it set until both are gone
        await driver.prepare(_claim(driver, ["gpu-2"], _slicing("Medium"), uid="u2"))
        await driver.unprepare(PreparedClaim(ClaimRef("default", "c", "u1")))
        assert host.nvml.time_slice(gpus["gpu-5"]) == 0
        assert host.nvml.time_slice(gpus["gpu-2"]) == 2
        await driver.unprepare(PreparedClaim(ClaimRef("default", "c2", "u2")))
        assert host.nvml.time_slice(gpus["gpu-2"]) == 0


@pytest.mark.parametrize(
    ("config", "needle"),
    [
        (
            {**_slicing("Fast")},
            "request gpus: opaque config[0]: sharing.timeSlicingConfig.interval: must be",
        ),
        ({"apiVersion": "resource.kubedevice.io/v1", "kind": "GpuConfig", "x": 1}, "x: unknown"),
        (
            {"apiVersion": "v1", "kind": "GpuConfig"},
            "apiVersion: must be one of resource.kubedevice.io/v1",
        ),
        (_slicing("Long", "MigDeviceConfig"), "MIG device has no time-slice"),
        ({"apiVersion": "resource.kubedevice.io/v1", "kind": "MigDeviceConfig"}, "use GpuConfig"),
        ("not an object", "expected a JSON object"),
    ],
    ids=["interval", "unknown-key", "api-version", "mig-interval", "wrong-kind", "not-object"],
)
async def test_bad_configs_fail_the_claim_naming_the_field(
    gpu_host: Any, config: Any, needle: str
) -> None:
    host = gpu_host("dgx-8gpu")
    async with _listed(host) as driver:
        with pytest.raises(ClaimError, match=needle.replace("[", r"\[")):
            await driver.prepare(_claim(driver, ["gpu-0"], config))
        # nothing was applied
        assert host.nvml.time_slice(driver.gpu_devices[0].gpu.uuid) == 0


async def test_an_unknown_device_fails_the_claim(gpu_host: Any) -> None:
    host = gpu_host("pcie-4gpu")
    async with _listed(host) as driver:
        with pytest.raises(ClaimError, match="gpu-9 is not a GPU of this node"):
            await driver.prepare(_claim(driver, ["gpu-9"]))


async def test_unpreparing_a_claim_leaves_the_level_of_the_newest_claim_still_prepared(
    gpu_host: Any,
) -> None:
    host = gpu_host("dgx-8gpu")
    async with _listed(host) as driver:
        uuid = {gd.device.name: gd.gpu.uuid for gd in driver.gpu_devices}["gpu-2"]
        prepared = {}
        for uid, interval in (("u1", "Long"), ("u2", "Short"), ("u3", "Medium")):
            prepared[uid] = await driver.prepare(
                _claim(driver, ["gpu-2"], _slicing(interval), uid=uid)
            )
        assert host.nvml.time_slice(uuid) == 2  # the newest claim's: Medium
        assert [dict(p.data) for p in prepared["u2"]] == [{"gpu": uuid, "timeSlice": 1, "order": 2}]

        async def unprepare(uid: str) -> int:
            await driver.unprepare(PreparedClaim(ClaimRef("default", "c", uid)))
            return host.nvml.time_slice(uuid)

        assert await unprepare("u2") == 2  # not the one in force: Medium stands
        assert await unprepare("u3") == 3  # the one in force: back to u1's Long
        assert await unprepare("u1") == 0  # the last one: Default


async def test_a_gpu_refusing_the_time_slice_gives_back_what_the_claim_set(gpu_host: Any) -> None:
    host = gpu_host("dgx-8gpu")
    async with _listed(host, disabled=True) as driver:  # no health: prepare tries
        uuid = {gd.device.name: gd.gpu.uuid for gd in driver.gpu_devices}
        await driver.prepare(_claim(driver, ["gpu-2"], _slicing("Medium"), uid="u1"))
        host.nvml.set_lost(uuid["gpu-5"], True)
        with pytest.raises(ClaimError, match="cannot set the time-slice interval of gpu-5"):
            await driver.prepare(_claim(driver, ["gpu-2", "gpu-5"], _slicing("Long"), uid="u2"))
        assert host.nvml.time_slice(uuid["gpu-2"]) == 2  # u1's again, not u2's Long
        await driver.unprepare(PreparedClaim(ClaimRef("default", "c", "u1")))
        assert host.nvml.time_slice(uuid["gpu-2"]) == 0  # u2 holds nothing on it


async def test_prepare_mounts_the_driver_files_for_any_image_loader(
    gpu_host: Any, tmp_path: Any
) -> None:
    host = gpu_host("dgx-8gpu")
    version = host.nvml.machine.driver.driver_version
    root = tmp_path / "driver"
    lib = root / "usr" / "lib" / "x86_64-linux-gnu"
    lib.mkdir(parents=True)
    (lib / f"libcuda.so.{version}").write_text("elf")
    (lib / "libcuda.so.1").symlink_to(f"libcuda.so.{version}")
    (root / "usr" / "bin").mkdir()
    (root / "usr" / "bin" / "nvidia-smi").write_text("#!/bin/sh\nexec /usr/bin/nvidia-smi.real\n")
    (root / "usr" / "bin" / "nvidia-smi.real").write_bytes(b"\x7fELF" + bytes(12))
    config = _config(host).with_overrides(
        nvidia_driver_root=str(root), host_driver_root="/run/nvidia/driver"
    )
    driver = GpuDraDriver(config, host.nvml)
    gen = driver.devices()
    try:
        await _next(gen)
        first, second = await driver.prepare(_claim(driver, ["gpu-0", "gpu-1"]))
    finally:
        await gen.aclose()
    mounts = {m.container_path: m.host_path for m in first.edits.mounts}
    host_lib = "/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libcuda.so.1"
    assert mounts["/usr/lib/x86_64-linux-gnu/libcuda.so.1"] == host_lib
    assert mounts["/usr/lib64/libcuda.so.1"] == host_lib  # where a UBI image's loader looks
    # the wrapper script is replaced by the binary it runs
    assert mounts["/usr/bin/nvidia-smi"] == "/run/nvidia/driver/usr/bin/nvidia-smi.real"
    assert len(mounts) == 5
    assert not second.edits.mounts  # once per claim


def test_open_raises_the_start_error_not_the_clean_ups(gpu_host: Any) -> None:
    """A backend whose shutdown also fails (as NVML's does when init failed): open() raises
    why it could not start."""
    host = gpu_host("pcie-4gpu")

    class NoLibrary(FakeNvml):
        def init(self) -> Any:
            raise NvmlError("LibraryNotFound", "nvmlInit: NVML Shared Library Not Found")

        def shutdown(self) -> None:
            raise NvmlError("Uninitialized", "nvmlShutdown: Uninitialized")

    backend = NoLibrary(host.nvml.machine)
    with pytest.raises(NvmlError) as e:
        GpuDraDriver(_config(host), backend).open()
    assert e.value.code == "LibraryNotFound"

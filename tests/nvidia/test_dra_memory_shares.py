"""GPU memory shares in the GPU DRA driver (fake NVML): published shared with a memory
policy, kept shared through health changes, each share told its memory, time-slicing per
share, and the config and flag that turn it on."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from typing import Any

import pytest

from kubedevice.dra import AllocatedDevice, Claim, ClaimRef, Device, Health, OpaqueConfig
from kubedevice.dra.api.slices import device_object
from kubedevice.errors import ConfigError
from kubedevice.nvidia.backend import EventKind, HealthEvent
from kubedevice.nvidia.config import Config, parse_config
from kubedevice.nvidia.dra import GpuDraDriver
from kubedevice.nvidia.dra.devices import binary_quantity, memory_policy

GIB = 1 << 30


def _config(host: Any, **health: Any) -> Config:
    config = Config(version="v1").with_overrides(dev_root=str(host.dev), sys_root=str(host.sys))
    config = dataclasses.replace(config, health=dataclasses.replace(config.health, **health))
    return config.with_memory_shares()


def _share(
    name: str, share: str | None, memory: str | None, *configs: Any, request: str = "gpu"
) -> AllocatedDevice:
    return AllocatedDevice(
        request=request,
        pool="node-1",
        name=name,
        device=None,
        configs=tuple(OpaqueConfig(c) for c in configs),
        share_id=share,
        consumed_capacity={"memory": memory} if memory else {},
    )


def _claim(uid: str, *devices: AllocatedDevice) -> Claim:
    return Claim(ref=ClaimRef("default", f"c-{uid}", uid), devices=devices)


async def _first(driver: GpuDraDriver) -> tuple[Any, dict[str, Device]]:
    gen = driver.devices()
    devices = await asyncio.wait_for(anext(gen), 10)
    return gen, {d.name: d for d in devices}


def test_the_policy_is_whole_steps_and_a_claim_naming_none_gets_the_gpu() -> None:
    policy = memory_policy(80 * GIB, GIB)
    assert policy is not None
    assert policy.to_json() == {
        "default": "80Gi",
        "validRange": {"min": "1Gi", "max": "80Gi", "step": "1Gi"},
    }
    # an H100 80GB has 81559 MiB: 79 whole GiB (a share of the rest is never given)
    real = memory_policy(81559 << 20, GIB)
    assert real is not None
    assert (real.default, real.max) == ("79Gi", "79Gi")
    assert memory_policy(GIB + 5, GIB) is None  # under two steps: not shared
    assert binary_quantity(1024 * GIB) == "1Ti"
    assert binary_quantity(512 << 20) == "512Mi"
    assert binary_quantity(1000) == "1000"


async def test_whole_gpus_are_published_shared_and_mig_devices_whole(gpu_host: Any) -> None:
    host = gpu_host("mig-mixed")
    config = dataclasses.replace(
        _config(host), flags=dataclasses.replace(_config(host).flags, mig_strategy="mixed")
    )
    driver = GpuDraDriver(config, host.nvml)
    gen, devices = await _first(driver)
    try:
        whole = devices["gpu-2"]  # MIG-capable but disabled: a whole GPU
        assert whole.allow_multiple_allocations
        body = device_object(whole)
        assert body["allowMultipleAllocations"] is True
        assert body["capacity"]["memory"]["requestPolicy"]["validRange"]["step"] == "1Gi"
        migs = [d for n, d in devices.items() if "-mig-" in n]
        assert migs
        assert not any(d.allow_multiple_allocations for d in migs)
    finally:
        await gen.aclose()


async def test_off_by_default(gpu_host: Any) -> None:
    host = gpu_host("one-gpu-80gib")
    config = Config(version="v1").with_overrides(dev_root=str(host.dev), sys_root=str(host.sys))
    gen, devices = await _first(GpuDraDriver(config, host.nvml))
    try:
        assert not devices["gpu-0"].allow_multiple_allocations
        assert "allowMultipleAllocations" not in device_object(devices["gpu-0"])
    finally:
        await gen.aclose()


async def test_an_unhealthy_shared_gpu_stays_shared(gpu_host: Any) -> None:
    host = gpu_host("one-gpu-80gib")
    driver = GpuDraDriver(_config(host, quiet_period=3600), host.nvml)
    gen, devices = await _first(driver)
    try:
        assert devices["gpu-0"].allow_multiple_allocations
        host.nvml.inject(HealthEvent(EventKind.XID, driver.gpu_devices[0].gpu.uuid, xid=79))
        bad = {d.name: d for d in await asyncio.wait_for(anext(gen), 10)}["gpu-0"]
        assert bad.health == Health.UNHEALTHY
        # the tainted device is the same shared device: claims' shares are still counted
        assert bad.allow_multiple_allocations
        assert bad.request_policies == devices["gpu-0"].request_policies
    finally:
        await gen.aclose()


def _env(prepared: Sequence[Any]) -> list[dict[str, str]]:
    return [dict(p.edits.env) for p in prepared]


async def test_each_share_is_told_its_memory_and_time_slices_are_per_share(
    gpu_host: Any,
) -> None:
    host = gpu_host("one-gpu-80gib")
    driver = GpuDraDriver(_config(host), host.nvml)
    gen, _ = await _first(driver)
    uuid = driver.gpu_devices[0].gpu.uuid
    per_gpu = "KUBEDEVICE_GPU_MEMORY_LIMIT_" + uuid.replace("-", "_").upper()
    slicing = {
        "apiVersion": "resource.kubedevice.io/v1",
        "kind": "GpuConfig",
        "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}},
    }
    try:
        one = await driver.prepare(_claim("u1", _share("gpu-0", "s-1", "20Gi", slicing)))
        two = await driver.prepare(_claim("u2", _share("gpu-0", "s-2", "60Gi")))
        assert _env(one) == [{"KUBEDEVICE_GPU_MEMORY_LIMIT": str(20 * GIB), per_gpu: str(20 * GIB)}]
        assert _env(two) == [{"KUBEDEVICE_GPU_MEMORY_LIMIT": str(60 * GIB), per_gpu: str(60 * GIB)}]
        # each share still gets the GPU's device node
        assert "/dev/nvidia0" in [n.path for n in two[0].edits.device_nodes]
        assert host.nvml.time_slice(uuid) == 3  # set by share 1's claim
        # two shares of one GPU in one claim (two requests, 10Gi and 15Gi): the claim holds
        # 25Gi of it, and a container given both CDI devices is told 25Gi, whichever of
        # their envs the runtime applies last
        both = await driver.prepare(
            _claim(
                "u3",
                _share("gpu-0", "s-3", "10Gi", request="a"),
                _share("gpu-0", "s-4", "15Gi", request="b"),
            )
        )
        total = {"KUBEDEVICE_GPU_MEMORY_LIMIT": str(25 * GIB), per_gpu: str(25 * GIB)}
        assert _env(both) == [total, total]
        # a whole GPU (no share) is told nothing
        whole = await driver.prepare(_claim("u4", _share("gpu-0", None, None)))
        assert _env(whole) == [{}]
        from kubedevice.dra import PreparedClaim

        await driver.unprepare(PreparedClaim(ClaimRef("default", "c-u1", "u1")))
        assert host.nvml.time_slice(uuid) == 0
    finally:
        await gen.aclose()


def test_the_config_key_and_its_errors() -> None:
    config = parse_config(
        {"version": "v1", "dra": {"memoryShares": {"enabled": True, "step": "512Mi"}}}
    )
    assert config.dra.memory_shares.enabled
    assert config.dra.memory_shares.step_bytes == 512 << 20
    assert not parse_config({"version": "v1"}).dra.memory_shares.enabled
    with pytest.raises(ConfigError, match=r"gpu.yaml: dra.memoryShares.step: must be a size"):
        parse_config({"version": "v1", "dra": {"memoryShares": {"step": "1G"}}}, "gpu.yaml")


async def test_with_mig_on_demand_a_partitioned_gpu_is_not_shared_by_memory(
    gpu_host: Any,
) -> None:
    host = gpu_host("dgx-8gpu-mig")
    config = _config(host)
    config = dataclasses.replace(config, dra=dataclasses.replace(config.dra, mig_on_demand=True))
    gen, devices = await _first(GpuDraDriver(config, host.nvml))
    try:
        # a whole GPU that consumes its partitions' counters is allocated whole, once
        assert devices["gpu-0"].consumes_counters
        assert not devices["gpu-0"].allow_multiple_allocations
        assert not any(d.allow_multiple_allocations for d in devices.values())
    finally:
        await gen.aclose()


async def test_shares_of_two_gpus_in_one_claim_are_told_per_gpu_only(gpu_host: Any) -> None:
    host = gpu_host("dgx-8gpu")
    driver = GpuDraDriver(_config(host), host.nvml)
    gen, _ = await _first(driver)
    try:
        uuids = [gd.gpu.uuid for gd in driver.gpu_devices[:2]]
        var = ["KUBEDEVICE_GPU_MEMORY_LIMIT_" + u.replace("-", "_").upper() for u in uuids]
        claim = _claim(
            "u5",
            _share("gpu-0", "s-5", "10Gi", request="a"),
            _share("gpu-1", "s-6", "15Gi", request="b"),
            _share("gpu-0", "s-7", "5Gi", request="c"),
        )
        got = _env(await driver.prepare(claim))
        # no plain variable: which GPU would it describe?
        assert got == [{var[0]: str(15 * GIB)}, {var[1]: str(15 * GIB)}, {var[0]: str(15 * GIB)}]
    finally:
        await gen.aclose()

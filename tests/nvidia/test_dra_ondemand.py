"""MIG on demand in the GPU DRA driver, in process on the fake NVML (an 8x H100 box)."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
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
    PreparedClaim,
)
from kubedevice.dra.model.counters import check_counters
from kubedevice.dra.model.taints import TaintPolicy
from kubedevice.dra.node.rules import check_claim
from kubedevice.nvidia.backend import EventKind, HealthEvent, MigPlacement
from kubedevice.nvidia.config import Config
from kubedevice.nvidia.dra import GpuDraDriver

SLICES = [f"memory-slice-{i}" for i in range(8)]


def _config(host: Any, on_demand: bool = True) -> Config:
    config = Config(version="v1").with_overrides(dev_root=str(host.dev), sys_root=str(host.sys))
    config = dataclasses.replace(
        config, dra=dataclasses.replace(config.dra, mig_on_demand=on_demand)
    )
    return dataclasses.replace(config, health=dataclasses.replace(config.health, quiet_period=3600))


def _claim(names: Sequence[str], uid: str) -> Claim:
    devices = tuple(AllocatedDevice("mig", "node-1", n, None) for n in names)
    return Claim(ref=ClaimRef("default", f"c-{uid}", uid), devices=devices)


def _prepared(claim: Claim, data: Sequence[Any]) -> PreparedClaim:
    return PreparedClaim(
        ref=claim.ref,
        devices=tuple((d.request, d.pool, d.name) for d in claim.devices),
        data=tuple(data),
    )


async def _next(gen: AsyncIterator[Sequence[Device]]) -> dict[str, Device]:
    devices = await asyncio.wait_for(anext(gen), 10)
    return {d.name: d for d in devices}


async def test_only_the_profiles_the_config_names_are_offered(gpu_host: Any) -> None:
    """``dra.migOnDemandProfiles``: each GPU is the whole GPU and the placements of the named
    profiles only (10 devices instead of 26), still consuming the GPU's counters."""
    from kubedevice.nvidia.config import parse_config

    host = gpu_host("dgx-8gpu-mig")
    dra = {"migOnDemand": True, "migOnDemandProfiles": ["1g.10gb", "3g.40gb"]}
    config = parse_config({"version": "v1", "dra": dra})
    config = config.with_overrides(dev_root=str(host.dev), sys_root=str(host.sys))
    driver = GpuDraDriver(config, host.nvml)
    gen = driver.devices()
    try:
        devices = await _next(gen)
    finally:
        await gen.aclose()
    assert len(devices) == 8 * (1 + 7 + 2)
    assert {d.attributes.get("profile") for d in devices.values()} == {None, "1g.10gb", "3g.40gb"}
    assert len(driver.counter_sets()) == 8
    check_counters(list(devices.values()), driver.counter_sets())


async def test_every_placement_of_every_profile_consumes_the_gpus_counters(gpu_host: Any) -> None:
    host = gpu_host("dgx-8gpu-mig")
    driver = GpuDraDriver(_config(host), host.nvml)
    gen = driver.devices()
    try:
        devices = await _next(gen)
    finally:
        await gen.aclose()
    sets = driver.counter_sets()
    assert [s.name for s in sets] == [f"gpu-{i}-counter-set" for i in range(8)]
    assert sorted(sets[0].counters) == sorted([*SLICES, "media-extensions"])
    assert len(devices) == 8 * 26  # the whole GPU + 7 + 7 + 4 + 3 + 2 + 1 + 1 placements
    check_counters(list(devices.values()), sets)
    gpu0 = sorted(n for n in devices if n.startswith("gpu-0"))
    assert "gpu-0-mig-3g-40gb-4" in gpu0
    assert "gpu-0-mig-1g-10gb-me-6" in gpu0
    three = devices["gpu-0-mig-3g-40gb-4"]
    assert three.attributes["type"] == "mig"
    assert three.attributes["profile"] == "3g.40gb"
    assert (three.attributes["placementStart"], three.attributes["placementSize"]) == (4, 4)
    [use] = three.consumes_counters
    assert use.counter_set == "gpu-0-counter-set"
    assert sorted(use.counters) == SLICES[4:]
    [whole] = devices["gpu-0"].consumes_counters
    assert sorted(whole.counters) == sorted([*SLICES, "media-extensions"])
    [me] = devices["gpu-0-mig-1g-10gb-me-2"].consumes_counters
    assert sorted(me.counters) == ["media-extensions", "memory-slice-2"]


async def test_partitions_carry_nvidias_mig_capacities(gpu_host: Any) -> None:
    """A selector written for NVIDIA's MIG devices (``multiprocessors``, engines,
    ``memorySlice<i>``) must evaluate on a partition offered on demand, not be a CEL error."""
    host = gpu_host("dgx-8gpu-mig")
    driver = GpuDraDriver(_config(host), host.nvml)
    gen = driver.devices()
    try:
        devices = await _next(gen)
    finally:
        await gen.aclose()
    three = {k: str(v) for k, v in devices["gpu-0-mig-3g-40gb-4"].capacity.items()}
    assert three == {
        "memory": str(40448 * 1024 * 1024),
        "multiprocessors": "60",
        "copyEngines": "3",
        "decoders": "3",
        "encoders": "0",
        "jpegEngines": "3",
        "ofaEngines": "0",
        **{f"memorySlice{i}": "1" for i in range(4, 8)},
    }
    me = devices["gpu-0-mig-1g-10gb-me-2"].capacity
    assert (str(me["ofaEngines"]), str(me["memorySlice2"])) == ("1", "1")
    assert "memorySlice1" not in me
    assert str(devices["gpu-0-mig-7g-80gb-0"].capacity["multiprocessors"]) == "132"
    for device in devices.values():
        assert len(device.attributes) + len(device.capacity) <= 32, device.name
    assert "multiprocessors" not in devices["gpu-0"].capacity  # the whole GPU: memory only


async def test_off_by_default_no_counters(gpu_host: Any) -> None:
    host = gpu_host("dgx-8gpu-mig")
    driver = GpuDraDriver(_config(host, on_demand=False), host.nvml)
    gen = driver.devices()
    try:
        devices = await _next(gen)
    finally:
        await gen.aclose()
    assert sorted(devices) == [f"gpu-{i}" for i in range(8)]
    assert driver.counter_sets() == []


async def test_prepare_makes_the_mig_device_unprepare_destroys_it(gpu_host: Any) -> None:
    host = gpu_host("dgx-8gpu-mig")
    driver = GpuDraDriver(_config(host), host.nvml)
    gen = driver.devices()
    try:
        await _next(gen)
        gpu = driver.gpu_devices[0].gpu.uuid
        claims = [
            _claim(["gpu-0-mig-3g-40gb-4"], "a"),
            _claim(["gpu-0-mig-2g-20gb-0"], "b"),
            _claim(["gpu-0-mig-2g-20gb-2"], "c"),
        ]
        results = [await driver.prepare(c) for c in claims]
        made = host.nvml.gpu_instances(gpu)
        assert [(g.placement.start, g.placement.size) for g in made] == [(4, 4), (0, 2), (2, 2)]
        [first] = results[0]
        mig = made[0].devices[0]
        assert first.data["mig"] == {"gpu": gpu, "gi": made[0].gi_id, "uuid": mig.uuid}
        nodes = [n.path for n in first.edits.device_nodes]
        caps = [f"/dev/nvidia-caps/nvidia-cap{m}" for m in mig.cap_minors]
        assert nodes[:3] == ["/dev/nvidia0", *caps]
        # NVML refuses an overlap even when asked (the scheduler never asks: counters)
        with pytest.raises(ClaimError, match="InsufficientResources"):
            await driver.prepare(_claim(["gpu-0-mig-4g-40gb-0"], "d"))
        assert len(host.nvml.gpu_instances(gpu)) == 3
        for claim, result in zip(claims, results, strict=True):
            await driver.unprepare(_prepared(claim, [p.data for p in result]))
        assert host.nvml.gpu_instances(gpu) == []
        # unprepared again (the kubelet retries): nothing left to do, no error
        await driver.unprepare(_prepared(claims[0], [p.data for p in results[0]]))
    finally:
        await gen.aclose()


async def test_a_claim_whose_second_device_fails_leaves_nothing(gpu_host: Any) -> None:
    host = gpu_host("dgx-8gpu-mig")
    driver = GpuDraDriver(_config(host), host.nvml)
    gen = driver.devices()
    try:
        await _next(gen)
        gpu = driver.gpu_devices[0].gpu.uuid
        with pytest.raises(ClaimError, match=r"gpu-0-mig-4g-40gb-0.*InsufficientResources"):
            await driver.prepare(_claim(["gpu-0-mig-3g-40gb-0", "gpu-0-mig-4g-40gb-0"], "x"))
        assert host.nvml.gpu_instances(gpu) == []
    finally:
        await gen.aclose()


async def test_an_xid_on_the_gpu_marks_every_partition_unhealthy(gpu_host: Any) -> None:
    host = gpu_host("dgx-8gpu-mig")
    driver = GpuDraDriver(_config(host), host.nvml)
    gen = driver.devices()
    try:
        await _next(gen)
        uuid = driver.gpu_devices[26].gpu.uuid  # GPU 1
        host.nvml.inject(HealthEvent(EventKind.XID, uuid, xid=79))
        devices = await _next(gen)
        bad = sorted(n for n, d in devices.items() if d.health != Health.HEALTHY)
        assert len(bad) == 26
        assert all(n == "gpu-1" or n.startswith("gpu-1-mig-") for n in bad)
        # the kit refuses the claim before the hook (the rule of every driver), so no
        # instance is made on the bad GPU
        with pytest.raises(ClaimError, match=r"is Unhealthy .*does not tolerate it"):
            check_claim(
                _claim(["gpu-1-mig-3g-40gb-0"], "y"),
                driver_name="gpu.kubedevice.io",
                node_name="node-1",
                devices=devices,
                taints=TaintPolicy("gpu.kubedevice.io"),
                held=[],
            )
        assert host.nvml.gpu_instances(uuid) == []
    finally:
        await gen.aclose()


async def test_at_start_instances_no_claim_owns_are_destroyed(gpu_host: Any) -> None:
    host = gpu_host("dgx-8gpu-mig")
    host.nvml.init()
    gpu = host.nvml.gpus()[0].uuid
    owned = host.nvml.create_mig_device(gpu, 9, MigPlacement(0, 4))  # a prepared claim's
    orphan = host.nvml.create_mig_device(gpu, 14, MigPlacement(4, 2))  # made, never checkpointed
    claim = _claim(["gpu-0-mig-3g-40gb-0"], "kept")
    record = {"mig": {"gpu": gpu, "gi": owned.gi_id, "uuid": owned.uuid}}
    driver = GpuDraDriver(_config(host), host.nvml)
    await driver.restore([_prepared(claim, [record])])
    assert [g.gi_id for g in host.nvml.gpu_instances(gpu)] == [owned.gi_id]
    assert orphan.gi_id != owned.gi_id
    gen = driver.devices()
    try:
        devices = await _next(gen)
        assert "gpu-0-mig-3g-40gb-0" in devices
        await driver.unprepare(_prepared(claim, [record]))  # the restored claim goes
        assert host.nvml.gpu_instances(gpu) == []
    finally:
        await gen.aclose()


async def test_a_retry_adopts_the_instance_a_cut_off_prepare_left_at_its_placement(
    gpu_host: Any,
) -> None:
    """The kubelet's deadline cut a prepare off; NVML's thread made the instance anyway and
    nothing recorded it. The retry takes that instance instead of failing on it."""
    host = gpu_host("dgx-8gpu-mig")
    driver = GpuDraDriver(_config(host), host.nvml)
    gen = driver.devices()
    try:
        await _next(gen)
        gpu = driver.gpu_devices[0].gpu.uuid
        left = host.nvml.create_mig_device(gpu, 9, MigPlacement(4, 4))  # the cut-off one's
        [prepared] = await driver.prepare(_claim(["gpu-0-mig-3g-40gb-4"], "retry"))
        assert prepared.data["mig"] == {"gpu": gpu, "gi": left.gi_id, "uuid": left.uuid}
        assert [g.gi_id for g in host.nvml.gpu_instances(gpu)] == [left.gi_id]
        # an instance another claim owns is never taken: that one is refused by NVML
        with pytest.raises(ClaimError, match="InsufficientResources"):
            await driver.prepare(_claim(["gpu-0-mig-3g-40gb-4"], "other"))
    finally:
        await gen.aclose()


async def test_a_cancelled_prepare_waits_for_nvml_and_destroys_what_it_made(
    gpu_host: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    host = gpu_host("dgx-8gpu-mig")
    driver = GpuDraDriver(_config(host), host.nvml)
    entered, release, ended = threading.Event(), threading.Event(), threading.Event()
    real_create = host.nvml.create_mig_device

    def slow_create(*args: Any) -> Any:
        entered.set()
        release.wait(10)
        try:
            return real_create(*args)
        finally:
            ended.set()

    gen = driver.devices()
    try:
        await _next(gen)
        gpu = driver.gpu_devices[0].gpu.uuid
        monkeypatch.setattr(host.nvml, "create_mig_device", slow_create)
        claim = _claim(["gpu-0-mig-3g-40gb-4"], "cut")
        task = asyncio.create_task(driver.prepare(claim))
        assert await asyncio.to_thread(entered.wait, 10)
        task.cancel()  # the kubelet's deadline: NVML's thread goes on
        await asyncio.sleep(0)
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert ended.is_set()  # the cancelled prepare ended after NVML did
        assert host.nvml.gpu_instances(gpu) == []  # and destroyed what it made
        monkeypatch.setattr(host.nvml, "create_mig_device", real_create)
        [prepared] = await driver.prepare(claim)  # the retry
        assert [g.placement for g in host.nvml.gpu_instances(gpu)] == [MigPlacement(4, 4)]
        assert prepared.data["mig"]["uuid"] == host.nvml.gpu_instances(gpu)[0].devices[0].uuid
    finally:
        release.set()
        await gen.aclose()


async def test_unpreparing_a_claim_that_recorded_nothing_destroys_its_placements_instance(
    gpu_host: Any,
) -> None:
    """The kit undoes an interrupted prepare with ``unprepare`` and no data: the instance
    at the claim's placement goes, one another claim owns stays."""
    host = gpu_host("dgx-8gpu-mig")
    driver = GpuDraDriver(_config(host), host.nvml)
    gen = driver.devices()
    try:
        await _next(gen)
        gpu = driver.gpu_devices[0].gpu.uuid
        kept = await driver.prepare(_claim(["gpu-0-mig-2g-20gb-0"], "kept"))
        host.nvml.create_mig_device(gpu, 9, MigPlacement(4, 4))  # a cut-off prepare's
        cut = _claim(["gpu-0-mig-3g-40gb-4", "gpu-0-mig-2g-20gb-0"], "cut")
        await driver.unprepare(_prepared(cut, [{}, {}]))
        [left] = host.nvml.gpu_instances(gpu)
        assert left.devices[0].uuid == kept[0].data["mig"]["uuid"]
    finally:
        await gen.aclose()

"""Counter sets and devices that consume counters: checks, layout, and a real API server."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from e2e.cluster import find_binaries

import kubedevice.dra as dra
from dra.api import RESOURCE, Api, ApiError
from dra.conftest import REPO, api_server
from dra.fakes import DRIVER, server
from kubedevice.dra.model.counters import check_counters
from kubedevice.errors import ConfigError

pytestmark = pytest.mark.timeout(90)

SLICES = [f"memory-slice-{i}" for i in range(8)]


def partitioned(gpus: int, parts: int) -> tuple[list[dra.Device], list[dra.CounterSet]]:
    """``gpus`` GPUs, each a counter set of 8 memory slices, a whole device and ``parts``
    one-slice partitions (partition ``p`` takes memory slice ``p % 8``)."""
    devices: list[dra.Device] = []
    sets: list[dra.CounterSet] = []
    for g in range(gpus):
        sets.append(dra.CounterSet(f"gpu-{g}", dict.fromkeys(SLICES, 1)))
        whole = dra.CounterConsumption(f"gpu-{g}", dict.fromkeys(SLICES, 1))
        devices.append(dra.Device(f"gpu-{g}", {"index": g}, consumes_counters=[whole]))
        for p in range(parts):
            use = dra.CounterConsumption(f"gpu-{g}", {SLICES[p % 8]: 1})
            devices.append(dra.Device(f"gpu-{g}-part-{p}", {"index": g}, consumes_counters=[use]))
    return devices, sets


class PartitionedDriver(dra.Driver):
    driver_name = DRIVER

    def __init__(self, devices: Sequence[dra.Device], sets: Sequence[dra.CounterSet]) -> None:
        self._devices = list(devices)
        self._sets = list(sets)

    async def devices(self) -> AsyncIterator[Sequence[dra.Device]]:
        yield self._devices
        await asyncio.Event().wait()

    def counter_sets(self) -> Sequence[dra.CounterSet]:
        return self._sets


# ---- the types' checks


def test_counter_names_values_and_limits_are_checked() -> None:
    with pytest.raises(ConfigError, match="counter set name 'GPU_0' is not a DNS label"):
        dra.CounterSet("GPU_0", {"a": 1})
    with pytest.raises(ConfigError, match="counter name 'memorySlice0' is not a DNS label"):
        dra.CounterSet("gpu-0", {"memorySlice0": 1})
    with pytest.raises(ConfigError, match="counter set gpu-0: no counters"):
        dra.CounterSet("gpu-0", {})
    with pytest.raises(ConfigError, match="33 counters \\(at most 32\\)"):
        dra.CounterSet("gpu-0", {f"c-{i}": 1 for i in range(33)})
    with pytest.raises(ConfigError, match="counter c: capacity 'lots' is not a Kubernetes"):
        dra.CounterConsumption("gpu-0", {"c": "lots"})
    use = [dra.CounterConsumption(f"s-{i}", {"c": 1}) for i in range(3)]
    with pytest.raises(ConfigError, match="device d: consumes from 3 counter sets \\(at most 2\\)"):
        dra.Device("d", consumes_counters=use)
    twice = [dra.CounterConsumption("s", {"c": 1}), dra.CounterConsumption("s", {"d": 1})]
    with pytest.raises(ConfigError, match="device d: counter set s named twice"):
        dra.Device("d", consumes_counters=twice)
    assert dra.CounterSet("gpu-0", {"memory": "80Gi"}).counters["memory"] == dra.Quantity("80Gi")


def test_every_consumption_names_a_published_set_and_counter() -> None:
    devices, sets = partitioned(2, 3)
    check_counters(devices, sets)  # fine
    with pytest.raises(ConfigError, match="device gpu-1: consumes from counter set gpu-1, which"):
        check_counters(devices, sets[:1])
    with pytest.raises(ConfigError, match="counter set gpu-0 is defined twice"):
        check_counters(devices, [*sets, sets[0]])
    odd = dra.Device("odd", consumes_counters=[dra.CounterConsumption("gpu-0", {"ofa": 1})])
    with pytest.raises(ConfigError, match="device odd: counter set gpu-0 has no counter ofa"):
        check_counters([odd], sets)


# ---- on a real API server


def _kinds(slices: list[dict[str, Any]]) -> list[tuple[str, int]]:
    out = []
    for s in slices:
        spec = s["spec"]
        if spec.get("sharedCounters"):
            out.append(("counters", len(spec["sharedCounters"])))
        else:
            out.append(("devices", len(spec.get("devices") or [])))
    return out


async def test_counter_sets_in_slices_of_their_own_devices_64_a_slice(
    kdir: Path, kubeconfig: Path, node_name: str, api: Api
) -> None:
    devices, sets = partitioned(9, 25)  # 9 sets (8 + 1), 234 devices (3 x 64 + 42)
    async with server(PartitionedDriver(devices, sets), kdir, kubeconfig, node_name) as srv:
        await asyncio.wait_for(srv.wait_published(), 30)
        slices = api.slices(DRIVER, node_name)
    # slice names are the API server's (generateName): order them by what they hold
    position = {d.name: i for i, d in enumerate(devices)} | {c.name: i for i, c in enumerate(sets)}

    def first(s: dict[str, Any]) -> tuple[int, int]:
        spec = s["spec"]
        if spec.get("sharedCounters"):
            return (0, position[spec["sharedCounters"][0]["name"]])
        return (1, position[spec["devices"][0]["name"]])

    ordered = sorted(slices, key=first)
    assert _kinds(ordered) == [
        ("counters", 8),
        ("counters", 1),
        ("devices", 64),
        ("devices", 64),
        ("devices", 64),
        ("devices", 42),
    ]
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {6}
    first = ordered[0]["spec"]["sharedCounters"][0]
    assert first == {"name": "gpu-0", "counters": {n: {"value": "1"} for n in SLICES}}
    part = ordered[2]["spec"]["devices"][1]
    assert part["name"] == "gpu-0-part-0"
    assert part["consumesCounters"] == [
        {"counterSet": "gpu-0", "counters": {"memory-slice-0": {"value": "1"}}}
    ]


def test_the_api_server_wants_counter_sets_apart_and_at_most_8(api: Api, node_name: str) -> None:
    """The rules the layout keeps, as Kubernetes v1.36 enforces them."""

    def body(**spec: Any) -> dict[str, Any]:
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": f"rule-{uuid.uuid4().hex[:8]}"},
            "spec": {
                "driver": DRIVER,
                "nodeName": node_name,
                "pool": {"name": node_name, "generation": 1, "resourceSliceCount": 1},
                **spec,
            },
        }

    one = {"name": "gpu-0", "counters": {"memory-slice-0": {"value": "1"}}}
    device = {
        "name": "p",
        "consumesCounters": [
            {"counterSet": "gpu-0", "counters": {"memory-slice-0": {"value": "1"}}}
        ],
    }
    with pytest.raises(ApiError) as err:
        api.call("POST", f"{RESOURCE}/resourceslices", body(sharedCounters=[one], devices=[device]))
    assert err.value.status == 422
    nine = [{**one, "name": f"gpu-{i}"} for i in range(9)]
    with pytest.raises(ApiError) as err:
        api.call("POST", f"{RESOURCE}/resourceslices", body(sharedCounters=nine))
    assert err.value.status == 422
    many = [{**device, "name": f"p-{i}"} for i in range(65)]
    with pytest.raises(ApiError) as err:
        api.call("POST", f"{RESOURCE}/resourceslices", body(devices=many))
    assert err.value.status == 422
    made = api.call("POST", f"{RESOURCE}/resourceslices", body(devices=many[:64]))
    api.call("DELETE", f"{RESOURCE}/resourceslices/{made['metadata']['name']}")


async def test_without_partitionable_devices_in_the_api_server_devices_go_without_counters(
    kdir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    bin_dir = find_binaries(REPO)
    if bin_dir is None:
        pytest.skip("no Kubernetes binaries (see tests/dra/conftest.py)")
    with api_server(bin_dir, "--feature-gates=DRAPartitionableDevices=false") as kubeconfig:
        api = Api(kubeconfig)
        node = f"node-{uuid.uuid4().hex[:8]}"
        api.call("POST", "/api/v1/nodes", {"metadata": {"name": node}})
        devices, sets = partitioned(2, 3)
        with caplog.at_level(logging.WARNING, logger="kubedevice.dra.api.slices"):
            async with server(PartitionedDriver(devices, sets), kdir, kubeconfig, node) as srv:
                await asyncio.wait_for(srv.wait_published(), 30)
                assert srv.publisher is not None
                assert not srv.publisher.counters_supported
                slices = api.slices(DRIVER, node)
    assert _kinds(slices) == [("devices", 8)]
    assert not any(d.get("consumesCounters") for d in slices[0]["spec"]["devices"])
    [warning] = [r.getMessage() for r in caplog.records if "counter" in r.getMessage()]
    assert "DRAPartitionableDevices" in warning


async def test_a_restart_adopts_unchanged_counter_slices_without_writing(
    kdir: Path, kubeconfig: Path, node_name: str, api: Api
) -> None:
    devices, sets = partitioned(9, 25)
    async with server(PartitionedDriver(devices, sets), kdir, kubeconfig, node_name) as srv:
        await asyncio.wait_for(srv.wait_published(), 30)
        assert srv.publisher is not None
        assert srv.publisher.writes == 6
    async with server(PartitionedDriver(devices, sets), kdir, kubeconfig, node_name) as srv:
        await asyncio.wait_for(srv.wait_published(), 30)
        assert srv.publisher is not None
        assert srv.publisher.writes == 0  # the counter sets compare equal as stored
    more = [dra.CounterSet(s.name, {**s.counters, "extra": 1}) for s in sets]
    async with server(PartitionedDriver(devices, more), kdir, kubeconfig, node_name) as srv:
        await asyncio.wait_for(srv.wait_published(), 30)
        assert srv.publisher is not None
        assert srv.publisher.writes == 6  # a counter changed: the pool's generation grows
        [first] = [
            s
            for s in api.slices(DRIVER, node_name)
            if (s["spec"].get("sharedCounters") or [{}])[0].get("name") == "gpu-0"
        ]
        assert first["spec"]["sharedCounters"][0]["counters"]["extra"] == {"value": "1"}

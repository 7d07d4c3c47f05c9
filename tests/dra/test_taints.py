"""Device taints keyed by fault, NoExecute for the faults to evict on, on a real API server."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from dra.api import Api
from dra.fakes import DRIVER, FakeDriver, gpus, server
from kubedevice import dra
from kubedevice.dra.model.taints import TaintPolicy, parse_evict_on
from kubedevice.errors import ConfigError

pytestmark = pytest.mark.timeout(90)

XID = dra.Fault("xid", "79", "XID 79: GPU has fallen off the bus")
LOST = dra.Fault("gpu-lost", "", "GPU lost")


def _bad(name: str, fault: dra.Fault | None) -> dra.Device:
    return dra.Device(name, health=dra.Health.UNHEALTHY, fault=fault)


def test_the_taint_is_keyed_by_the_fault_and_noexecute_only_for_the_faults_named() -> None:
    policy = TaintPolicy("gpu.example.com", ["xid=79", "gpu-lost"])
    assert policy.taints(dra.Device("gpu-0")) == []
    assert policy.taints(_bad("gpu-1", XID)) == [
        {"key": "gpu.example.com/xid", "value": "79", "effect": "NoExecute"}
    ]
    assert policy.taints(_bad("gpu-2", dra.Fault("xid", "13"))) == [
        {"key": "gpu.example.com/xid", "value": "13", "effect": "NoSchedule"}
    ]
    assert policy.taints(_bad("gpu-3", LOST)) == [  # no value: none sent (the API drops "")
        {"key": "gpu.example.com/gpu-lost", "effect": "NoExecute"}
    ]
    assert policy.taints(_bad("gpu-4", None)) == [
        {"key": "gpu.example.com/unhealthy", "value": "Unhealthy", "effect": "NoSchedule"}
    ]
    every = TaintPolicy("gpu.example.com", ["all"])
    assert every.taints(_bad("gpu-4", None))[0]["effect"] == "NoExecute"
    kinds = TaintPolicy("gpu.example.com", ["xid"])  # a kind: every value of it
    assert kinds.taints(_bad("gpu-2", dra.Fault("xid", "13")))[0]["effect"] == "NoExecute"


def test_evict_on_entries_are_checked_and_may_be_comma_separated() -> None:
    assert parse_evict_on(["xid=79,gpu-lost", " all ", ""]) == {"xid=79", "gpu-lost", "all"}
    for bad in ("xid=", "=79", "xid=7 9", "x/y"):
        with pytest.raises(ConfigError, match="--evict-on"):
            parse_evict_on([bad])
    with pytest.raises(ConfigError, match="--evict-on"):
        dra.DriverOptions(node_name="n", evict_on=("xid=",)).resolved(FakeDriver([]))


def _taints(api: Api, node: str) -> dict[str, list[dict]]:
    return {
        d["name"]: [{k: v for k, v in t.items() if k != "timeAdded"} for t in d.get("taints", [])]
        for s in api.slices(DRIVER, node)
        for d in s["spec"]["devices"]
    }


async def test_the_api_server_stores_the_fault_taints_and_they_go_on_recovery(
    kdir: Path, kubeconfig: Path, node_name: str, api: Api
) -> None:
    driver = FakeDriver(gpus(3))
    async with server(driver, kdir, kubeconfig, node_name, evict_on=("xid=79",)) as srv:
        await asyncio.wait_for(srv.wait_published(), 30)
        assert srv.publisher is not None
        driver.snapshots.put_nowait([gpus(3)[0], _bad("gpu-1", XID), _bad("gpu-2", LOST)])
        await asyncio.sleep(0)
        await asyncio.wait_for(srv.wait_published(), 30)
        assert _taints(api, node_name) == {
            "gpu-0": [],
            "gpu-1": [{"key": f"{DRIVER}/xid", "value": "79", "effect": "NoExecute"}],
            "gpu-2": [{"key": f"{DRIVER}/gpu-lost", "effect": "NoSchedule"}],
        }
        writes = srv.publisher.writes
        srv.publisher.request()  # as stored (no value on gpu-lost): nothing to write
        await asyncio.wait_for(srv.publisher.wait_published(), 30)
        assert srv.publisher.writes == writes
        driver.snapshots.put_nowait(gpus(3))  # recovered: the taints go
        await asyncio.sleep(0)
        await asyncio.wait_for(srv.wait_published(), 30)
        assert _taints(api, node_name) == {"gpu-0": [], "gpu-1": [], "gpu-2": []}

"""``status.devices`` of prepared claims, written by server-side apply on a real API server."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest

from dra import clients
from dra.api import Api
from dra.conftest import create_claim, result
from dra.fakes import DRIVER, FakeDriver, server
from kubedevice import dra

pytestmark = pytest.mark.timeout(60)

BASE = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"


def _gpu(i: int, fault: dra.Fault | None = None) -> dra.Device:
    return dra.Device(
        f"gpu-{i}",
        attributes={
            "uuid": f"GPU-0000000{i}",
            "resource.kubernetes.io/pciBusID": f"0000:0{i}:00.0",
        },
        health=dra.Health.UNHEALTHY if fault else dra.Health.HEALTHY,
        fault=fault,
    )


def _conditions(entry: dict[str, Any]) -> dict[str, tuple[str, str, str]]:
    return {c["type"]: (c["status"], c["reason"], c["message"]) for c in entry["conditions"]}


async def test_a_prepared_claim_says_ready_healthy_and_which_device_then_why_not_healthy(
    kdir: Path, kubeconfig: Path, node_name: str, api: Api
) -> None:
    other = "other.example.com"
    claim = create_claim(
        api,
        "default",
        f"st-{node_name}",
        requests=["gpu", "nic"],
        results=[result("gpu", DRIVER, node_name, "gpu-1"), result("nic", other, node_name, "n0")],
    )
    name, uid = claim["metadata"]["name"], claim["metadata"]["uid"]
    # another driver's entry in status.devices: left alone by this driver's writes
    claim["status"]["devices"] = [{"driver": other, "pool": node_name, "device": "n0"}]
    api.call("PUT", f"{BASE}/{name}/status", claim)
    driver = FakeDriver([_gpu(0), _gpu(1)])
    async with server(driver, kdir, kubeconfig, node_name) as srv:
        assert srv.status is not None
        answer = await clients.prepare(
            kdir / "plugins" / DRIVER / "dra.sock", [("default", name, uid)]
        )
        assert answer.claims[uid].error == ""
        await asyncio.wait_for(srv.status.wait_written(uid), 10)
        devices = api.call("GET", f"{BASE}/{name}")["status"]["devices"]
        assert [d["driver"] for d in devices] == [other, DRIVER]
        mine = devices[1]
        assert (mine["pool"], mine["device"]) == (node_name, "gpu-1")
        assert mine["data"] == {"uuid": "GPU-00000001", "pciBusID": "0000:01:00.0"}
        assert _conditions(mine) == {
            "Ready": ("True", "Prepared", f"prepared on node {node_name}"),
            "Healthy": ("True", "Healthy", ""),
        }
        ready_since = {c["type"]: c["lastTransitionTime"] for c in mine["conditions"]}["Ready"]

        # an XID on the prepared GPU: the claim says so, with the reason
        xid = dra.Fault("xid", "79", "XID 79: GPU has fallen off the bus")
        driver.snapshots.put_nowait([_gpu(0), _gpu(1, xid)])
        await asyncio.sleep(0)
        await asyncio.wait_for(srv.wait_published(), 30)
        await asyncio.wait_for(srv.status.wait_written(uid), 10)
        [_, mine] = api.call("GET", f"{BASE}/{name}")["status"]["devices"]
        assert _conditions(mine)["Healthy"] == (
            "False",
            "Xid",
            "XID 79: GPU has fallen off the bus",
        )
        assert {c["type"]: c["lastTransitionTime"] for c in mine["conditions"]}["Ready"] == (
            ready_since
        )
        # a change on a device of no prepared claim writes nothing
        writes = srv.status.writes
        driver.snapshots.put_nowait([_gpu(0, dra.Fault("gpu-lost")), _gpu(1, xid)])
        await asyncio.sleep(0)
        await asyncio.wait_for(srv.wait_published(), 30)
        assert srv.status.writes == writes


async def test_a_claim_gone_before_its_status_is_written_is_dropped_not_retried(
    kdir: Path, kubeconfig: Path, node_name: str, api: Api, caplog: pytest.LogCaptureFixture
) -> None:
    claim = create_claim(
        api, "default", f"gone-{node_name}", results=[result("gpu", DRIVER, node_name, "gpu-0")]
    )
    name, uid = claim["metadata"]["name"], claim["metadata"]["uid"]
    driver = FakeDriver([_gpu(0)])
    async with server(driver, kdir, kubeconfig, node_name) as srv:
        assert srv.status is not None
        sock = kdir / "plugins" / DRIVER / "dra.sock"
        answer = await clients.prepare(sock, [("default", name, uid)])
        assert answer.claims[uid].error == ""
        await asyncio.wait_for(srv.status.wait_written(uid), 10)
        writes = srv.status.writes
        # a prepare again writes nothing: the status is written, the same
        answer = await clients.prepare(sock, [("default", name, uid)])
        assert answer.claims[uid].error == ""
        await asyncio.wait_for(srv.status.wait_written(uid), 10)
        assert srv.status.writes == writes
        api.call("DELETE", f"{BASE}/{name}")
        with caplog.at_level(logging.WARNING, logger="kubedevice.dra.api.status"):
            # its device's health changes: the status would change, the claim is gone
            driver.snapshots.put_nowait([_gpu(0, dra.Fault("gpu-lost"))])
            await asyncio.sleep(0)
            await asyncio.wait_for(srv.wait_published(), 30)
            await asyncio.wait_for(srv.status.wait_written(uid), 10)
        assert srv.status.writes == writes
        # caplog holds every logger's records (a slow machine may add others): this one's
        [line] = [r.getMessage() for r in caplog.records if r.name == "kubedevice.dra.api.status"]
        assert "not written" in line
        assert "404" in line


async def test_a_status_write_waits_until_no_claim_call_is_in_flight(tmp_path: Path) -> None:
    """The apply gives way to the kubelet's calls (they compete for the CPU on a small
    node), and is made once they are over."""
    from kubedevice.dra.api.status import ClaimStatusWriter
    from kubedevice.dra.model.types import ClaimRef, PreparedClaim
    from kubedevice.dra.state.checkpoint import Checkpoint

    events: list[str] = []

    class Kube:
        async def apply_claim_status(self, *args: Any) -> dict[str, Any]:
            events.append("write")
            return {}

    checkpoint = Checkpoint(tmp_path / "c.json", DRIVER)
    ref = ClaimRef("default", "c", "uid-1")
    checkpoint.claims[ref.uid] = PreparedClaim(ref=ref, devices=(("gpu", "node-a", "gpu-0"),))
    writer = ClaimStatusWriter(Kube(), DRIVER, "node-a", checkpoint, dict)  # type: ignore[arg-type]
    task = asyncio.create_task(writer.run())
    try:
        writer.call_started()  # a call in flight (another claim's)
        writer.prepared([ref.uid])
        for _ in range(20):  # the writer's turns: it would have written by now
            await asyncio.sleep(0)
        events.append("call ended")
        writer.call_ended()
        await asyncio.wait_for(writer.wait_written(ref.uid), 10)
        assert events == ["call ended", "write"]
    finally:
        task.cancel()

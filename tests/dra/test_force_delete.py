"""A pod force-deleted (grace 0): the scheduler gives its device to the next claim before the
kubelet has unprepared the old claim. The next prepare waits for that unprepare (within its
deadline) instead of failing, when the API server no longer gives the device to the old
claim; a claim the API server still gives it to is refused at once, as before."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from dra import clients
from dra.api import Api, ApiError
from dra.conftest import create_claim, result
from dra.fakes import DRIVER, FakeDriver, gpus, server

pytestmark = pytest.mark.timeout(60)

NS = "default"
BASE = f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims"


def _pod() -> list[dict[str, Any]]:
    return [{"resource": "pods", "name": "p", "uid": str(uuid.uuid4())}]


def _claim(api: Api, name: str, node: str) -> tuple[str, str, str]:
    """A claim allocated gpu-0 and reserved for a (live) pod."""
    claim = create_claim(
        api, NS, name, results=[result("gpu", DRIVER, node, "gpu-0")], reserved_for=_pod()
    )
    return (NS, name, claim["metadata"]["uid"])


def _deallocate(api: Api, name: str) -> None:
    """Clear the claim's status, as the claim controller does when its pod is gone (the
    driver may write the status meanwhile: the write is retried on a conflict)."""
    for _ in range(10):
        obj = api.call("GET", f"{BASE}/{name}")
        obj["status"] = {}
        try:
            api.call("PUT", f"{BASE}/{name}/status", obj)
            return
        except ApiError as exc:
            if exc.status != 409:
                raise
    raise AssertionError(f"claim {name}: its status could not be cleared")


async def _still_waiting(call: asyncio.Future[Any], seconds: float = 0.3) -> bool:
    done, _ = await asyncio.wait({call}, timeout=seconds)
    return not done


@pytest.mark.parametrize("how", ["deleted", "deallocated"])
async def test_the_next_claim_of_a_device_waits_for_the_old_claims_unprepare(
    kdir: Path, kubeconfig: Path, node_name: str, api: Api, how: str
) -> None:
    old = _claim(api, f"old-{node_name}", node_name)
    driver = FakeDriver(gpus(1))
    async with server(driver, kdir, kubeconfig, node_name) as srv:
        sock = srv.settings.dra_socket
        assert (await clients.prepare(sock, [old])).claims[old[2]].error == ""
        # the pod is force-deleted: the claim goes (or loses its allocation and its pod) ...
        if how == "deleted":
            api.call("DELETE", f"{BASE}/{old[1]}")
        else:
            _deallocate(api, old[1])
        # ... and the scheduler gives the GPU to the next pod's claim at once
        new = _claim(api, f"new-{node_name}", node_name)
        preparing = asyncio.ensure_future(clients.prepare(sock, [new], timeout=10))
        assert await _still_waiting(preparing), (
            f"the prepare did not wait: {(await preparing).claims[new[2]].error}"
        )
        # the kubelet unprepares the old claim a moment later
        assert (await clients.unprepare(sock, [old])).claims[old[2]].error == ""
        unprepared = time.monotonic()
        answer = (await preparing).claims[new[2]]
        waited = time.monotonic() - unprepared
        assert answer.error == ""
        assert [d.device_name for d in answer.devices] == ["gpu-0"]
        assert waited < 1.0
        assert [c.ref.uid for c in driver.prepared] == [old[2], new[2]]
        assert srv.claims is not None
        assert srv.claims.releases._waiting == {}


async def test_a_device_the_api_server_still_gives_the_old_claim_is_refused_at_once(
    kdir: Path, kubeconfig: Path, node_name: str, api: Api
) -> None:
    old = _claim(api, f"live-{node_name}", node_name)
    new = _claim(api, f"twin-{node_name}", node_name)  # the same GPU, written by hand
    async with server(FakeDriver(gpus(1)), kdir, kubeconfig, node_name) as srv:
        sock = srv.settings.dra_socket
        assert (await clients.prepare(sock, [old])).claims[old[2]].error == ""
        started = time.monotonic()
        error = (await clients.prepare(sock, [new], timeout=20)).claims[new[2]].error
        assert time.monotonic() - started < 5
        assert f"is already prepared for claim {NS}/{old[1]}" in error


async def test_the_wait_ends_before_the_calls_deadline(
    kdir: Path, kubeconfig: Path, node_name: str, api: Api
) -> None:
    """The old claim is gone from the API server but never unprepared: the prepare answers
    the refusal before the kubelet's deadline, not DEADLINE_EXCEEDED."""
    old = _claim(api, f"stuck-{node_name}", node_name)
    async with server(FakeDriver(gpus(1)), kdir, kubeconfig, node_name) as srv:
        sock = srv.settings.dra_socket
        assert (await clients.prepare(sock, [old])).claims[old[2]].error == ""
        api.call("DELETE", f"{BASE}/{old[1]}")
        new = _claim(api, f"after-{node_name}", node_name)
        started = time.monotonic()
        error = (await clients.prepare(sock, [new], timeout=2.5)).claims[new[2]].error
        assert 1.0 < time.monotonic() - started < 2.5  # it waited, and answered in time
        assert f"is already prepared for claim {NS}/{old[1]}" in error

"""Consumable capacity in the kit: request policies checked as the API server checks them,
shared devices published (or published unshared where the API server drops the fields),
and the claim path per share: consumed capacity and share ID to the hook, one CDI device
and one checkpoint entry per share, unpreparing one share leaves the other."""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from pathlib import Path
from typing import Any

import pytest
from e2e.cluster import find_binaries

import kubedevice.dra as dra
from dra import clients
from dra.api import RESOURCE, Api, ApiError
from dra.conftest import REPO, api_server, result
from dra.fakes import DRIVER, FakeDriver, gpus, server
from kubedevice.dra.model.capacity import RequestPolicy, quantity_value
from kubedevice.dra.state.checkpoint import Checkpoint
from kubedevice.errors import ConfigError
from kubedevice.nvidia.dra.shares import share_bytes

pytestmark = pytest.mark.timeout(90)

NS = "default"

# ---- request policies: the kit's verdict is the API server's --------------------------

#: (policy, capacity value, the field the kit's error names, or None when valid)
POLICIES: list[tuple[RequestPolicy, str, str | None]] = [
    (RequestPolicy(default="80Gi", min="1Gi", step="1Gi"), "80Gi", None),
    (RequestPolicy(default="4Gi", min="1Gi", max="8Gi", step="1Gi"), "80Gi", None),
    (RequestPolicy(default="1", valid_values=["1", "2", "4"]), "4", None),
    (RequestPolicy(default="1"), "4", None),
    (RequestPolicy(default="1", min="1", step="1"), "3", None),
    (RequestPolicy(min="1Gi"), "80Gi", "requestPolicy.default"),
    (RequestPolicy(default="1", valid_values=["1"], min="1"), "4", "requestPolicy: validValues"),
    (RequestPolicy(default="3", valid_values=["1", "2"]), "4", "requestPolicy.default"),
    (RequestPolicy(default="1", valid_values=["2", "1"]), "4", "requestPolicy.validValues[1]"),
    (RequestPolicy(default="1", valid_values=["1", "8"]), "4", "requestPolicy.validValues[1]"),
    (
        RequestPolicy(default="1", valid_values=[str(i) for i in range(1, 12)]),
        "20",
        "requestPolicy.validValues",
    ),
    (RequestPolicy(default="2", max="4", step="1"), "4", "requestPolicy.validRange.min"),
    (RequestPolicy(default="90Gi", min="90Gi"), "80Gi", "requestPolicy.validRange.min"),
    (RequestPolicy(default="1Gi", min="2Gi"), "80Gi", "requestPolicy.default"),
    (RequestPolicy(default="2Gi", min="2Gi", max="1Gi"), "80Gi", "requestPolicy.validRange.max"),
    (RequestPolicy(default="1Gi", min="1Gi", max="90Gi"), "80Gi", "requestPolicy.validRange.max"),
    (RequestPolicy(default="9Gi", min="1Gi", max="8Gi"), "80Gi", "requestPolicy.default"),
    (RequestPolicy(default="1Gi", min="1Gi", step="80Gi"), "80Gi", "requestPolicy.validRange.step"),
    (RequestPolicy(default="1536Mi", min="1Gi", step="1Gi"), "80Gi", "requestPolicy.default"),
    (
        RequestPolicy(default="1Gi", min="1Gi", max="1536Mi", step="1Gi"),
        "80Gi",
        "requestPolicy.validRange.max",
    ),
]


def _device(policy: RequestPolicy, value: str) -> dra.Device:
    return dra.Device(
        name="shared-0",
        capacity={"memory": value},
        allow_multiple_allocations=True,
        request_policies={"memory": policy},
    )


@pytest.mark.parametrize(("policy", "value", "error"), POLICIES)
def test_the_kit_refuses_a_bad_policy_naming_device_and_field(
    policy: RequestPolicy, value: str, error: str | None
) -> None:
    if error is None:
        _device(policy, value)
        return
    with pytest.raises(ConfigError) as caught:
        _device(policy, value)
    assert str(caught.value).startswith(f"device shared-0: capacity memory: {error}"), caught.value


def test_a_policy_needs_multiple_allocations_and_a_capacity_of_that_name() -> None:
    policy = RequestPolicy(default="1")
    with pytest.raises(ConfigError, match="device g: capacity memory: a requestPolicy needs"):
        dra.Device(name="g", capacity={"memory": "1"}, request_policies={"memory": policy})
    with pytest.raises(ConfigError, match="device g: requestPolicy for capacity 'cores'"):
        dra.Device(
            name="g",
            capacity={"memory": "1"},
            allow_multiple_allocations=True,
            request_policies={"cores": policy},
        )
    with pytest.raises(ConfigError, match="'1Zi' is not a Kubernetes quantity"):
        RequestPolicy(default="1Zi")


@pytest.mark.parametrize(
    ("text", "value"),
    [("80Gi", 80 * 2**30), ("1.5k", 1500), ("2e3", 2000), ("500m", 0.5), (8, 8), ("1Ei", 2**60)],
)
def test_quantities_are_compared_exactly(text: str | int, value: float) -> None:
    assert quantity_value(text) == value


@pytest.mark.timeout(10)
@pytest.mark.parametrize("text", ["1e999999999", "9" * 5000, "0." + "0" * 5000 + "1", "1e65"])
def test_a_quantity_too_large_to_compute_is_refused_in_one_line(text: str) -> None:
    """Not a ValueError from int() past 4300 digits, nor minutes of CPU and gigabytes
    computing 10**999999999 exactly (a memory share, a capacity in a driver's config)."""
    with pytest.raises(ConfigError, match=r"is out of range for a Kubernetes quantity$"):
        quantity_value(text)
    allocated = dra.AllocatedDevice(
        "gpu", "n", "gpu-0", None, share_id="0a0a0a0a-0000-4000-8000-000000000000",
        consumed_capacity={"memory": text},
    )  # fmt: skip
    assert share_bytes(allocated) is None  # the share's size is unknown: logged


def test_the_api_server_agrees_with_every_verdict(api: Api, node_name: str) -> None:
    """Each policy above sent to the real API server (dry run): accepted exactly when the
    kit accepts it. This is what keeps the kit's rules the API server's."""
    from kubedevice.dra.api.slices import device_object

    for policy, value, error in POLICIES:
        device = {
            "name": "shared-0",
            "allowMultipleAllocations": True,
            "capacity": {"memory": {"value": value, "requestPolicy": policy.to_json()}},
        }
        body = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": f"policy-{uuid.uuid4().hex[:8]}"},
            "spec": {
                "driver": DRIVER,
                "nodeName": node_name,
                "pool": {"name": node_name, "generation": 1, "resourceSliceCount": 1},
                "devices": [device],
            },
        }
        status = 201
        try:
            api.call("POST", f"{RESOURCE}/resourceslices", body, dryRun="All")
        except ApiError as exc:
            status = exc.status
        assert status in (201, 422), status
        accepted = status == 201
        assert accepted is (error is None), (policy, value, error)
        if error is None:  # and the kit writes exactly that device
            assert device_object(_device(policy, value)) == device


# ---- publishing ---------------------------------------------------------------------------


async def test_shared_devices_are_published_with_their_policies_and_left_alone(
    kdir: Path, kubeconfig: Path, node_name: str, api: Api
) -> None:
    async with server(FakeDriver(gpus(2, shared=True)), kdir, kubeconfig, node_name) as srv:
        await asyncio.wait_for(srv.wait_published(), 30)
        [piece] = api.slices(DRIVER, node_name)
        device = piece["spec"]["devices"][0]
        assert device["allowMultipleAllocations"] is True
        assert device["capacity"]["memory"] == {
            "value": "80Gi",
            "requestPolicy": {"default": "80Gi", "validRange": {"min": "1Gi", "step": "1Gi"}},
        }
        assert srv.publisher is not None
        writes = srv.publisher.writes
        await srv.publisher.reconcile(gpus(2, shared=True))
        assert srv.publisher.writes == writes  # what came back is what was sent: no rewrite
        assert srv.publisher.shares_supported


async def test_where_the_api_server_drops_sharing_devices_are_published_unshared(
    kdir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    bin_dir = find_binaries(REPO)
    if bin_dir is None:
        pytest.skip("no Kubernetes binaries (see tests/dra/conftest.py)")
    with api_server(bin_dir, "--feature-gates=DRAConsumableCapacity=false") as kubeconfig:
        api = Api(kubeconfig)
        node = f"node-{uuid.uuid4().hex[:8]}"
        api.call("POST", "/api/v1/nodes", {"metadata": {"name": node}})
        driver = FakeDriver(gpus(2, shared=True))
        with caplog.at_level(logging.WARNING, logger="kubedevice.dra.api.slices"):
            async with server(driver, kdir, kubeconfig, node) as srv:
                await asyncio.wait_for(srv.wait_published(), 30)
                assert srv.publisher is not None
                assert not srv.publisher.shares_supported
                writes = srv.publisher.writes
                await srv.publisher.reconcile(gpus(2, shared=True))
                assert srv.publisher.writes == writes  # settled: unshared is what is kept
                [piece] = api.slices(DRIVER, node)
                for device in piece["spec"]["devices"]:
                    assert "allowMultipleAllocations" not in device
                    assert device["capacity"]["memory"] == {"value": "80Gi"}
        warnings = [r.getMessage() for r in caplog.records if "allowMultiple" in r.getMessage()]
        assert len(warnings) == 1, warnings
        assert "DRAConsumableCapacity" in warnings[0]
        assert "unshared" in warnings[0]


# ---- the claim path, per share ----------------------------------------------------------


class _PerShare(FakeDriver):
    """Tells each share its memory in env, as a driver for shared devices would."""

    async def prepare(self, claim: dra.Claim) -> list[dra.PreparedDevice]:
        self.prepared.append(claim)
        return [
            dra.PreparedDevice(
                d,
                dra.ContainerEdits(env={"SHARE_MEMORY": d.consumed_capacity.get("memory", "")}),
                data={"share": d.share_id},
            )
            for d in claim.devices
        ]


def _claim(api: Api, name: str, results: list[dict[str, Any]]) -> tuple[str, str, str]:
    base = f"{RESOURCE}/namespaces/{NS}/resourceclaims"
    requests = [
        {"name": r, "exactly": {"deviceClassName": "example"}}
        for r in dict.fromkeys(x["request"] for x in results)
    ]
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"devices": {"requests": requests}},
    }
    claim = api.call("POST", base, body)
    claim["status"] = {"allocation": {"devices": {"results": results}}}
    claim = api.call("PUT", f"{base}/{name}/status", claim)
    assert claim["status"]["allocation"]["devices"]["results"] == results  # none dropped
    return (NS, name, claim["metadata"]["uid"])


def _checkpoint(kdir: Path) -> Checkpoint:
    saved = Checkpoint(kdir / "plugins" / DRIVER / "checkpoint.json", DRIVER)
    saved.load()
    return saved


def _share(node: str, share: str, memory: str) -> dict[str, Any]:
    return {
        **result("gpu", DRIVER, node, "gpu-0"),
        "shareID": share,
        "consumedCapacity": {"memory": memory},
    }


async def test_two_shares_of_one_device_are_prepared_apart_and_unprepared_apart(
    kdir: Path, kubeconfig: Path, node_name: str, api: Api
) -> None:
    s1, s2 = str(uuid.uuid4()), str(uuid.uuid4())
    one = _claim(api, f"s1-{node_name}", [_share(node_name, s1, "20Gi")])
    two = _claim(api, f"s2-{node_name}", [_share(node_name, s2, "60Gi")])
    sock = kdir / "plugins" / DRIVER / "dra.sock"
    driver = _PerShare(gpus(1, shared=True))
    async with server(driver, kdir, kubeconfig, node_name):
        answers = (await clients.prepare(sock, [one, two])).claims
    assert [answers[r[2]].error for r in (one, two)] == ["", ""]
    seen = {c.ref.uid: c.devices[0] for c in driver.prepared}
    assert (seen[one[2]].share_id, dict(seen[one[2]].consumed_capacity)) == (s1, {"memory": "20Gi"})
    assert (seen[two[2]].share_id, dict(seen[two[2]].consumed_capacity)) == (s2, {"memory": "60Gi"})
    ids = {}
    for ref, share, memory in ((one, s1, "20Gi"), (two, s2, "60Gi")):
        [device] = answers[ref[2]].devices
        assert device.share_id == share  # the kubelet gets the share back
        [cdi_id] = device.cdi_device_ids
        assert cdi_id == f"k8s.{DRIVER}/claim={ref[2]}-gpu-0-{share}"
        ids[ref[2]] = cdi_id
        spec = json.loads((kdir / "cdi" / f"k8s.{DRIVER}-claim_{ref[2]}.json").read_text())
        assert spec["devices"] == [
            {
                "name": f"{ref[2]}-gpu-0-{share}",
                "containerEdits": {"env": [f"SHARE_MEMORY={memory}"]},
            }
        ]
    saved = _checkpoint(kdir)
    assert {u: c.share_ids for u, c in saved.claims.items()} == {one[2]: (s1,), two[2]: (s2,)}

    # a restart restores both shares from the checkpoint; unpreparing one leaves the other
    driver = _PerShare(gpus(1, shared=True))
    async with server(driver, kdir, kubeconfig, node_name):
        again = (await clients.prepare(sock, [two])).claims[two[2]]
        assert list(again.devices[0].cdi_device_ids) == [ids[two[2]]]
        assert driver.prepared == []  # answered from the checkpoint
        assert (await clients.unprepare(sock, [one])).claims[one[2]].error == ""
        assert [c.share_ids for c in driver.unprepared] == [(s1,)]
        assert not (kdir / "cdi" / f"k8s.{DRIVER}-claim_{one[2]}.json").exists()
        assert (kdir / "cdi" / f"k8s.{DRIVER}-claim_{two[2]}.json").exists()
        saved = _checkpoint(kdir)
        assert list(saved.claims) == [two[2]]
        assert (await clients.unprepare(sock, [two])).claims[two[2]].error == ""
    assert [c.share_ids for c in driver.unprepared] == [(s1,), (s2,)]


def test_consumed_capacity_that_is_not_a_map_is_a_clear_claim_error() -> None:
    from kubedevice.dra.api.claims import claim_from_object
    from kubedevice.errors import ClaimError

    ref = dra.ClaimRef("ns", "c", "u1")
    bad = {**result("gpu", DRIVER, "n", "gpu-0"), "consumedCapacity": ["20Gi"]}
    obj = {
        "metadata": {"uid": "u1"},
        "status": {"allocation": {"devices": {"results": [bad]}}},
    }
    with pytest.raises(ClaimError, match=r"results\[0\]\.consumedCapacity is not a map"):
        claim_from_object(ref, obj, driver_name=DRIVER, pool="n", devices={})


def test_a_policy_is_written_as_the_api_server_writes_it_back() -> None:
    policy = RequestPolicy(default="81920Mi", min="1024Mi", step="1024Mi")
    assert policy.to_json() == {
        "default": "80Gi",
        "validRange": {"min": "1Gi", "step": "1Gi"},
    }

"""claim_from_object on what the API server would store and on what it should not."""

from __future__ import annotations

from typing import Any

import pytest

import kubedevice.dra as dra
from kubedevice.dra.api.claims import MAX_OPAQUE_BYTES, MAX_RESULTS, claim_from_object

DRIVER = "gpu.test.kubedevice.io"
REF = dra.ClaimRef(namespace="ns", name="c", uid="uid-1")
DEVICES = {"gpu-0": dra.Device("gpu-0")}


def _claim(results: list[dict[str, Any]], config: list[dict[str, Any]] | None = None) -> dict:
    return {
        "metadata": {"uid": "uid-1"},
        "status": {"allocation": {"devices": {"results": results, "config": config or []}}},
    }


def _result(device: str = "gpu-0", request: str = "gpu") -> dict[str, Any]:
    return {"request": request, "driver": DRIVER, "pool": "node-a", "device": device}


def _build(obj: dict) -> dra.Claim:
    return claim_from_object(REF, obj, driver_name=DRIVER, pool="node-a", devices=DEVICES)


def test_devices_of_this_driver_and_pool_with_their_published_device() -> None:
    claim = _build(
        _claim(
            [
                _result("gpu-0"),
                {**_result("gpu-9"), "adminAccess": True, "shareID": "s-1"},
                {**_result("gpu-1"), "driver": "other.io"},
                {**_result("gpu-2"), "pool": "node-b"},
            ]
        )
    )
    assert [(d.name, d.device is not None, d.admin_access, d.share_id) for d in claim.devices] == [
        ("gpu-0", True, False, None),
        ("gpu-9", False, True, "s-1"),
    ]


def test_subrequest_gets_the_configs_of_its_request() -> None:
    config = [
        {
            "source": "FromClaim",
            "requests": ["gpu"],
            "opaque": {"driver": DRIVER, "parameters": {"x": 1}},
        }
    ]
    claim = _build(_claim([_result(request="gpu/small")], config))
    assert [c.parameters for c in claim.devices[0].configs] == [{"x": 1}]


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        ({"metadata": {"uid": "other"}}, "has UID other, not uid-1"),
        ({"metadata": {"uid": "uid-1"}, "status": {}}, "is not allocated"),
        (_claim([_result()] * (MAX_RESULTS * 20)), f"has {MAX_RESULTS * 20} allocation results"),
        (_claim([{"driver": DRIVER, "pool": "node-a", "device": "gpu-0"}]), "results[0].request"),
        (
            _claim(
                [_result()],
                [{"opaque": {"driver": DRIVER, "parameters": "{not json"}}],
            ),
            "config[0].opaque.parameters is not JSON",
        ),
        (
            _claim([_result()], [{"opaque": {"driver": DRIVER, "parameters": [1, 2]}}]),
            "config[0].opaque.parameters must be a JSON object",
        ),
        (
            _claim(
                [_result()],
                [{"opaque": {"driver": DRIVER, "parameters": {"x": "y" * MAX_OPAQUE_BYTES}}}],
            ),
            f"at most {MAX_OPAQUE_BYTES}",
        ),
        (
            _claim(
                [_result()], [{"requests": "gpu", "opaque": {"driver": DRIVER, "parameters": {}}}]
            ),
            "config[0].requests must be a list",
        ),
        (
            {"metadata": {"uid": "uid-1"}, "status": {"allocation": {"devices": []}}},
            "not an object",
        ),
    ],
    ids=[
        "uid",
        "unallocated",
        "thousands-of-results",
        "no-request",
        "not-json",
        "not-object",
        "too-large",
        "requests-not-list",
        "devices-not-object",
    ],
)
def test_bad_claims_are_one_clear_line(obj: dict, message: str) -> None:
    with pytest.raises(dra.ClaimError) as err:
        _build(obj)
    assert message in str(err.value)
    assert "\n" not in str(err.value)

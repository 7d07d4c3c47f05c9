"""Unit tests of the conformance kit's pure checks (kubedevice.conformance.validate)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from kubedevice.conformance.validate import (
    allocate_response_problems,
    device_list_problems,
    endpoint_problems,
    preferred_problems,
    resource_name_problems,
)
from kubedevice.kubelet import AllocateResult, ContainerAllocation, DeviceSpec, Mount


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("example.com/gpu", True),
        ("nvidia.com/GPU", True),
        ("a.b-c.io/x_y.z", True),
        ("Example.com/gpu", False),
        ("gpu", False),
        ("a/b/c", False),
        ("kubernetes.io/foo", False),
        ("foo.kubernetes.io/x", False),
        ("requests.example.com/x", False),
        ("example.com/-x", False),
        ("example.com/", False),
        ("example.com/" + "x" * 64, False),
    ],
)
def test_resource_names(name: str, ok: bool) -> None:
    assert (resource_name_problems(name) == []) is ok


def test_endpoint_must_be_a_bare_socket_name(sock_dir: Path) -> None:
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(str(sock_dir / "p.sock"))
    (sock_dir / "file").write_text("x")
    try:
        assert endpoint_problems("p.sock", sock_dir) == []
        assert "is a path" in endpoint_problems(str(sock_dir / "p.sock"), sock_dir)[0]
        assert "is a path" in endpoint_problems("sub/p.sock", sock_dir)[0]
        assert "does not exist" in endpoint_problems("nope.sock", sock_dir)[0]
        assert "not a Unix socket" in endpoint_problems("file", sock_dir)[0]
        assert endpoint_problems("", sock_dir) == ["endpoint is empty"]
    finally:
        srv.close()


def test_device_list_problems() -> None:
    assert device_list_problems([("a", "Healthy"), ("b", "Unhealthy")]) == []
    assert "duplicate" in device_list_problems([("a", "Healthy"), ("a", "Healthy")])[0]
    assert "'healthy'" in device_list_problems([("a", "healthy")])[0]
    assert "empty ID" in device_list_problems([("", "Healthy")])[0]
    assert "> 63" in device_list_problems([("x" * 64, "Healthy")])[0]
    assert "whitespace" in device_list_problems([("a b", "Healthy")])[0]


def _alloc(**kw: object) -> AllocateResult:
    return AllocateResult((ContainerAllocation(**kw),))  # type: ignore[arg-type]


def test_allocate_response_problems() -> None:
    good = _alloc(
        envs={"A": "1"},
        devices=(DeviceSpec("/dev/x", "/dev/x", "rw"),),
        mounts=(Mount("/opt", "/tmp", True),),
        cdi_devices=("vendor.com/class=dev0",),
    )
    assert allocate_response_problems(good) == []
    assert "0 container_responses" in allocate_response_problems(AllocateResult(()))[0]
    two = AllocateResult((ContainerAllocation(), ContainerAllocation()))
    assert "2 container_responses" in allocate_response_problems(two)[0]
    rel = _alloc(devices=(DeviceSpec("dev/x", "/dev/x", "rw"),))
    assert "absolute" in allocate_response_problems(rel)[0]
    for perms in ("", "rwx", "rr"):
        bad = _alloc(devices=(DeviceSpec("/dev/x", "/dev/x", perms),))
        assert "permissions" in allocate_response_problems(bad)[0]
    assert "Mount" in allocate_response_problems(_alloc(mounts=(Mount("opt", "/tmp"),)))[0]
    assert "env name" in allocate_response_problems(_alloc(envs={"A=B": "1"}))[0]
    assert "CDI" in allocate_response_problems(_alloc(cdi_devices=("dev0",)))[0]


def test_preferred_problems() -> None:
    avail = ["a", "b", "c"]
    assert preferred_problems(avail, ["c"], 2, ["c", "a"]) == []
    assert "must-include" in preferred_problems(avail, ["c"], 2, ["a", "b"])[0]
    assert "not offered" in preferred_problems(avail, [], 1, ["z"])[0]
    assert "allocation_size" in preferred_problems(avail, [], 2, ["a"])[0]
    assert "repeats" in preferred_problems(avail, [], 2, ["a", "a"])[0]
    # Not enough candidates: a short answer is fine.
    assert preferred_problems(["a"], [], 2, ["a"]) == []

"""The device model refuses what the API server would refuse, with one line naming it."""

from __future__ import annotations

from typing import Any

import pytest

import kubedevice.dra as dra
from kubedevice.errors import ConfigError


def test_a_device_with_every_kind_of_value() -> None:
    device = dra.Device(
        "gpu-0",
        attributes={
            "index": 0,
            "mig": False,
            "model": "H100",
            "cuda": dra.Version("12.4.0"),
            "resource.kubernetes.io/pcieRoot": "pci0000:00",
        },
        capacity={"memory": "80Gi", "cores": 132, "bw": dra.Quantity("3350G")},
    )
    assert device.attributes["mig"] is False
    assert {k: str(v) for k, v in device.capacity.items()} == {
        "memory": "80Gi",
        "cores": "132",
        "bw": "3350G",
    }
    assert device.health == dra.Health.HEALTHY
    assert not device.edits


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "GPU_0"}, "device name 'GPU_0' is not a DNS label"),
        ({"name": "g" * 64}, "is not a DNS label"),
        ({"attributes": {"bad-name": 1}}, "attribute name 'bad-name' must be a C identifier"),
        ({"attributes": {"Bad_Domain/x": 1}}, "attribute name 'Bad_Domain/x'"),
        ({"attributes": {"x" * 33: 1}}, "must be a C identifier of at most 32"),
        ({"attributes": {"s": "x" * 65}}, "attribute s: a string is at most 64"),
        ({"attributes": {"f": 1.5}}, "attribute f: float is not str, int, bool or Version"),
        ({"attributes": {"big": 2**63}}, "is not a 64-bit integer"),
        ({"capacity": {"memory": "80 GiB"}}, "capacity memory: capacity '80 GiB' is not"),
        ({"capacity": {"on": True}}, "capacity on: capacity True is not"),
        (
            {
                "attributes": {f"a{i}": i for i in range(20)},
                "capacity": {f"c{i}": 1 for i in range(13)},
            },
            "more than 32 attributes and capacities",
        ),
    ],
    ids=[
        "name-case",
        "name-long",
        "attr-name",
        "attr-domain",
        "attr-long-name",
        "string-long",
        "float",
        "int64",
        "quantity",
        "quantity-bool",
        "too-many",
    ],
)
def test_bad_devices(kwargs: dict[str, Any], message: str) -> None:
    kwargs.setdefault("name", "gpu-0")
    with pytest.raises(ConfigError) as err:
        dra.Device(**kwargs)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("text", ["1.2", "v1.2.3", "01.2.3", "1.2.3-", ""])
def test_versions_are_semver(text: str) -> None:
    with pytest.raises(ConfigError, match="not a semantic version"):
        dra.Version(text)


@pytest.mark.parametrize("text", ["1.2.3", "0.0.0-rc.1+build.5", "12.4.0"])
def test_good_versions(text: str) -> None:
    assert str(dra.Version(text)) == text


def test_edits_are_checked() -> None:
    with pytest.raises(ConfigError, match="must be an absolute path"):
        dra.DeviceNode("dev/x")
    with pytest.raises(ConfigError, match="only r, w and m"):
        dra.DeviceNode("/dev/x", permissions="rwx")
    with pytest.raises(ConfigError, match="must be absolute"):
        dra.Mount(container_path="b", host_path="/a")


def test_mount_refuses_positional_arguments_never_swaps_them() -> None:
    # the old order was (host_path, container_path); DeviceNode and kubedevice.Mount take
    # the container path first: a positional call is refused, whichever order was meant
    with pytest.raises(TypeError, match="keyword arguments only"):
        dra.Mount("/srv/data", "/data")  # type: ignore[misc]
    with pytest.raises(TypeError, match="keyword arguments only"):
        dra.Mount(container_path="/data")
    mount = dra.Mount(container_path="/data", host_path="/srv/data", read_only=False)
    assert (mount.container_path, mount.host_path, mount.read_only) == ("/data", "/srv/data", False)
    with pytest.raises(ConfigError, match="contains '='"):
        dra.ContainerEdits(env={"A=B": "c"})

"""The public value types and the public namespace."""

from __future__ import annotations

import dataclasses

import pytest

import kubedevice


def test_all_is_complete_and_sorted() -> None:
    public = {n for n in dir(kubedevice) if not n.startswith("_")} | {
        "__version__",
        "PluginMetrics",
    }
    public -= {"annotations", "TYPE_CHECKING", "Any", "errors", "plugin", "log", "_api"}
    modules = {n for n in public if type(getattr(kubedevice, n)).__name__ == "module"}
    assert set(kubedevice.__all__) == public - modules
    key = [(0 if n.isupper() else 1 if n[0].isupper() else 2, n) for n in kubedevice.__all__]
    assert key == sorted(key)
    for name in kubedevice.__all__:
        assert getattr(kubedevice, name) is not None


def test_device_normalises_and_is_frozen() -> None:
    dev = kubedevice.Device(id="a", health="Unhealthy", numa_nodes=[1], envs={"K": "v"})  # type: ignore[arg-type]
    assert dev.health is kubedevice.Health.UNHEALTHY
    assert dev.numa_nodes == (1,)
    assert not dev.healthy
    with pytest.raises(dataclasses.FrozenInstanceError):
        dev.id = "b"  # type: ignore[misc]
    with pytest.raises(TypeError):
        dev.envs["K"] = "w"  # type: ignore[index]
    assert hash(dev) == hash(
        kubedevice.Device(
            id="a", health=kubedevice.Health.UNHEALTHY, numa_nodes=(1,), envs={"K": "v"}
        )
    )


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"id": ""}, "non-empty"),
        ({"id": "x" * 64}, "maximum is 63"),
        ({"id": "a", "health": "healthy"}, "'Healthy' or 'Unhealthy'"),
        ({"id": "a", "numa_nodes": (-1,)}, "NUMA"),
        ({"id": "a", "envs": {"K": 1}}, "str to str"),
        ({"id": "a", "cdi_devices": "vendor.com/x=y"}, "not a string"),
    ],
)
def test_device_rejects_bad_values(kwargs: dict[str, object], needle: str) -> None:
    with pytest.raises(kubedevice.ConfigError, match=needle):
        kubedevice.Device(**kwargs)  # type: ignore[arg-type]


def test_device_spec_permissions() -> None:
    assert kubedevice.DeviceSpec("/dev/a", "/dev/a", "rwm").permissions == "rwm"
    with pytest.raises(kubedevice.ConfigError, match="permissions"):
        kubedevice.DeviceSpec("/dev/a", "/dev/a", "x")


def test_merge_dedups_and_joins() -> None:
    spec = kubedevice.DeviceSpec("/dev/a", "/dev/a")
    a = kubedevice.Device(id="a", device_specs=(spec,), envs={"V": "a", "S": "1"})
    b = kubedevice.Device(id="b", device_specs=(spec,), envs={"V": "b", "S": "1"})
    merged = kubedevice.ContainerAllocation.merge([a, b])
    assert merged.device_specs == (spec,)
    assert dict(merged.envs) == {"V": "a,b", "S": "1"}


def test_options_from_overrides() -> None:
    class Plain(kubedevice.DevicePlugin):
        resource_name = "example.com/a"

    class Advertised(Plain):
        advertise_preferred_allocation = True

    assert Plain().options() == kubedevice.PluginOptions(False, False)
    assert Advertised().options() == kubedevice.PluginOptions(False, True)
    assert repr(kubedevice.DEFAULT) == "kubedevice.DEFAULT"

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


@pytest.mark.parametrize(
    "node", [2**63, 10**20, 10**5000, -(10**5000)], ids=["2^63", "10^20", "10^5000", "-10^5000"]
)
def test_numa_node_out_of_the_wire_range_is_one_clear_error(node: int) -> None:
    with pytest.raises(kubedevice.ConfigError) as err:
        kubedevice.Device(id="a", numa_nodes=(node,))
    text = str(err.value)
    assert text.startswith("device 'a': NUMA node ")
    assert "out of range: the wire carries 0 to 9223372036854775807 (int64)" in text
    assert "set_int_max_str_digits" not in text
    assert len(text) < 200


def test_largest_numa_node_on_the_wire_is_accepted() -> None:
    from kubedevice.plugin.servicer import encode_devices

    dev = kubedevice.Device(id="a", numa_nodes=(2**63 - 1,))
    assert encode_devices([dev])


def test_constructors_take_any_sequence_and_store_tuples() -> None:
    spec = kubedevice.DeviceSpec("/dev/x", "/dev/null")
    mount = kubedevice.Mount("/m", "/tmp")
    dev = kubedevice.Device(
        id="a", numa_nodes=[0], device_specs=[spec], mounts=[mount], cdi_devices=["v.com/c=x"]
    )
    assert (dev.numa_nodes, dev.device_specs, dev.mounts, dev.cdi_devices) == (
        (0,),
        (spec,),
        (mount,),
        ("v.com/c=x",),
    )
    alloc = kubedevice.ContainerAllocation(device_specs=[spec], mounts=[mount], cdi_devices=[])
    assert (alloc.device_specs, alloc.mounts, alloc.cdi_devices) == ((spec,), (mount,), ())


class _Pushed(kubedevice.DevicePlugin):
    resource_name = "example.com/pushed"


@pytest.mark.parametrize(
    ("devices", "needle"),
    [
        (
            [kubedevice.Device(id="a"), kubedevice.Device(id="b"), kubedevice.Device(id="a")],
            "device list of example.com/pushed refused: device ID 'a' appears twice",
        ),
        (
            [kubedevice.Device(id="a"), "b"],
            "device list of example.com/pushed refused: item 1 is a str, not a kubedevice.Device",
        ),
        (
            kubedevice.Device(id="a"),
            "device list of example.com/pushed refused: ",
        ),
    ],
    ids=["duplicate", "not-a-device", "one-device"],
)
def test_update_refuses_a_bad_list_at_the_call_and_keeps_the_last_good(
    devices: object, needle: str
) -> None:
    plugin = _Pushed()
    good = [kubedevice.Device(id="g")]
    plugin.update(good)
    with pytest.raises(kubedevice.ConfigError) as err:
        plugin.update(devices)  # type: ignore[arg-type]
    assert str(err.value).startswith(needle)
    assert plugin._kd_pending == tuple(good)

"""The GPU DRA driver's DeviceClasses select exactly what the device plugin advertises.

For each fake machine and MIG strategy, the classes' CEL selectors are evaluated against the
driver's real devices (:func:`build_devices`) and compared with the device plugin's own
inventory (:func:`build_inventory`) of the same config: one class per advertised name, and
each class's devices are exactly that resource's units. (The real scheduler evaluates the
same expressions in tests/e2e/test_dra_extended.py.)
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import yaml
from dra.selectors import matches

from kubedevice.dra.api.classes import class_name
from kubedevice.errors import ConfigError
from kubedevice.nvidia.config import Config, parse_config
from kubedevice.nvidia.devices import advertised_names, build_inventory, plan_resources
from kubedevice.nvidia.dra.classes import device_classes, node_mig_profiles
from kubedevice.nvidia.dra.devices import build_devices

DRIVER = "gpu.kubedevice.io"


def _config(host: Any, text: str) -> Config:
    config = parse_config(yaml.safe_load(text))
    flags = dataclasses.replace(config.flags, dev_root=str(host.dev), sys_root=str(host.sys))
    return dataclasses.replace(config, flags=flags)


CASES = [
    ("dgx-8gpu", "version: v1\n"),
    ("dgx-8gpu", "version: v1\nflags: {migStrategy: single}\n"),
    ("mig-mixed", "version: v1\n"),
    ("mig-mixed", "version: v1\nflags: {migStrategy: mixed}\n"),
    (
        "mig-mixed",
        "version: v1\nflags: {migStrategy: mixed}\nsharing: {timeSlicing: {renameByDefault: true,"
        " resources: [{name: nvidia.com/gpu, replicas: 2},"
        " {name: nvidia.com/mig-1g.18gb, replicas: 4, rename: nvidia.com/tiny}]}}\n",
    ),
]


@pytest.mark.parametrize(("machine", "text"), CASES)
def test_each_class_selects_exactly_the_plugins_devices_of_its_name(
    gpu_host: Any, machine: str, text: str
) -> None:
    host = gpu_host(machine)
    config = _config(host, text)
    nvml = host.nvml
    driver = nvml.init()
    gpus = nvml.gpus()
    mig = {g.uuid: nvml.mig_devices(g.uuid) for g in gpus if g.mig_enabled}
    devices = build_devices(config, driver, gpus, mig)
    inventory = build_inventory(config, gpus, mig)
    profiles = node_mig_profiles(config, host.nvml)
    classes = device_classes(config, DRIVER, profiles)
    names = [c["spec"]["extendedResourceName"] for c in classes]
    assert names == list(inventory.resources)  # one class per advertised name, in its order
    assert names == list(plan_resources(config, gpus, mig).values())
    for cls in classes:
        [sel] = cls["spec"]["selectors"]
        chosen = {
            d.unit.uuid for d in devices if matches(sel["cel"]["expression"], DRIVER, d.device)
        }
        want = {e.unit.uuid for e in inventory.resources[cls["spec"]["extendedResourceName"]]}
        assert chosen == want, cls["metadata"]["name"]
        assert chosen, "a class of a name the plugin advertises selects its devices"
        assert cls["metadata"]["name"] == class_name(cls["spec"]["extendedResourceName"])
        shared = cls["spec"]["extendedResourceName"] in inventory.shared
        assert ("config" in cls["spec"]) == shared


def test_time_sliced_classes_carry_the_config_the_driver_accepts_for_their_devices(
    gpu_host: Any,
) -> None:
    from kubedevice.nvidia.dra.config import parse_gpu_config

    host = gpu_host("mig-mixed")
    config = _config(host, CASES[-1][1])
    classes = device_classes(config, "gpu.example.com", node_mig_profiles(config, host.nvml))
    configs = {
        c["spec"]["extendedResourceName"]: c["spec"]["config"]
        for c in classes
        if "config" in c["spec"]
    }
    assert set(configs) == {"nvidia.com/gpu.shared", "nvidia.com/tiny"}
    shared = (("nvidia.com/gpu.shared", "GpuConfig"), ("nvidia.com/tiny", "MigDeviceConfig"))
    for name, kind in shared:
        [entry] = configs[name]
        assert entry["opaque"]["driver"] == "gpu.example.com"
        parsed = parse_gpu_config(entry["opaque"]["parameters"])  # the driver's own check
        assert parsed.kind == kind
        assert parsed.sharing is not None
        assert parsed.sharing.strategy == "TimeSlicing"


def test_single_strategy_on_mig_gpus_asks_for_a_mig_device_config() -> None:
    config = parse_config({"version": "v1", "flags": {"migStrategy": "single"},
                           "sharing": {"timeSlicing": {"resources": [
                               {"name": "nvidia.com/gpu", "replicas": 2}]}}})  # fmt: skip
    [cls] = device_classes(config, DRIVER, ["1g.10gb", "1g.10gb"])
    assert cls["spec"]["selectors"][0]["cel"]["expression"] == f'device.driver == "{DRIVER}"'
    assert cls["spec"]["config"][0]["opaque"]["parameters"]["kind"] == "MigDeviceConfig"
    [whole] = device_classes(config, DRIVER, [])
    assert whole["spec"]["config"][0]["opaque"]["parameters"]["kind"] == "GpuConfig"


def test_a_rename_collision_is_refused_as_for_the_plugin() -> None:
    config = parse_config({"version": "v1", "flags": {"migStrategy": "mixed"},
                           "sharing": {"timeSlicing": {"resources": [
                               {"name": "nvidia.com/gpu", "replicas": 2,
                                "rename": "nvidia.com/mig-1g.10gb"}]}}})  # fmt: skip
    with pytest.raises(ConfigError, match="already another resource"):
        device_classes(config, DRIVER, ["1g.10gb"])
    with pytest.raises(ConfigError, match="already another resource"):
        advertised_names(config, ["1g.10gb"])


def test_no_nvml_is_needed_without_a_mig_strategy() -> None:
    class NoNvml:
        def init(self) -> None:
            raise AssertionError("NVML started")

        def shutdown(self) -> None:
            raise AssertionError("NVML shut down")

    assert node_mig_profiles(Config(version="v1"), NoNvml()) == []  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("resource", "name"),
    [
        ("nvidia.com/gpu", "nvidia.com-gpu"),
        ("nvidia.com/mig-1g.10gb", "nvidia.com-mig-1g.10gb"),
        ("nvidia.com/gpu.shared", "nvidia.com-gpu.shared"),
    ],
)
def test_class_names_are_the_resource_names_made_subdomains(resource: str, name: str) -> None:
    assert class_name(resource) == name


def test_lossy_class_names_get_a_hash_so_they_stay_distinct() -> None:
    a, b = class_name("example.com/Dev_A"), class_name("example.com/dev-a")
    assert b == "example.com-dev-a"
    assert a.startswith("example.com-dev-a-")
    long = class_name("a" * 250 + ".io/x")
    assert len(long) <= 253


async def test_mig_on_demand_gets_a_class_per_offered_profile_selecting_its_placements(
    gpu_host: Any,
) -> None:
    """With MIG on demand a pod can ask ``nvidia.com/mig-3g.40gb: 1``: each profile the GPUs
    offer has its class, selecting exactly that profile's placements (the ``+me`` profiles,
    no valid resource names, have none)."""
    import asyncio

    from kubedevice.nvidia.dra import GpuDraDriver

    host = gpu_host("dgx-8gpu-mig")
    text = "version: v1\nflags: {migStrategy: mixed}\ndra: {migOnDemand: true}\n"
    config = _config(host, text)
    classes = device_classes(config, DRIVER, node_mig_profiles(config, host.nvml))
    names = [c["spec"]["extendedResourceName"] for c in classes]
    assert names == [
        "nvidia.com/gpu",
        "nvidia.com/mig-1g.10gb",
        "nvidia.com/mig-1g.20gb",
        "nvidia.com/mig-2g.20gb",
        "nvidia.com/mig-3g.40gb",
        "nvidia.com/mig-4g.40gb",
        "nvidia.com/mig-7g.80gb",
    ]
    driver = GpuDraDriver(config, host.nvml)
    gen = driver.devices()
    try:
        devices = await asyncio.wait_for(anext(gen), 10)
    finally:
        await gen.aclose()
    by_class = {
        c["spec"]["extendedResourceName"]: sorted(
            d.name
            for d in devices
            if matches(c["spec"]["selectors"][0]["cel"]["expression"], DRIVER, d)
        )
        for c in classes
    }
    assert by_class["nvidia.com/gpu"] == [f"gpu-{i}" for i in range(8)]
    assert by_class["nvidia.com/mig-3g.40gb"] == sorted(
        f"gpu-{i}-mig-3g-40gb-{s}" for i in range(8) for s in (0, 4)
    )
    assert len(by_class["nvidia.com/mig-1g.10gb"]) == 8 * 7  # not the +me placements


def test_mig_on_demand_off_no_classes_for_profiles_not_made(gpu_host: Any) -> None:
    host = gpu_host("dgx-8gpu-mig")
    config = _config(host, "version: v1\nflags: {migStrategy: mixed}\n")
    assert node_mig_profiles(config, host.nvml) == []

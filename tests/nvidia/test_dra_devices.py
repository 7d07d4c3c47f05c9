"""The GPU DRA driver's devices: NVIDIA's attribute names and types, MIG, NVLink domains."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from kubedevice.dra import Version
from kubedevice.errors import ConfigError
from kubedevice.nvidia.config import Config
from kubedevice.nvidia.devices import read_numa_node
from kubedevice.nvidia.dra.devices import GpuDevice, build_devices, nvlink_domains, semver
from kubedevice.nvidia.topology import build_topology


def _devices(host: Any, strategy: str = "none") -> list[GpuDevice]:
    config = Config(version="v1").with_overrides(dev_root=str(host.dev), sys_root=str(host.sys))
    flags = dataclasses.replace(config.flags, mig_strategy=strategy)
    config = dataclasses.replace(config, flags=flags)
    nvml = host.nvml
    driver = nvml.init()
    gpus = nvml.gpus()
    mig = {g.uuid: nvml.mig_devices(g.uuid) for g in gpus if g.mig_enabled}
    numa = {g.uuid: read_numa_node(host.sys, g.pci_bus_id) for g in gpus}
    return build_devices(config, driver, gpus, mig, topology=build_topology(nvml, gpus, numa))


@pytest.mark.parametrize(
    ("text", "want"),
    [("570.124.06", "570.124.6"), ("12.8", "12.8.0"), ("9.0", "9.0.0"), ("535", "535.0.0")],
)
def test_semver_reads_versions_as_nvidias_driver_does(text: str, want: str) -> None:
    assert semver(text) == Version(want)


def test_semver_refuses_what_is_no_version() -> None:
    assert semver("r570") is None


def test_whole_gpus_carry_nvidias_attributes(gpu_host: Any) -> None:
    devices = _devices(gpu_host("dgx-8gpu"))
    assert [d.device.name for d in devices] == [f"gpu-{i}" for i in range(8)]
    gpu0 = devices[0]
    attrs = dict(gpu0.device.attributes)
    assert attrs == {
        "type": "gpu",
        "uuid": gpu0.gpu.uuid,
        "productName": "NVIDIA H100 80GB HBM3",
        "brand": "Nvidia",
        "architecture": "Hopper",
        "cudaComputeCapability": Version("9.0.0"),
        "driverVersion": Version("570.124.6"),
        "cudaDriverVersion": Version("12.8.0"),
        "pcieBusID": "0000:18:00.0",
        "index": 0,
        "minor": 0,
        "migEnabled": False,
        "resource.kubernetes.io/pciBusID": "0000:18:00.0",
        "resource.kubernetes.io/pcieRoot": "pci0000:00",
        "numaNode": 0,
        "resource.kubernetes.io/numaNode": 0,
        "nvlinkDomain": 0,
    }
    assert str(gpu0.device.capacity["memory"]) == str(81559 * 1024 * 1024)
    nodes = [(n.path, n.host_path) for n in gpu0.device.edits.device_nodes]
    assert nodes[0] == ("/dev/nvidia0", "/dev/nvidia0")
    assert {p for p, _ in nodes} >= {"/dev/nvidiactl", "/dev/nvidia-uvm"}
    # the second root complex and NUMA node
    assert devices[2].device.attributes["resource.kubernetes.io/pcieRoot"] == "pci0000:01"
    assert devices[4].device.attributes["numaNode"] == 1
    assert devices[4].device.attributes["resource.kubernetes.io/numaNode"] == 1


def test_nvlink_domains_are_the_largest_cliques(gpu_host: Any) -> None:
    devices = _devices(gpu_host("dgx-8gpu"))
    # two cliques of 4 (0-3, 4-7); the 2-link pairs i, i+4 do not merge them
    assert [d.device.attributes["nvlinkDomain"] for d in devices] == [0] * 4 + [4] * 4


def test_no_nvlink_no_domain(gpu_host: Any) -> None:
    devices = _devices(gpu_host("pcie-4gpu"))
    assert all("nvlinkDomain" not in d.device.attributes for d in devices)
    assert nvlink_domains([d.gpu for d in devices], None) == {}
    assert devices[0].device.attributes["architecture"] == "Ada Lovelace"


def test_mixed_strategy_publishes_mig_devices_with_parent_attributes(gpu_host: Any) -> None:
    devices = _devices(gpu_host("mig-mixed"), "mixed")
    names = [d.device.name for d in devices]
    assert "gpu-2" in names  # MIG-capable but disabled: whole
    mig = [d for d in devices if d.mig is not None]
    assert len(mig) == len(devices) - 1
    first = mig[0]
    assert first.device.name == "gpu-0-mig-3g-71gb-2-0"
    attrs = first.device.attributes
    assert attrs["type"] == "mig"
    assert attrs["profile"] == "3g.71gb"
    assert attrs["parentUUID"] == first.gpu.uuid
    assert first.mig is not None
    assert attrs["uuid"] == first.mig.uuid
    assert attrs["migEnabled"] is True
    assert attrs["driverVersion"] == Version("580.159.4")
    paths = [n.path for n in first.device.edits.device_nodes]
    assert paths[0] == "/dev/nvidia0"
    assert any(p.startswith("/dev/nvidia-caps/nvidia-cap") for p in paths)
    assert len(set(names)) == len(names)


def test_none_strategy_publishes_mig_gpus_whole(gpu_host: Any) -> None:
    devices = _devices(gpu_host("mig-mixed"), "none")
    assert [d.device.name for d in devices] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]


def test_single_strategy_refuses_mixed_profiles(gpu_host: Any) -> None:
    with pytest.raises(ConfigError, match="migStrategy"):
        _devices(gpu_host("mig-mixed"), "single")


def test_recording_without_numa_has_no_numa_attribute(gpu_host: Any) -> None:
    [gpu] = _devices(gpu_host("h200"))
    assert "numaNode" not in gpu.device.attributes
    assert "nvlinkDomain" not in gpu.device.attributes
    assert gpu.device.attributes["resource.kubernetes.io/pciBusID"] == "0000:00:06.0"


def test_mig_devices_carry_nvidias_capacities_from_the_profile(gpu_host: Any) -> None:
    """A claim written for NVIDIA's driver selects on these; an unknown capacity in a CEL
    selector is an error that stops the claim from scheduling."""
    devices = {d.device.name: d.device for d in _devices(gpu_host("mig-mixed"), "mixed")}
    caps = {k: str(v) for k, v in devices["gpu-0-mig-3g-71gb-2-0"].capacity.items()}
    assert caps == {
        "memory": str(69888 * 1024 * 1024),
        "multiprocessors": "60",
        "copyEngines": "3",
        "decoders": "3",
        "encoders": "0",
        "jpegEngines": "3",
        "ofaEngines": "0",
        **{f"memorySlice{i}": "1" for i in range(4, 8)},
    }
    small = {k: str(v) for k, v in devices["gpu-0-mig-1g-18gb-9-0"].capacity.items()}
    assert (small["multiprocessors"], small["memorySlice2"]) == ("16", "1")
    assert [k for k in small if k.startswith("memorySlice")] == ["memorySlice2"]
    assert "multiprocessors" not in devices["gpu-2"].capacity  # a whole GPU: memory only


def test_a_whole_gpu_mig_device_fits_the_apis_32_attributes_and_capacities() -> None:
    from kubedevice.nvidia.backend import MigEngines
    from kubedevice.nvidia.dra.devices import fit, mig_capacity

    engines = MigEngines(132, 8, 7, 0, 7, 1)
    capacity = {"memory": 1, **mig_capacity(engines, range(8))}
    assert len(capacity) == 15
    attrs: dict[str, Any] = {f"a{i}": i for i in range(16)}
    attrs.update(migEnabled=True, nvlinkDomain=0, numaNode=0)
    fit(attrs, capacity)
    assert len(attrs) + len(capacity) == 32
    assert "migEnabled" not in attrs
    assert "nvlinkDomain" not in attrs
    assert attrs["numaNode"] == 0  # only as many as needed go

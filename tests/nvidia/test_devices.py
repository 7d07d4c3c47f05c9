"""GPUs and MIG devices -> devices per resource: IDs, replicas, nodes, NUMA, MIG strategies."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kubedevice.errors import ConfigError
from kubedevice.nvidia.config import Config, parse_config
from kubedevice.nvidia.devices import build_inventory, read_numa_node, split_replica

from .gpu_helpers import fake_host, gpu, mig_device


def _config(**sections: Any) -> Config:
    return parse_config({"version": "v1", **sections})


def test_whole_gpus_by_uuid_with_nodes_and_numa(tmp_path: Path) -> None:
    gpus = [gpu(0), gpu(1)]
    dev, sys = fake_host(tmp_path, gpus, {0: 0, 1: 1})
    inv = build_inventory(_config(), gpus, {}, dev_root=str(dev), sys_root=str(sys))
    assert list(inv.resources) == ["nvidia.com/gpu"]
    entries = inv.resources["nvidia.com/gpu"]
    assert [e.id for e in entries] == [g.uuid for g in gpus]
    first = entries[0].unit
    # its own node plus the control nodes present (nvidia-uvm-tools, nvidia-modeset are not)
    assert first.device_nodes == ("/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm")
    assert [e.unit.numa_node for e in entries] == [0, 1]


def test_index_ids_and_replicas(tmp_path: Path) -> None:
    gpus = [gpu(0), gpu(1)]
    dev, sys = fake_host(tmp_path, gpus, {})
    cfg = _config(
        flags={"deviceIDStrategy": "index"},
        sharing={
            "timeSlicing": {
                "renameByDefault": True,
                "resources": [{"name": "nvidia.com/gpu", "replicas": 3}],
            }
        },
    )
    inv = build_inventory(cfg, gpus, {}, dev_root=str(dev), sys_root=str(sys))
    assert list(inv.resources) == ["nvidia.com/gpu.shared"]
    assert inv.shared == {"nvidia.com/gpu.shared"}
    ids = [e.id for e in inv.resources["nvidia.com/gpu.shared"]]
    assert ids == ["0::0", "0::1", "0::2", "1::0", "1::1", "1::2"]
    assert split_replica("GPU-x::2") == ("GPU-x", 2)
    assert split_replica("GPU-x") == ("GPU-x", None)
    assert all(e.unit.numa_node is None for e in inv.resources["nvidia.com/gpu.shared"])


def test_mig_mixed_single_and_none(tmp_path: Path) -> None:
    g0, g1, g2 = gpu(0, mig=True), gpu(1, mig=True), gpu(2)
    mig = {
        g0.uuid: [mig_device(g0, 0, "3g.71gb", (1, 2)), mig_device(g0, 1, "1g.18gb", (3, 4))],
        g1.uuid: [mig_device(g1, 0, "1g.18gb", (10, 11))],
    }
    dev, sys = fake_host(tmp_path, [g0, g1, g2], {0: 0, 1: 0, 2: 1})
    roots = {"dev_root": str(dev), "sys_root": str(sys)}

    mixed = build_inventory(_config(flags={"migStrategy": "mixed"}), [g0, g1, g2], mig, **roots)
    assert sorted(mixed.resources) == [
        "nvidia.com/gpu",
        "nvidia.com/mig-1g.18gb",
        "nvidia.com/mig-3g.71gb",
    ]
    assert [e.id for e in mixed.resources["nvidia.com/gpu"]] == [g2.uuid]
    small = mixed.resources["nvidia.com/mig-1g.18gb"]
    assert [e.unit.index for e in small] == ["0:1", "1:0"]
    assert small[0].unit.parent_uuid == g0.uuid
    assert small[0].unit.device_nodes[-2:] == (
        "/dev/nvidia-caps/nvidia-cap3",
        "/dev/nvidia-caps/nvidia-cap4",
    )
    assert small[0].unit.device_nodes[0] == "/dev/nvidia0"

    none = build_inventory(_config(), [g0, g1, g2], mig, **roots)
    assert [e.id for e in none.resources["nvidia.com/gpu"]] == [g0.uuid, g1.uuid, g2.uuid]

    with pytest.raises(ConfigError, match=r"'single' needs every GPU MIG-enabled with one MIG"):
        build_inventory(_config(flags={"migStrategy": "single"}), [g0, g1, g2], mig, **roots)

    same = {g0.uuid: [mig_device(g0, 0, "1g.18gb", (1, 2))], g1.uuid: mig[g1.uuid]}
    single = build_inventory(_config(flags={"migStrategy": "single"}), [g0, g1], same, **roots)
    assert list(single.resources) == ["nvidia.com/gpu"]
    assert [e.unit.uuid for e in single.resources["nvidia.com/gpu"]] == [
        same[g0.uuid][0].uuid,
        mig[g1.uuid][0].uuid,
    ]


def test_rename_onto_an_existing_resource_is_refused(tmp_path: Path) -> None:
    g0, g1 = gpu(0, mig=True), gpu(1)
    mig = {g0.uuid: [mig_device(g0, 0, "1g.18gb", (1, 2))]}
    cfg = _config(
        flags={"migStrategy": "mixed"},
        sharing={
            "timeSlicing": {
                "resources": [
                    {"name": "nvidia.com/mig-1g.18gb", "replicas": 2, "rename": "nvidia.com/gpu"}
                ]
            }
        },
    )
    with pytest.raises(ConfigError, match="already another resource"):
        build_inventory(cfg, [g0, g1], mig, dev_root=str(tmp_path), sys_root=str(tmp_path))


def test_no_gpu_still_serves_the_gpu_resource(tmp_path: Path) -> None:
    inv = build_inventory(_config(), [], {}, dev_root=str(tmp_path), sys_root=str(tmp_path))
    assert inv.resources == {"nvidia.com/gpu": ()}


def test_numa_node_reading(tmp_path: Path) -> None:
    pci = tmp_path / "bus" / "pci" / "devices" / "0000:18:00.0"
    pci.mkdir(parents=True)
    (pci / "numa_node").write_text("1\n")
    assert read_numa_node(tmp_path, "0000:18:00.0") == 1
    assert read_numa_node(tmp_path, "0000:18:00.0".upper()) == 1
    (pci / "numa_node").write_text("-1\n")
    assert read_numa_node(tmp_path, "0000:18:00.0") is None
    (pci / "numa_node").write_text("junk")
    assert read_numa_node(tmp_path, "0000:18:00.0") is None
    assert read_numa_node(tmp_path, "0000:99:00.0") is None  # missing file
    assert read_numa_node(tmp_path, "../../../etc") is None  # never a path outside sysRoot


def test_mig_profile_time_sliced_and_renamed(tmp_path: Path) -> None:
    g0 = gpu(0, mig=True)
    mig = {g0.uuid: [mig_device(g0, 0, "1g.18gb", (1, 2)), mig_device(g0, 1, "3g.71gb", (3, 4))]}
    dev, sys = fake_host(tmp_path, [g0], {0: 1})
    cfg = _config(
        flags={"migStrategy": "mixed"},
        sharing={
            "timeSlicing": {
                "resources": [
                    {"name": "nvidia.com/mig-1g.18gb", "replicas": 2, "rename": "example.com/small"}
                ]
            }
        },
    )
    inv = build_inventory(cfg, [g0], mig, dev_root=str(dev), sys_root=str(sys))
    assert sorted(inv.resources) == [
        "example.com/small",
        "nvidia.com/gpu",
        "nvidia.com/mig-3g.71gb",
    ]
    assert inv.shared == {"example.com/small"}
    small = inv.resources["example.com/small"]
    assert [e.id for e in small] == [f"{mig[g0.uuid][0].uuid}::0", f"{mig[g0.uuid][0].uuid}::1"]
    assert {e.unit.numa_node for e in small} == {1}
    assert inv.resources["nvidia.com/gpu"] == ()  # the only GPU is split into MIG devices


def test_empty_features_dir_override_switches_labels_off() -> None:
    cfg = _config(flags={"featuresDir": "/etc/nfd"})
    assert cfg.with_overrides(features_dir="").flags.features_dir is None
    assert cfg.with_overrides(features_dir=None).flags.features_dir == "/etc/nfd"

"""PCI facts from a fake sysfs: the standard DRA attributes pciBusID and pcieRoot."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kubedevice.nvidia.fake import load_machine, write_fake_sysfs
from kubedevice.plugin.pci import normalize_bus_id, pci_bus_id_of, pcie_root


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        ("0000:3B:00.0", "0000:3b:00.0"),
        ("00000000:3b:00.0", "0000:3b:00.0"),
        ("0001:3b:00.7", "0001:3b:00.7"),
        ("3b:00.0", None),
        ("0000:3b:00", None),
        ("../../etc", None),
    ],
)
def test_normalize_bus_id(raw: str, want: str | None) -> None:
    assert normalize_bus_id(raw) == want


def test_pcie_root_from_the_bus_symlink(tmp_path: Path) -> None:
    sys_root = tmp_path / "sys"
    dev = sys_root / "devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0"
    dev.mkdir(parents=True)
    link = sys_root / "bus/pci/devices/0000:3b:00.0"
    link.parent.mkdir(parents=True)
    link.symlink_to("../../../devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0")
    assert pcie_root(sys_root, "0000:3B:00.0") == "pci0000:3a"
    assert pcie_root(sys_root, "0000:3c:00.0") is None  # no such device
    tty = dev / "tty" / "ttyS0"
    tty.mkdir(parents=True)
    assert pci_bus_id_of(sys_root, str(tty)) == "0000:3b:00.0"
    assert pci_bus_id_of(sys_root, str(sys_root / "devices")) is None


def test_a_link_out_of_sys_root_is_not_followed(tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere/devices/pci0000:00/0000:00:02.0"
    outside.mkdir(parents=True)
    sys_root = tmp_path / "sys"
    link = sys_root / "bus/pci/devices/0000:00:02.0"
    link.parent.mkdir(parents=True)
    link.symlink_to(outside)
    assert pcie_root(sys_root, "0000:00:02.0") is None
    # a plain directory (no symlink) says nothing of the root either
    (sys_root / "bus/pci/devices/0000:00:03.0").mkdir()
    assert pcie_root(sys_root, "0000:00:03.0") is None


def test_fake_sysfs_has_one_root_per_host_bridge(tmp_path: Path) -> None:
    machine = load_machine("dgx-8gpu")
    write_fake_sysfs(machine, tmp_path)
    roots = [pcie_root(tmp_path, g.info.pci_bus_id) for g in machine.gpus]
    # GPUs 0-1 on rc0, 2-3 on rc1, 4-5 on rc2, 6-7 on rc3
    assert (
        roots == ["pci0000:00"] * 2 + ["pci0000:01"] * 2 + ["pci0000:02"] * 2 + ["pci0000:03"] * 2
    )
    link = tmp_path / "bus/pci/devices/0000:9a:00.0"
    assert link.is_symlink()
    assert not os.path.isabs(os.readlink(link))
    assert (link / "numa_node").read_text().strip() == "1"
    write_fake_sysfs(machine, tmp_path)  # again: idempotent

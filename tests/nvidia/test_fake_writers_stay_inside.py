"""write_fake_dev / write_fake_sysfs never write outside their root, whatever the machine says."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from kubedevice.errors import ConfigError
from kubedevice.nvidia.fake import write_fake_dev, write_fake_sysfs
from kubedevice.plugin.paths import inside


def _machine(dev_nodes: list[str], bus_ids: list[str]) -> object:
    gpus = [SimpleNamespace(info=SimpleNamespace(pci_bus_id=b), numa_node=0) for b in bus_ids]
    return SimpleNamespace(dev_nodes=dev_nodes, gpus=gpus)


@pytest.mark.parametrize("node", ["/dev/../../escaped", "/dev/nvidia-caps/../../../escaped"])
def test_write_fake_dev_refuses_dotdot(tmp_path: Path, node: str) -> None:
    root = tmp_path / "a" / "b" / "dev"
    root.mkdir(parents=True)
    with pytest.raises(ConfigError, match="would leave"):
        write_fake_dev(_machine(["/dev/nvidia0", node], []), root)  # type: ignore[arg-type]
    assert not list(tmp_path.rglob("escaped"))
    assert (root / "nvidia0").is_file()


@pytest.mark.parametrize("bus_id", ["../../../../escaped", "/abs/escaped"])
def test_write_fake_sysfs_refuses_a_bus_id_out_of_root(tmp_path: Path, bus_id: str) -> None:
    root = tmp_path / "a" / "b" / "sys"
    root.mkdir(parents=True)
    with pytest.raises(ConfigError, match="PCI bus ID"):
        write_fake_sysfs(_machine([], [bus_id]), root)  # type: ignore[arg-type]
    assert not list(tmp_path.rglob("escaped"))


def test_inside_keeps_ordinary_paths() -> None:
    root = Path("/r")
    assert inside(root, "nvidia-caps/nvidia-cap1") == Path("/r/nvidia-caps/nvidia-cap1")
    assert inside(root, "0000:3b:00.0") == Path("/r/0000:3b:00.0")
    for bad in ("", "..", "a/../..", "/etc"):
        with pytest.raises(ConfigError):
            inside(root, bad)

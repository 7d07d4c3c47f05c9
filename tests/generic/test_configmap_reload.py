"""Hot reload when Kubernetes updates a mounted ConfigMap (atomic ``..data`` symlink swap)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import yaml

from generic.gen_kubelet import KubeletDouble
from kubedevice.generic import FakeHost, GenericPlugins, load_config


def _version(mount: Path, name: str, doc: dict[str, object]) -> None:
    """Write a new timestamped dir and swap ``..data`` to it, as the kubelet does."""
    (mount / name).mkdir()
    (mount / name / "config.yaml").write_text(yaml.safe_dump(doc))
    tmp = mount / "..data_tmp"
    os.symlink(name, tmp)
    os.replace(tmp, mount / "..data")


async def test_configmap_symlink_swap_reloads(
    host: FakeHost, kubelet: KubeletDouble, sock_dir: Path
) -> None:
    host.add_char_device("/dev/ttyUSB0")
    host.add_char_device("/dev/fuse")
    mount = host.root / "configmap"
    mount.mkdir()

    def doc(*resources: dict[str, object]) -> dict[str, object]:
        return {
            "version": "v1",
            "devRoot": str(host.dev_root),
            "sysRoot": str(host.sys_root),
            "resources": list(resources),
        }

    serial = {"name": "example.com/serial", "groups": [{"paths": [{"path": "/dev/ttyUSB*"}]}]}
    fuse = {"name": "example.com/fuse", "groups": [{"paths": [{"path": "/dev/fuse"}]}]}
    _version(mount, "..2026_11_26_01", doc(serial))
    os.symlink("..data/config.yaml", mount / "config.yaml")
    path = mount / "config.yaml"

    plugins = GenericPlugins(load_config(path), device_plugin_dir=sock_dir, config_path=path)
    async with plugins, asyncio.timeout(10):
        await kubelet.wait("example.com/serial", lambda s: s == {"ttyUSB0": "Healthy"})
        _version(mount, "..2026_11_26_02", doc(serial, fuse))
        await plugins.wait_reloaded(1)
        assert plugins.resources == ["example.com/serial", "example.com/fuse"]
        await kubelet.wait("example.com/fuse", lambda s: s == {"fuse": "Healthy"})

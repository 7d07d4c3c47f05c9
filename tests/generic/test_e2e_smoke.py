"""End-to-end smoke: a serial resource on a fake tree, through the kubelet double."""

from __future__ import annotations

import asyncio
from pathlib import Path

from generic.gen_kubelet import KubeletDouble
from kubedevice.generic import FakeHost, GenericPlugins, parse_config


async def test_hotplug_reaches_kubelet(
    host: FakeHost, kubelet: KubeletDouble, sock_dir: Path
) -> None:
    host.add_char_device("/dev/ttyUSB0")
    cfg = parse_config(
        {
            "version": "v1",
            "devRoot": str(host.dev_root),
            "sysRoot": str(host.sys_root),
            "resources": [
                {"name": "example.com/serial", "groups": [{"paths": [{"path": "/dev/ttyUSB*"}]}]}
            ],
        }
    )
    async with GenericPlugins(cfg, device_plugin_dir=sock_dir), asyncio.timeout(10):
        assert await kubelet.wait("example.com/serial", lambda s: bool(s)) == {"ttyUSB0": "Healthy"}
        host.add_char_device("/dev/ttyUSB1")
        snap = await kubelet.wait("example.com/serial", lambda s: len(s) == 2)
        assert snap == {"ttyUSB0": "Healthy", "ttyUSB1": "Healthy"}
        resp = await kubelet.allocate("example.com/serial", ["ttyUSB1"])
        assert [d.host_path for d in resp.devices] == ["/dev/ttyUSB1"]
        host.remove("/dev/ttyUSB1")
        snap = await kubelet.wait("example.com/serial", lambda s: s.get("ttyUSB1") != "Healthy")
        assert snap == {"ttyUSB0": "Healthy", "ttyUSB1": "Unhealthy"}
        host.remove("/dev/ttyUSB0")
        snap = await kubelet.wait("example.com/serial", lambda s: "ttyUSB0" not in s)
        assert snap == {"ttyUSB1": "Unhealthy"}
        host.add_char_device("/dev/ttyUSB1")
        snap = await kubelet.wait("example.com/serial", lambda s: s.get("ttyUSB1") == "Healthy")

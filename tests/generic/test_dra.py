"""The generic /dev devices as a DRA driver: names, attributes, edits, hot-plug."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from kubedevice.dra import Device
from kubedevice.generic.config import parse_config
from kubedevice.generic.dra import GenericDraDriver, device_name
from kubedevice.generic.fake import FakeHost

CONFIG = {
    "version": "v1",
    "resources": [
        {
            "name": "example.com/serial",
            "groups": [
                {
                    "name": "ttys",
                    "paths": [{"path": "/dev/ttyUSB*"}],
                    "envs": {"SERIAL_PORTS": "{paths}"},
                    "mounts": [{"hostPath": "/etc/serial", "containerPath": "/etc/serial"}],
                }
            ],
        },
        {
            "name": "example.com/fuse",
            "groups": [{"paths": [{"path": "/dev/fuse", "permissions": "rw"}], "count": 3}],
        },
        {"name": "example.com/accel", "groups": [{"paths": [{"path": "/dev/accel/accel*"}]}]},
    ],
}


def _driver(host: FakeHost) -> GenericDraDriver:
    config = parse_config(CONFIG).with_roots(str(host.dev_root), str(host.sys_root))
    return GenericDraDriver(config)


def _pci_accel(host: FakeHost) -> None:
    """accel0 on PCI device 0000:03:00.0 below root complex pci0000:00, NUMA node 1."""
    host.add_char_device("/dev/accel/accel0")
    pci = host.sys("/sys/devices/pci0000:00/0000:00:1c.0/0000:03:00.0")
    pci.mkdir(parents=True)
    (pci / "numa_node").write_text("1\n")
    cls = host.sys("/sys/class/accel/accel0")
    cls.mkdir(parents=True)
    (cls / "device").symlink_to(os.path.relpath(pci, cls))
    link = host.sys("/sys/bus/pci/devices/0000:03:00.0")
    link.parent.mkdir(parents=True)
    link.symlink_to(os.path.relpath(pci, link.parent))


@pytest.mark.parametrize(
    ("resource", "device_id", "replica", "want"),
    [
        ("example.com/fuse", "fuse", 2, "fuse-fuse-2"),
        ("example.com/serial", "ttyUSB0", None, "serial-ttyusb0-"),
        ("example.com/dri", "dri-renderD128", None, "dri-dri-renderd128-"),
        ("example.com/x", "a" * 80, None, "x-aaaa"),
    ],
)
def test_device_names_are_dns_labels(
    resource: str, device_id: str, replica: int | None, want: str
) -> None:
    name = device_name(resource, device_id, replica)
    assert name.startswith(want)
    assert len(name) <= 63
    Device(name)  # the kit's check: a DNS label
    # lossy mappings keep distinct devices distinct
    assert device_name(resource, device_id.upper() + "_", replica) != name


def test_devices_with_attributes_and_edits(tmp_path: Path) -> None:
    host = FakeHost(tmp_path)
    host.add_char_device("/dev/ttyUSB0", numa_node=0, subsystem="tty")
    host.add_char_device("/dev/fuse")
    _pci_accel(host)
    devices = {d.name: d for d in _driver(host).scan()}
    tty = devices[next(n for n in devices if n.startswith("serial-ttyusb0"))]
    assert dict(tty.attributes) == {
        "resource": "example.com/serial",
        "group": "ttys",
        "path": "/dev/ttyUSB0",
        "numaNode": 0,
        "resource.kubernetes.io/numaNode": 0,
    }
    assert [(n.path, n.host_path, n.permissions) for n in tty.edits.device_nodes] == [
        ("/dev/ttyUSB0", "/dev/ttyUSB0", "rw")
    ]
    assert dict(tty.edits.env) == {"SERIAL_PORTS": "/dev/ttyUSB0"}
    assert [(m.host_path, m.container_path) for m in tty.edits.mounts] == [
        ("/etc/serial", "/etc/serial")
    ]
    fuse = [devices[f"fuse-fuse-{i}"] for i in range(3)]
    assert [d.attributes["replica"] for d in fuse] == [0, 1, 2]
    [accel] = [d for n, d in devices.items() if n.startswith("accel-accel-accel0")]
    assert accel.attributes["resource.kubernetes.io/pciBusID"] == "0000:03:00.0"
    assert accel.attributes["resource.kubernetes.io/pcieRoot"] == "pci0000:00"
    assert accel.attributes["numaNode"] == 1


def test_a_pci_link_out_of_sys_root_is_not_followed(tmp_path: Path) -> None:
    host = FakeHost(tmp_path / "host")
    host.add_char_device("/dev/accel/accel0")
    outside = tmp_path / "elsewhere/devices/pci0000:00/0000:03:00.0"
    outside.mkdir(parents=True)
    cls = host.sys("/sys/class/accel/accel0")
    cls.mkdir(parents=True)
    (cls / "device").symlink_to(outside)
    [accel] = [d for d in _driver(host).scan() if d.name.startswith("accel")]
    assert "resource.kubernetes.io/pciBusID" not in accel.attributes


async def _next(gen: AsyncIterator[Sequence[Device]]) -> set[str]:
    return {d.name for d in await asyncio.wait_for(anext(gen), 10)}


async def test_hot_plug_yields_a_new_list(tmp_path: Path) -> None:
    host = FakeHost(tmp_path)
    host.add_char_device("/dev/ttyUSB0")
    driver = _driver(host)
    gen = driver.devices()
    try:
        first = await _next(gen)
        assert len([n for n in first if n.startswith("serial-")]) == 1
        host.add_char_device("/dev/ttyUSB1")
        second = await _next(gen)
        assert len([n for n in second if n.startswith("serial-")]) == 2
        host.remove("/dev/ttyUSB0")
        third = await _next(gen)
        assert [n for n in third if n.startswith("serial-")] == [
            n for n in second if n.startswith("serial-ttyusb1")
        ]
        host.add_char_device("/dev/fuse")
        fourth = await _next(gen)
        assert {f"fuse-fuse-{i}" for i in range(3)} <= fourth
    finally:
        await gen.aclose()


HEALTH_CONFIG = {
    "version": "v1",
    "resources": [
        {
            "name": "example.com/render",
            "groups": [
                {
                    "paths": [{"path": "/dev/dri/renderD*"}],
                    "health": {
                        "periodSeconds": 0.05,
                        "sysfsAttribute": {
                            "path": "/sys/class/drm/{name}/device/enable",
                            "expect": "1",
                        },
                    },
                }
            ],
        },
        {"name": "example.com/fuse", "groups": [{"paths": [{"path": "/dev/fuse"}]}]},
    ],
}


async def _health(gen: AsyncIterator[Sequence[Device]]) -> dict[str, str]:
    return {d.name: str(d.health) for d in await asyncio.wait_for(anext(gen), 10)}


async def test_health_checks_mark_devices_unhealthy_and_back(tmp_path: Path) -> None:
    host = FakeHost(tmp_path)
    host.add_char_device("/dev/dri/renderD128")
    host.add_char_device("/dev/dri/renderD129")
    host.add_char_device("/dev/fuse")  # no health checks: always Healthy
    host.set_attr("/sys/class/drm/renderD128/device/enable", "1")
    host.set_attr("/sys/class/drm/renderD129/device/enable", "0")
    config = parse_config(HEALTH_CONFIG).with_roots(str(host.dev_root), str(host.sys_root))
    gen = GenericDraDriver(config).devices()
    try:
        first = await _health(gen)  # checked before the first list: 129 never shown Healthy
        r128, r129 = sorted(n for n in first if n.startswith("render-"))
        assert (first[r128], first[r129]) == ("Healthy", "Unhealthy")
        assert [v for n, v in first.items() if n.startswith("fuse-")] == ["Healthy"]

        host.set_attr("/sys/class/drm/renderD128/device/enable", "0")  # 128 fails
        assert (await _health(gen))[r128] == "Unhealthy"
        host.set_attr("/sys/class/drm/renderD129/device/enable", "1")  # 129 recovers
        assert (await _health(gen))[r129] == "Healthy"

        # a hot-plugged device is checked before it is listed
        host.set_attr("/sys/class/drm/renderD130/device/enable", "0")
        host.add_char_device("/dev/dri/renderD130")
        listed = await _health(gen)
        [r130] = [n for n in listed if n.startswith("render-") and n not in (r128, r129)]
        assert listed[r130] == "Unhealthy"
    finally:
        await gen.aclose()


async def test_an_unhealthy_device_says_which_check_of_which_group_failed(
    tmp_path: Path,
) -> None:
    host = FakeHost(tmp_path)
    host.add_char_device("/dev/dri/renderD129")
    host.set_attr("/sys/class/drm/renderD129/device/enable", "0")
    config = parse_config(HEALTH_CONFIG).with_roots(str(host.dev_root), str(host.sys_root))
    gen = GenericDraDriver(config).devices()
    try:
        [device] = [d for d in await asyncio.wait_for(anext(gen), 10) if d.name.startswith("r")]
        assert device.fault is not None
        assert (device.fault.kind, device.fault.value) == ("health-check", "group0")
        assert device.fault.message.startswith(
            "health check (sysfsAttribute) of group group0 failed: "
        )
        assert "enable" in device.fault.message  # the check's own reason: which attribute
        host.set_attr("/sys/class/drm/renderD129/device/enable", "1")
        [again] = [d for d in await asyncio.wait_for(anext(gen), 10) if d.name.startswith("r")]
        assert (str(again.health), again.fault) == ("Healthy", None)
    finally:
        await gen.aclose()

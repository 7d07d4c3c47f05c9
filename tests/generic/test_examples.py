"""Every ``examples/*.yaml`` config, served on a fake tree that matches its globs."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kubedevice.generic import FakeHost, GenericPlugins, load_config
from kubedevice.kubelet import Emulator

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _serial(host: FakeHost) -> None:
    host.add_char_device("/dev/ttyUSB0")
    host.add_char_device("/dev/ttyACM0")
    host.add_usb("0403", "6001", "A50285BI", busnum=1, devnum=5)
    host.add_usb("046d", "c52b", None, busnum=1, devnum=6)  # not an FTDI: not offered


def _fuse(host: FakeHost) -> None:
    host.add_char_device("/dev/fuse")


def _kvm(host: FakeHost) -> None:
    host.add_char_device("/dev/kvm")
    host.add_char_device("/dev/net/tun")


def _render(host: FakeHost) -> None:
    for n, numa in ((128, 0), (129, 1)):
        host.add_char_device(f"/dev/dri/renderD{n}", numa_node=numa, subsystem="drm")
        host.set_attr(f"/sys/class/drm/renderD{n}/device/enable", "1")


# example -> (tree builder, resource -> expected IDs, (resource, IDs to allocate), envs expected)
CASES: dict[
    str,
    tuple[Callable[[FakeHost], None], dict[str, set[str]], tuple[str, list[str]], dict[str, str]],
] = {
    "serial-usb.yaml": (
        _serial,
        {
            "example.com/serial": {"ttyUSB0", "ttyACM0"},
            "example.com/ftdi": {"usb-0403-6001-A50285BI"},
        },
        ("example.com/serial", ["ttyACM0", "ttyUSB0"]),
        {"SERIAL_PORTS": "/dev/ttyUSB0,/dev/ttyACM0"},
    ),
    "fuse.yaml": (
        _fuse,
        {"example.com/fuse": {f"fuse::{i}" for i in range(110)}},
        ("example.com/fuse", ["fuse::7"]),
        {},
    ),
    "kvm.yaml": (
        _kvm,
        {"example.com/kvm": {f"kvm::{i}" for i in range(64)}},
        ("example.com/kvm", ["kvm::0"]),
        {"KVM_DEVICE_IDS": "kvm::0"},
    ),
    "shared-render.yaml": (
        _render,
        {"example.com/render": {f"dri-renderD{n}::{i}" for n in (128, 129) for i in range(4)}},
        ("example.com/render", ["dri-renderD129::2"]),
        {"RENDER_NODES": "/dev/dri/renderD129", "RENDER_DEVICE_IDS": "dri-renderD129::2"},
    ),
}


def test_every_example_has_a_case() -> None:
    assert {
        p.name
        for p in EXAMPLES.glob("*.yaml")
        if "\napiVersion:" not in "\n" + p.read_text(encoding="utf-8")  # not pod manifests
    } == set(CASES)


def _pod(name: str, resource: str, count: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "containers": [{"name": "c", "image": "x", "resources": {"limits": {resource: count}}}]
        },
    }


@pytest.mark.parametrize("name", sorted(CASES))
async def test_example_through_the_emulator(name: str, host: FakeHost, sock_dir: Path) -> None:
    build, expected, (resource, ids), envs = CASES[name]
    build(host)
    dp_dir = sock_dir / "dp"
    dp_dir.mkdir()
    plugins = GenericPlugins(
        load_config(EXAMPLES / name),
        device_plugin_dir=dp_dir,
        dev_root=str(host.dev_root),
        sys_root=str(host.sys_root),
    )
    emu = Emulator(dp_dir, control_socket=False, dial_timeout_s=2.0)
    async with emu, plugins, asyncio.timeout(20):
        for res, want in expected.items():
            status = await emu.wait_for_resource(res, allocatable=len(want), timeout=10)
            assert {d.id for d in status.devices} == want
            assert status.capacity == len(want)
        pod = await emu.apply_pod(_pod("p", resource, len(ids)))
        got = pod.container("c")
        assert len(got.devices[resource]) == len(ids)
        runtime = got.runtime
        assert runtime.devices
        advertised = {
            d.host_path for dev in plugins.plugin(resource).snapshot for d in dev.device_specs
        }
        assert {d.host_path for d in runtime.devices} <= advertised
        assert plugins.plugin(resource).allocated  # the plugin knows what it handed out
        for key in envs:
            assert key in runtime.envs
        # the resource's exact envs, for the devices this pod got
        resp = (await emu.endpoint(resource).allocate(list(ids))).containers[0]
        assert resp.envs == envs

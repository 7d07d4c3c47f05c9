"""The generic plugin end to end through a kubelet double: hot-plug, health, allocate, reload."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from generic.gen_kubelet import KubeletDouble
from kubedevice.errors import ConfigError, PluginServerError
from kubedevice.generic import FakeHost, GenericPlugins, parse_config

SERIAL = {"name": "example.com/serial", "groups": [{"paths": [{"path": "/dev/ttyUSB*"}]}]}

#: A render node with a sysfs health check (see _add_render_node).
RENDER_ENABLE = "/sys/class/drm/renderD128/device/enable"
RENDER_CHECK = {"path": "/sys/class/drm/{name}/device/enable", "expect": "1"}
RENDER_GROUP = {
    "paths": [{"path": "/dev/dri/renderD*"}],
    "health": {"periodSeconds": 3600, "sysfsAttribute": RENDER_CHECK},
}
RENDER = {"name": "example.com/render", "groups": [RENDER_GROUP]}


def _add_render_node(host: FakeHost) -> None:
    """/dev/dri/renderD128, which passes RENDER_CHECK."""
    host.set_attr(RENDER_ENABLE, "1")
    host.add_char_device("/dev/dri/renderD128")


def _doc(host: FakeHost, *resources: dict[str, Any], **top: Any) -> dict[str, Any]:
    return {
        "version": "v1",
        "devRoot": str(host.dev_root),
        "sysRoot": str(host.sys_root),
        "resources": list(resources),
        **top,
    }


def _plugins(
    host: FakeHost, sock_dir: Path, *resources: dict[str, Any], **top: Any
) -> GenericPlugins:
    return GenericPlugins(parse_config(_doc(host, *resources, **top)), device_plugin_dir=sock_dir)


async def test_allocated_device_vanishes_unhealthy_and_comes_back(
    host: FakeHost, kubelet: KubeletDouble, sock_dir: Path
) -> None:
    host.add_char_device("/dev/ttyUSB0")
    host.add_char_device("/dev/ttyUSB1")
    async with _plugins(host, sock_dir, SERIAL) as plugins, asyncio.timeout(10):
        await kubelet.wait("example.com/serial", lambda s: len(s) == 2)
        await kubelet.allocate("example.com/serial", ["ttyUSB0"])
        assert plugins.plugin("example.com/serial").allocated == {"ttyUSB0"}
        host.remove("/dev/ttyUSB0")
        host.remove("/dev/ttyUSB1")
        snap = await kubelet.wait("example.com/serial", lambda s: "ttyUSB1" not in s)
        assert snap == {"ttyUSB0": "Unhealthy"}
        host.add_char_device("/dev/ttyUSB0")
        snap = await kubelet.wait("example.com/serial", lambda s: s.get("ttyUSB0") == "Healthy")
        assert snap == {"ttyUSB0": "Healthy"}


async def test_vanished_allocated_device_expires(
    host: FakeHost, kubelet: KubeletDouble, sock_dir: Path
) -> None:
    host.add_char_device("/dev/ttyUSB0")
    async with (
        _plugins(host, sock_dir, SERIAL, keepUnhealthySeconds=0.05) as plugins,
        asyncio.timeout(10),
    ):
        await kubelet.wait("example.com/serial", lambda s: bool(s))
        await kubelet.allocate("example.com/serial", ["ttyUSB0"])
        host.remove("/dev/ttyUSB0")
        await kubelet.wait("example.com/serial", lambda s: s == {"ttyUSB0": "Unhealthy"})
        await kubelet.wait("example.com/serial", lambda s: s == {})
        assert plugins.plugin("example.com/serial").allocated == frozenset()


async def test_directory_created_after_start_is_watched(
    host: FakeHost, kubelet: KubeletDouble, sock_dir: Path
) -> None:
    res = {"name": "example.com/render", "groups": [{"paths": [{"path": "/dev/dri/renderD*"}]}]}
    async with _plugins(host, sock_dir, res), asyncio.timeout(10):
        await kubelet.wait("example.com/render", lambda s: s == {})
        host.add_char_device("/dev/dri/renderD128")
        await kubelet.wait("example.com/render", lambda s: s == {"dri-renderD128": "Healthy"})
        host.add_char_device("/dev/dri/renderD129")
        await kubelet.wait("example.com/render", lambda s: len(s) == 2)
        host.remove("/dev/dri")
        await kubelet.wait("example.com/render", lambda s: s == {})
        host.add_char_device("/dev/dri/renderD130")
        await kubelet.wait("example.com/render", lambda s: s == {"dri-renderD130": "Healthy"})


async def test_usb_hotplug(host: FakeHost, kubelet: KubeletDouble, sock_dir: Path) -> None:
    res = {"name": "example.com/ftdi", "groups": [{"usb": [{"vendor": "0403", "product": "6001"}]}]}
    async with _plugins(host, sock_dir, res), asyncio.timeout(10):
        await kubelet.wait("example.com/ftdi", lambda s: s == {})
        name = host.add_usb("0403", "6001", "A1", busnum=1, devnum=4)
        await kubelet.wait("example.com/ftdi", lambda s: s == {"usb-0403-6001-A1": "Healthy"})
        resp = await kubelet.allocate("example.com/ftdi", ["usb-0403-6001-A1"])
        assert [(d.host_path, d.permissions) for d in resp.devices] == [
            ("/dev/bus/usb/001/004", "rw")
        ]
        host.remove_usb(name)
        await kubelet.wait("example.com/ftdi", lambda s: s == {"usb-0403-6001-A1": "Unhealthy"})
        host.add_usb("0403", "6001", "A1", busnum=2, devnum=9)  # re-plugged elsewhere: same ID
        await kubelet.wait("example.com/ftdi", lambda s: s == {"usb-0403-6001-A1": "Healthy"})
        resp = await kubelet.allocate("example.com/ftdi", ["usb-0403-6001-A1"])
        assert [d.host_path for d in resp.devices] == ["/dev/bus/usb/002/009"]


async def test_health_flapping_and_failing_source(
    host: FakeHost, kubelet: KubeletDouble, sock_dir: Path
) -> None:
    _add_render_node(host)
    group = {
        **RENDER_GROUP,
        "count": 2,
        "health": {"periodSeconds": 0.02, "sysfsAttribute": RENDER_CHECK},
    }
    res = {**RENDER, "groups": [group]}
    ids = ("dri-renderD128::0", "dri-renderD128::1")

    def all_(health: str) -> Any:
        return lambda s: set(s) == set(ids) and all(s[i] == health for i in ids)

    async with _plugins(host, sock_dir, res), asyncio.timeout(10):
        await kubelet.wait("example.com/render", all_("Healthy"))
        for _ in range(3):
            host.set_attr(RENDER_ENABLE, "0")
            await kubelet.wait("example.com/render", all_("Unhealthy"))
            host.set_attr(RENDER_ENABLE, "1")
            await kubelet.wait("example.com/render", all_("Healthy"))
        host.remove_attr(RENDER_ENABLE)  # the health source itself fails
        await kubelet.wait("example.com/render", all_("Unhealthy"))


async def test_allocate_renders_templates_and_dedupes_nodes(
    host: FakeHost, kubelet: KubeletDouble, sock_dir: Path
) -> None:
    host.add_char_device("/dev/video0")
    host.add_char_device("/dev/video1")
    res = {
        "name": "example.com/cam",
        "groups": [
            {
                "name": "cams",
                "paths": [
                    {"path": "/dev/video*", "containerPath": "/dev/cam-{name}", "permissions": "r"}
                ],
                "count": 2,
                "mounts": [
                    {
                        "hostPath": "/etc/cam.conf",
                        "containerPath": "/etc/cam.conf",
                        "readOnly": True,
                    }
                ],
                "envs": {
                    "CAMS": "{paths}",
                    "CAM_IDS": "{ids}",
                    "N": "{count}",
                    "R": "{resource}",
                    "HOST": "{hostPaths}",
                    "PHYS": "{devices}",
                },
                "annotations": {"example.com/cams": "{devices}"},
                "cdiDevices": ["example.com/cam={name}"],
            }
        ],
    }
    async with _plugins(host, sock_dir, res), asyncio.timeout(10):
        await kubelet.wait("example.com/cam", lambda s: len(s) == 4)
        resp = await kubelet.allocate("example.com/cam", ["video0::0", "video0::1", "video1::0"])
    assert dict(resp.envs) == {
        "CAMS": "/dev/cam-video0,/dev/cam-video1",
        "CAM_IDS": "video0::0,video0::1,video1::0",
        "N": "3",
        "R": "example.com/cam",
        "HOST": "/dev/video0,/dev/video1",
        "PHYS": "video0,video1",
    }
    assert dict(resp.annotations) == {"example.com/cams": "video0,video1"}
    assert [(d.container_path, d.host_path, d.permissions) for d in resp.devices] == [
        ("/dev/cam-video0", "/dev/video0", "r"),
        ("/dev/cam-video1", "/dev/video1", "r"),
    ]
    assert [(m.container_path, m.host_path, m.read_only) for m in resp.mounts] == [
        ("/etc/cam.conf", "/etc/cam.conf", True)
    ]
    assert [c.name for c in resp.cdi_devices] == [
        "example.com/cam=video0",
        "example.com/cam=video1",
    ]


async def test_preferred_allocation_uses_numa_and_placement(
    host: FakeHost, kubelet: KubeletDouble, sock_dir: Path
) -> None:
    host.add_char_device("/dev/dri/renderD128", numa_node=0, subsystem="drm")
    host.add_char_device("/dev/dri/renderD129", numa_node=1, subsystem="drm")
    host.add_char_device("/dev/dri/renderD130", numa_node=1, subsystem="drm")
    res = {
        "name": "example.com/render",
        "placement": "spread",
        "groups": [{"paths": [{"path": "/dev/dri/renderD*"}], "count": 2}],
    }
    async with _plugins(host, sock_dir, res), asyncio.timeout(10):
        snap = await kubelet.wait("example.com/render", lambda s: len(s) == 6)
        assert kubelet.plugins["example.com/render"].options.get_preferred_allocation_available
        topo = {
            d.ID: [n.ID for n in d.topology.nodes]
            for d in kubelet.latest_devices("example.com/render")
        }
        assert topo["dri-renderD128::1"] == [0]
        assert topo["dri-renderD130::0"] == [1]
        got = await kubelet.preferred("example.com/render", sorted(snap), [], 2)
        assert got == ["dri-renderD129::0", "dri-renderD130::0"]  # NUMA 1, two distinct GPUs
        got = await kubelet.preferred("example.com/render", sorted(snap), ["dri-renderD128::0"], 2)
        assert got == ["dri-renderD128::0", "dri-renderD128::1"]


async def test_reload_from_file_keeps_allocations(
    host: FakeHost, kubelet: KubeletDouble, sock_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    host.add_char_device("/dev/ttyUSB0")
    host.add_char_device("/dev/ttyUSB1")
    host.add_char_device("/dev/fuse")
    path = host.root / "config.yaml"

    def write(doc: dict[str, Any] | str) -> None:
        tmp = host.root / ".config.yaml.tmp"  # editors replace files: write, then rename
        tmp.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc))
        tmp.replace(path)

    write(_doc(host, SERIAL))
    from kubedevice.generic import load_config

    plugins = GenericPlugins(load_config(path), device_plugin_dir=sock_dir, config_path=path)
    async with plugins, asyncio.timeout(10):
        await kubelet.wait("example.com/serial", lambda s: len(s) == 2)
        await kubelet.allocate("example.com/serial", ["ttyUSB0"])
        # change serial (only ttyUSB1 now) and add fuse
        serial_v2 = {
            "name": "example.com/serial",
            "groups": [{"paths": [{"path": "/dev/ttyUSB1"}]}],
        }
        fuse = {
            "name": "example.com/fuse",
            "groups": [{"paths": [{"path": "/dev/fuse"}], "count": 2}],
        }
        write(_doc(host, serial_v2, fuse))
        await plugins.wait_reloaded(1)
        assert plugins.resources == ["example.com/serial", "example.com/fuse"]
        snap = await kubelet.wait("example.com/serial", lambda s: s.get("ttyUSB0") == "Unhealthy")
        assert snap == {"ttyUSB0": "Unhealthy", "ttyUSB1": "Healthy"}  # allocated one kept
        await kubelet.wait_registered("example.com/fuse")
        await kubelet.wait(
            "example.com/fuse", lambda s: s == {"fuse::0": "Healthy", "fuse::1": "Healthy"}
        )
        # an invalid config is rejected and the old one keeps running
        with caplog.at_level(logging.ERROR, logger="kubedevice.generic"):
            write("version: v1\nresources: [{name: example.com/serial, groups: [{count: 0}]}]\n")
            await plugins.wait_reloaded(2)
        assert any(
            "new config rejected" in r.getMessage()
            and "resources[0].groups[0].count: must be >= 1" in r.getMessage()
            for r in caplog.records
        )
        assert plugins.resources == ["example.com/serial", "example.com/fuse"]
        # removing a resource stops it; the plugin socket goes away
        write(_doc(host, serial_v2))
        await plugins.wait_reloaded(3)
        assert plugins.resources == ["example.com/serial"]
        assert not (sock_dir / "example.com-fuse.sock").exists()
        host.remove("/dev/ttyUSB1")  # hot-plug still works after reloads
        await kubelet.wait("example.com/serial", lambda s: s == {"ttyUSB0": "Unhealthy"})


async def test_failed_start_releases_everything(host: FakeHost, sock_dir: Path) -> None:
    host.add_char_device("/dev/ttyUSB0")
    blocker = sock_dir / "example.com-serial.sock"
    blocker.write_text("not a socket")  # never removed: it is not a socket
    plugins = _plugins(host, sock_dir, SERIAL)
    with pytest.raises(PluginServerError, match="exists and is not a socket"):
        await plugins.start()
    assert blocker.read_text() == "not a socket"
    assert plugins.server.resource_names == ()
    await plugins.stop()  # idempotent after a failed start
    with pytest.raises(RuntimeError, match="only once"):
        await plugins.start()


async def test_command_health_check(host: FakeHost, kubelet: KubeletDouble, sock_dir: Path) -> None:
    host.add_char_device("/dev/ttyUSB0")
    marker = host.root / "ok-ttyUSB0"
    marker.touch()
    probe = "import os, sys; sys.exit(0 if os.path.exists(sys.argv[1]) else 1)"
    res = {
        "name": "example.com/serial",
        "groups": [
            {
                "paths": [{"path": "/dev/ttyUSB*"}],
                "health": {
                    "periodSeconds": 0.05,
                    "command": {
                        "argv": [sys.executable, "-c", probe, f"{host.root}/ok-{{name}}"],
                        "timeoutSeconds": 10,
                    },
                },
            }
        ],
    }
    async with _plugins(host, sock_dir, res), asyncio.timeout(20):
        await kubelet.wait("example.com/serial", lambda s: s == {"ttyUSB0": "Healthy"})
        marker.unlink()
        await kubelet.wait("example.com/serial", lambda s: s == {"ttyUSB0": "Unhealthy"})
        marker.touch()
        await kubelet.wait("example.com/serial", lambda s: s == {"ttyUSB0": "Healthy"})


async def test_reload_that_keeps_the_health_check_keeps_the_result(
    host: FakeHost, kubelet: KubeletDouble, sock_dir: Path
) -> None:
    # Editing envs of a health-checked group must not flap its devices to Unhealthy
    # while the check reruns; changing the check itself does start from Unhealthy.
    _add_render_node(host)
    check, group, res = RENDER_CHECK, RENDER_GROUP, RENDER
    async with _plugins(host, sock_dir, res) as plugins, asyncio.timeout(10):
        await kubelet.wait("example.com/render", lambda s: s == {"dri-renderD128": "Healthy"})
        edited = {"name": "example.com/render", "groups": [{**group, "envs": {"A": "{ids}"}}]}
        await plugins.reload(parse_config(_doc(host, edited)))
        plugin = plugins.plugin("example.com/render")
        assert [(d.id, d.health) for d in plugin.snapshot] == [("dri-renderD128", "Healthy")]
        new_check = {
            **group,
            "health": {"periodSeconds": 3600, "sysfsAttribute": {**check, "expect": "2"}},
        }
        await plugins.reload(parse_config(_doc(host, {**res, "groups": [new_check]})))
        assert [(d.id, d.health) for d in plugin.snapshot] == [("dri-renderD128", "Unhealthy")]
        await kubelet.wait("example.com/render", lambda s: s == {"dri-renderD128": "Unhealthy"})
    seen = [s for _t, s, _r in kubelet.plugins["example.com/render"].snapshots]
    first_healthy = seen.index({"dri-renderD128": "Healthy"})  # before the first check: Unhealthy
    assert seen[first_healthy:] == [{"dri-renderD128": "Healthy"}, {"dri-renderD128": "Unhealthy"}]


async def test_hotplug_in_a_symlinked_directory(
    host: FakeHost, kubelet: KubeletDouble, sock_dir: Path
) -> None:
    host.add_char_device("/dev/gpu/renderD128")
    host.symlink("/dev/dri", "gpu")
    res = {"name": "example.com/render", "groups": [{"paths": [{"path": "/dev/dri/renderD*"}]}]}
    async with _plugins(host, sock_dir, res), asyncio.timeout(10):
        await kubelet.wait("example.com/render", lambda s: s == {"dri-renderD128": "Healthy"})
        host.add_char_device("/dev/gpu/renderD129")
        await kubelet.wait("example.com/render", lambda s: len(s) == 2)
        host.remove("/dev/dri")  # the link goes: so do its devices
        await kubelet.wait("example.com/render", lambda s: s == {})


async def test_usb_node_before_sysfs_on_a_new_bus(
    host: FakeHost, kubelet: KubeletDouble, sock_dir: Path
) -> None:
    # /dev/bus/usb/003 does not exist at start; the node appears before its sysfs entry.
    res = {"name": "example.com/ftdi", "groups": [{"usb": [{"vendor": "0403"}]}]}
    host.add_usb("1d6b", "0002", None, busnum=1, devnum=1, name="usb1")  # a hub: not matched
    async with _plugins(host, sock_dir, res), asyncio.timeout(10):
        await kubelet.wait("example.com/ftdi", lambda s: s == {})
        host.add_char_device("/dev/bus/usb/003/007")
        host.add_usb("0403", "6001", "Z", busnum=3, devnum=7)
        await kubelet.wait("example.com/ftdi", lambda s: s == {"usb-0403-6001-Z": "Healthy"})


async def test_config_file_deleted_then_recreated(
    host: FakeHost, kubelet: KubeletDouble, sock_dir: Path
) -> None:
    host.add_char_device("/dev/ttyUSB0")
    host.add_char_device("/dev/fuse")
    path = host.root / "config.yaml"
    path.write_text(yaml.safe_dump(_doc(host, SERIAL)))
    fuse = {"name": "example.com/fuse", "groups": [{"paths": [{"path": "/dev/fuse"}]}]}
    from kubedevice.generic import load_config

    plugins = GenericPlugins(load_config(path), device_plugin_dir=sock_dir, config_path=path)
    async with plugins, asyncio.timeout(10):
        await kubelet.wait("example.com/serial", lambda s: s == {"ttyUSB0": "Healthy"})
        path.unlink()  # deleting the file changes nothing
        with path.open("w") as f:  # re-created and written in place
            f.write(yaml.safe_dump(_doc(host, SERIAL, fuse)))
        await kubelet.wait_registered("example.com/fuse")
        await kubelet.wait("example.com/fuse", lambda s: s == {"fuse": "Healthy"})
        assert plugins.resources == ["example.com/serial", "example.com/fuse"]
        assert kubelet.latest("example.com/serial") == {"ttyUSB0": "Healthy"}


async def test_returning_device_is_checked_again_before_healthy(
    host: FakeHost, kubelet: KubeletDouble, sock_dir: Path
) -> None:
    # An allocated, health-checked device vanishes and comes back broken: the old
    # (passing) result must not make it Healthy until the next period.
    _add_render_node(host)
    sentinel = {"name": "example.com/sentinel", "groups": [{"paths": [{"path": "/dev/s*"}]}]}
    async with _plugins(host, sock_dir, RENDER, sentinel) as plugins, asyncio.timeout(10):
        await kubelet.wait("example.com/render", lambda s: s == {"dri-renderD128": "Healthy"})
        await kubelet.allocate("example.com/render", ["dri-renderD128"])
        host.remove("/dev/dri/renderD128")
        await kubelet.wait("example.com/render", lambda s: s == {"dri-renderD128": "Unhealthy"})
        host.set_attr(RENDER_ENABLE, "0")
        host.add_char_device("/dev/dri/renderD128")
        host.add_char_device("/dev/s0")  # scanned together with (or after) the node above
        await plugins.wait_for("example.com/sentinel", lambda s: len(s) == 1)
        render = plugins.plugin("example.com/render")
        assert [(d.id, d.health) for d in render.snapshot] == [("dri-renderD128", "Unhealthy")]
    seen = [s for _t, s, _r in kubelet.plugins["example.com/render"].snapshots]
    assert seen[-1] == {"dri-renderD128": "Unhealthy"}


async def test_stop_just_after_a_health_kick_does_not_hang(
    host: FakeHost, kubelet: KubeletDouble, sock_dir: Path
) -> None:
    # On Python 3.11, asyncio.wait_for drops a cancel that arrives as its awaitable
    # completes: the health loop then ignored stop() and slept for periodSeconds.
    _add_render_node(host)
    plugins = _plugins(host, sock_dir, RENDER)
    async with asyncio.timeout(10):
        await plugins.start()
        await plugins.wait_for("example.com/render", lambda s: s[0].health == "Healthy")
        host.add_char_device("/dev/dri/renderD129")
        plugins.rescan()  # a new, unchecked device kicks the health loop...
        await plugins.stop()  # ...and the cancel lands as that kick completes its wait


async def test_concurrent_reloads_apply_one_after_the_other(
    host: FakeHost, kubelet: KubeletDouble, sock_dir: Path
) -> None:
    host.add_char_device("/dev/ttyUSB0")
    host.add_char_device("/dev/fuse")
    fuse = {"name": "example.com/fuse", "groups": [{"paths": [{"path": "/dev/fuse"}]}]}
    async with _plugins(host, sock_dir, SERIAL) as plugins, asyncio.timeout(10):
        await kubelet.wait("example.com/serial", lambda s: s == {"ttyUSB0": "Healthy"})
        with_fuse = parse_config(_doc(host, SERIAL, fuse))
        without = parse_config(_doc(host, SERIAL))
        await asyncio.gather(plugins.reload(with_fuse), plugins.reload(without))
        assert plugins.resources == ["example.com/serial"]
        assert plugins.server.resource_names == ("example.com/serial",)
        assert not (sock_dir / "example.com-fuse.sock").exists()


@pytest.mark.parametrize("layout", ["symlinked-dir", "symlinked-file"])
async def test_config_reached_through_a_symlink_is_watched(
    host: FakeHost, kubelet: KubeletDouble, sock_dir: Path, layout: str
) -> None:
    host.add_char_device("/dev/ttyUSB0")
    host.add_char_device("/dev/fuse")
    real_dir = host.root / "etc-real"
    real_dir.mkdir()
    real = real_dir / "config.yaml"
    if layout == "symlinked-dir":  # e.g. /etc/kubedevice -> /config
        (host.root / "etc").symlink_to(real_dir)
        path = host.root / "etc" / "config.yaml"
    else:  # e.g. /etc/kubedevice/config.yaml -> /config/config.yaml
        (host.root / "etc").mkdir()
        path = host.root / "etc" / "config.yaml"
        path.symlink_to(real)
    real.write_text(yaml.safe_dump(_doc(host, SERIAL)))
    fuse = {"name": "example.com/fuse", "groups": [{"paths": [{"path": "/dev/fuse"}]}]}
    from kubedevice.generic import load_config

    plugins = GenericPlugins(load_config(path), device_plugin_dir=sock_dir, config_path=path)
    async with plugins, asyncio.timeout(10):
        await kubelet.wait("example.com/serial", lambda s: s == {"ttyUSB0": "Healthy"})
        tmp = real_dir / ".config.yaml.tmp"
        tmp.write_text(yaml.safe_dump(_doc(host, SERIAL, fuse)))
        tmp.replace(real)
        await plugins.wait_reloaded(1)
        assert plugins.resources == ["example.com/serial", "example.com/fuse"]


async def test_bad_metrics_address_is_a_clear_error(host: FakeHost, sock_dir: Path) -> None:
    import socket

    host.add_char_device("/dev/ttyUSB0")
    cfg = parse_config(_doc(host, SERIAL))
    with pytest.raises(ConfigError) as info:  # at once, before anything is started
        GenericPlugins(cfg, device_plugin_dir=sock_dir, metrics_address="nonsense")
    assert str(info.value) == (
        "metrics address: expected HOST:PORT with a port 0-65535 (got 'nonsense')"
    )
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        busy = GenericPlugins(cfg, device_plugin_dir=sock_dir, metrics_address=address)
        with pytest.raises(PluginServerError) as err:
            await busy.start()
    assert str(err.value) == f"cannot serve metrics on {address}: Address already in use"
    assert os.listdir(sock_dir) == []  # the plugin sockets were released


async def test_cancelled_stop_still_cleans_up_and_propagates(
    host: FakeHost, sock_dir: Path
) -> None:
    host.add_char_device("/dev/ttyUSB0")
    plugins = _plugins(host, sock_dir, SERIAL)
    async with asyncio.timeout(10):
        await plugins.start()
        assert os.listdir(sock_dir) == ["example.com-serial.sock"]
        stopping = asyncio.create_task(plugins.stop())
        await asyncio.sleep(0)  # one loop turn (a yield, not a timed wait): stop() now waits
        stopping.cancel()
        with pytest.raises(asyncio.CancelledError):
            await stopping
    assert os.listdir(sock_dir) == []


async def test_refused_reloads_leave_the_old_config_fully_in_force(
    host: FakeHost, kubelet: KubeletDouble, sock_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A reload is all or nothing: after a refused one the next valid one applies whole."""
    host.add_char_device("/dev/ttyUSB0")
    host.add_char_device("/dev/ttyUSB1")
    host.add_char_device("/dev/fuse")
    path = host.root / "config.yaml"
    only_usb1 = {"name": "example.com/serial", "groups": [{"paths": [{"path": "/dev/ttyUSB1"}]}]}
    fuse = {"name": "example.com/fuse", "groups": [{"paths": [{"path": "/dev/fuse"}]}]}
    a_b = {"name": "example.com/a-b", "groups": [{"paths": [{"path": "/dev/fuse"}]}]}
    a_b2 = {"name": "example.com-a/b", "groups": [{"paths": [{"path": "/dev/fuse"}]}]}

    def write(text: str) -> None:
        tmp = host.root / ".config.yaml.tmp"
        tmp.write_text(text)
        tmp.replace(path)

    write(yaml.safe_dump(_doc(host, SERIAL)))
    from kubedevice.generic import load_config

    plugins = GenericPlugins(load_config(path), device_plugin_dir=sock_dir, config_path=path)
    caplog.set_level(logging.ERROR, logger="kubedevice.generic")
    async with plugins, asyncio.timeout(20):
        await kubelet.wait("example.com/serial", lambda s: len(s) == 2)
        old = plugins.config
        # 1. Two names, one socket name: refused by validation.
        write(yaml.safe_dump(_doc(host, only_usb1, a_b, a_b2)))
        await plugins.wait_reloaded(1)
        # 2. A thousands-digit integer: refused by validation, no traceback.
        write(
            yaml.safe_dump(_doc(host, SERIAL)).replace(
                "groups:", "limit: " + "9" * 3000 + "\n  groups:", 1
            )
        )
        await plugins.wait_reloaded(2)
        # 3. Valid, but the new resource's socket path is taken by a file: refused while
        #    applying it, and undone: the changed resource keeps its old spec.
        blocker = sock_dir / "example.com-fuse.sock"
        blocker.write_text("not a socket")
        write(yaml.safe_dump(_doc(host, only_usb1, fuse)))
        await plugins.wait_reloaded(3)
        assert plugins.config == old
        assert plugins.resources == ["example.com/serial"]
        assert plugins.server.resource_names == ("example.com/serial",)
        assert plugins.plugin("example.com/serial").spec == old.resources[0]
        assert blocker.read_text() == "not a socket"
        errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert len(errors) == 3, [r.getMessage()[:200] for r in errors]
        assert all("new config rejected" in r.getMessage() for r in errors)
        assert all(r.exc_info is None for r in errors)
        assert "'example.com-a-b.sock'" in errors[0].getMessage()
        assert "out of range (got an integer of 3000 digits)" in errors[1].getMessage()
        assert "exists and is not a socket" in errors[2].getMessage()
        host.add_char_device("/dev/ttyUSB2")  # the old glob still applies
        await kubelet.wait("example.com/serial", lambda s: len(s) == 3)
        # 4. The next valid config applies whole (the same file again: SIGHUP's way).
        blocker.unlink()
        plugins.request_reload()
        await plugins.wait_reloaded(4)
        assert plugins.resources == ["example.com/serial", "example.com/fuse"]
        await kubelet.wait("example.com/serial", lambda s: s == {"ttyUSB1": "Healthy"})
        await kubelet.wait("example.com/fuse", lambda s: s == {"fuse": "Healthy"})


async def test_reload_hands_a_socket_name_to_a_new_resource(
    host: FakeHost, kubelet: KubeletDouble, sock_dir: Path
) -> None:
    host.add_char_device("/dev/fuse")
    a_b = {"name": "example.com/a-b", "groups": [{"paths": [{"path": "/dev/fuse"}]}]}
    a_b2 = {"name": "example.com-a/b", "groups": [{"paths": [{"path": "/dev/fuse"}]}]}
    async with _plugins(host, sock_dir, a_b) as plugins, asyncio.timeout(20):
        await kubelet.wait("example.com/a-b", lambda s: s == {"fuse": "Healthy"})
        await plugins.reload(parse_config(_doc(host, a_b2)))
        assert plugins.server.resource_names == ("example.com-a/b",)
        await kubelet.wait_registered("example.com-a/b")
        await kubelet.wait("example.com-a/b", lambda s: s == {"fuse": "Healthy"})


async def test_replicas_that_cannot_fit_one_message_are_refused_before_they_are_built(
    host: FakeHost, sock_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    for i in range(50):  # 50 devices x 10,000 replicas: about 13 MB of IDs
        host.add_char_device(f"/dev/ttyUSB{i}")
    res = {"name": "example.com/serial", "groups": [{"paths": [{"path": "/dev/ttyUSB*"}]}]}
    res["groups"][0]["count"] = 10000
    caplog.set_level(logging.ERROR, logger="kubedevice")
    async with _plugins(host, sock_dir, res) as plugins:
        plugin = plugins.plugin("example.com/serial")
        assert plugin.snapshot == ()  # nothing built, nothing sent
        errors = [r.getMessage() for r in caplog.records if r.name.startswith("kubedevice.generic")]
        assert len(errors) == 1, errors
        assert "500000 device IDs" in errors[0]
        assert "over the kubelet's limit of 4194304 bytes" in errors[0]
        for i in range(45):  # 5 devices x 10,000 replicas fit
            host.remove(f"/dev/ttyUSB{i}")
        async with asyncio.timeout(10):
            snap = await plugin.wait_for(lambda s: len(s) == 50_000)
        assert snap[0].id == "ttyUSB45::0"


async def test_encoded_size_is_exact(host: FakeHost) -> None:
    from kubedevice.generic.discovery import Scanner
    from kubedevice.generic.resource import GenericResourcePlugin
    from kubedevice.plugin import Health
    from kubedevice.plugin.servicer import encode_devices

    host.add_char_device("/dev/ttyUSB0", numa_node=0)
    host.add_char_device("/dev/ttyUSB1", numa_node=3)
    host.add_char_device("/dev/ttyUSB2")
    doc = _doc(host, {**SERIAL, "groups": [{"paths": [{"path": "/dev/ttyUSB*"}], "count": 123}]})
    config = parse_config(doc)
    plugin = GenericResourcePlugin(config.resources[0], 1.0)
    plugin.apply_scan(Scanner(config).scan()["example.com/serial"])
    snapshot = plugin.build_snapshot()
    assert {d.health for d in snapshot} == {Health.HEALTHY}
    assert plugin.encoded_size() == len(encode_devices(snapshot))
    host.remove("/dev/ttyUSB2")  # never allocated: dropped; ttyUSB1 allocated: Unhealthy
    await plugin.allocate([d for d in snapshot if d.id == "ttyUSB1::7"])
    host.remove("/dev/ttyUSB1")
    plugin.apply_scan(Scanner(config).scan()["example.com/serial"])
    snapshot = plugin.build_snapshot()
    assert {d.health for d in snapshot} == {Health.HEALTHY, Health.UNHEALTHY}
    assert plugin.encoded_size() == len(encode_devices(snapshot))

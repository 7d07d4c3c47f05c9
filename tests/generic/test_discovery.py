"""Discovery over fake trees: globs, groups, USB, NUMA, claims, limits, symlink escapes, IDs."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from kubedevice.generic import FakeHost, parse_config
from kubedevice.generic.discovery import PhysicalDevice, Scanner, watch_dirs
from kubedevice.generic.ids import sanitize_id


def _cfg(host: FakeHost, *resources: dict[str, Any]) -> Any:
    return parse_config(
        {
            "version": "v1",
            "devRoot": str(host.dev_root),
            "sysRoot": str(host.sys_root),
            "resources": list(resources),
        }
    )


def _scan(host: FakeHost, *resources: dict[str, Any]) -> dict[str, list[PhysicalDevice]]:
    return Scanner(_cfg(host, *resources)).scan()


def _ids(found: dict[str, list[PhysicalDevice]], name: str) -> list[str]:
    return [d.id for d in found[name]]


def test_glob_per_match(host: FakeHost) -> None:
    for n in (2, 0, 1):
        host.add_char_device(f"/dev/ttyUSB{n}")
    host.dev("/dev/ttyUSBdir").mkdir()  # directories never count
    found = _scan(host, {"name": "a.com/s", "groups": [{"paths": [{"path": "/dev/ttyUSB*"}]}]})
    assert _ids(found, "a.com/s") == ["ttyUSB0", "ttyUSB1", "ttyUSB2"]
    node = found["a.com/s"][0].nodes[0]
    assert (node.host_path, node.container_path, node.permissions) == (
        "/dev/ttyUSB0",
        "/dev/ttyUSB0",
        "rw",
    )
    assert node.local_path == str(host.dev("/dev/ttyUSB0"))


def test_container_path_template_and_extra_paths(host: FakeHost) -> None:
    host.add_char_device("/dev/video0")
    host.add_char_device("/dev/video1")
    host.add_char_device("/dev/media0")
    found = _scan(
        host,
        {
            "name": "a.com/v",
            "groups": [
                {
                    "paths": [
                        {"path": "/dev/video*", "containerPath": "/dev/cam-{name}"},
                        {"path": "/dev/media*", "permissions": "r"},
                        {"path": "/dev/absent", "optional": True},
                    ]
                }
            ],
        },
    )
    devs = found["a.com/v"]
    assert [d.id for d in devs] == ["video0", "video1"]
    assert [(n.container_path, n.permissions) for n in devs[1].nodes] == [
        ("/dev/cam-video1", "rw"),
        ("/dev/media0", "r"),
    ]


def test_required_extra_path_missing_means_no_devices(host: FakeHost) -> None:
    host.add_char_device("/dev/kvm")
    res = {
        "name": "a.com/k",
        "groups": [{"paths": [{"path": "/dev/kvm"}, {"path": "/dev/net/tun"}]}],
    }
    assert _scan(host, res)["a.com/k"] == []
    host.add_char_device("/dev/net/tun")
    assert _ids(_scan(host, res), "a.com/k") == ["kvm"]


def test_whole_group_is_one_device(host: FakeHost) -> None:
    host.add_char_device("/dev/kvm")
    host.add_char_device("/dev/net/tun")
    found = _scan(
        host,
        {
            "name": "a.com/k",
            "groups": [
                {
                    "name": "virt",
                    "perMatch": False,
                    "paths": [{"path": "/dev/kvm"}, {"path": "/dev/net/tun"}],
                }
            ],
        },
    )
    (dev,) = found["a.com/k"]
    assert dev.id == "virt"
    assert [n.host_path for n in dev.nodes] == ["/dev/kvm", "/dev/net/tun"]


def test_ordered_selectors_claim_devices(host: FakeHost) -> None:
    for n in range(4):
        host.add_char_device(f"/dev/ttyUSB{n}")
    found = _scan(
        host,
        {"name": "a.com/first", "groups": [{"paths": [{"path": "/dev/ttyUSB[01]"}]}]},
        {"name": "a.com/rest", "groups": [{"paths": [{"path": "/dev/ttyUSB*"}]}]},
    )
    assert _ids(found, "a.com/first") == ["ttyUSB0", "ttyUSB1"]
    assert _ids(found, "a.com/rest") == ["ttyUSB2", "ttyUSB3"]


def test_limit_leaves_the_rest_to_later_resources(host: FakeHost) -> None:
    for n in range(3):
        host.add_char_device(f"/dev/ttyS{n}")
    found = _scan(
        host,
        {"name": "a.com/one", "limit": 1, "groups": [{"paths": [{"path": "/dev/ttyS*"}]}]},
        {"name": "a.com/others", "groups": [{"paths": [{"path": "/dev/ttyS*"}]}]},
    )
    assert _ids(found, "a.com/one") == ["ttyS0"]
    assert _ids(found, "a.com/others") == ["ttyS1", "ttyS2"]


def test_symlink_escape_is_skipped_with_warning(
    host: FakeHost, caplog: pytest.LogCaptureFixture
) -> None:
    host.add_char_device("/dev/ttyUSB0")
    host.symlink("/dev/ttyUSB1", "/etc/hostname")
    host.symlink("/dev/ttyUSB2", str(host.root / "outside"))
    (host.root / "outside").touch()
    scanner = Scanner(
        _cfg(host, {"name": "a.com/s", "groups": [{"paths": [{"path": "/dev/ttyUSB*"}]}]})
    )
    with caplog.at_level(logging.WARNING, logger="kubedevice.generic"):
        found = scanner.scan()
        scanner.scan()
    assert _ids(found, "a.com/s") == ["ttyUSB0"]
    warnings = [r.getMessage() for r in caplog.records if "outside devRoot" in r.getMessage()]
    assert len(warnings) == 2  # once per path, not once per scan
    assert any("/dev/ttyUSB1" in w for w in warnings)


def test_symlink_inside_root_is_followed_and_claims_the_target(host: FakeHost) -> None:
    host.add_char_device("/dev/ttyUSB0")
    host.symlink("/dev/serial/by-id/usb-FTDI_A50285BI-port0", "../../ttyUSB0")
    found = _scan(
        host,
        {"name": "a.com/byid", "groups": [{"paths": [{"path": "/dev/serial/by-id/*"}]}]},
        {"name": "a.com/raw", "groups": [{"paths": [{"path": "/dev/ttyUSB*"}]}]},
    )
    (dev,) = found["a.com/byid"]
    assert dev.nodes[0].host_path == "/dev/serial/by-id/usb-FTDI_A50285BI-port0"
    assert dev.claims == ("/dev/ttyUSB0",)
    assert found["a.com/raw"] == []  # claimed through the symlink


def test_usb_matching(host: FakeHost) -> None:
    host.add_usb("0403", "6001", "A50285BI", busnum=1, devnum=5)
    host.add_usb("0403", "6015", None, busnum=2, devnum=3, name="2-1.4")
    host.add_usb("1d6b", "0002", None, busnum=1, devnum=1, name="usb1")
    found = _scan(
        host,
        {"name": "a.com/ft232", "groups": [{"usb": [{"vendor": "0403", "product": "6001"}]}]},
        {"name": "a.com/ftdi", "groups": [{"usb": [{"vendor": "0403"}]}]},
        {"name": "a.com/serial", "groups": [{"usb": [{"vendor": "1d6b", "serial": "nope"}]}]},
    )
    (ft232,) = found["a.com/ft232"]
    assert ft232.id == "usb-0403-6001-A50285BI"
    assert ft232.nodes[0].host_path == "/dev/bus/usb/001/005"
    assert _ids(found, "a.com/ftdi") == ["usb-0403-6015-2-1.4"]
    assert found["a.com/serial"] == []


def test_usb_without_node_is_not_offered(host: FakeHost) -> None:
    host.add_usb("0403", "6001", "X", busnum=1, devnum=7)
    host.remove("/dev/bus/usb/001/007")
    found = _scan(host, {"name": "a.com/u", "groups": [{"usb": [{"vendor": "0403"}]}]})
    assert found["a.com/u"] == []


def test_numa_from_class_entry_and_pci_parent(host: FakeHost) -> None:
    host.add_char_device("/dev/dri/renderD128", numa_node=1, subsystem="drm")
    host.add_char_device("/dev/dri/renderD129", numa_node=-1, subsystem="drm")
    host.add_char_device("/dev/dri/renderD130")
    host.add_usb("0403", "6001", "S", busnum=3, devnum=2, numa_node=0)
    found = _scan(
        host,
        {"name": "a.com/r", "groups": [{"paths": [{"path": "/dev/dri/renderD*"}]}]},
        {"name": "a.com/u", "groups": [{"usb": [{"vendor": "0403"}]}]},
    )
    assert [d.numa_node for d in found["a.com/r"]] == [1, None, None]
    assert found["a.com/u"][0].numa_node == 0


def test_ids_are_stable_across_scanners(host: FakeHost) -> None:
    for path in ("/dev/dri/renderD128", "/dev/serial/by-path/pci-0000:00:14.0-usb-0:1:1.0-port0"):
        host.add_char_device(path)
    res = {
        "name": "a.com/x",
        "groups": [
            {"paths": [{"path": "/dev/dri/*"}]},
            {"paths": [{"path": "/dev/serial/by-path/*"}]},
        ],
    }
    first = _ids(_scan(host, res), "a.com/x")
    second = _ids(_scan(host, res), "a.com/x")
    assert first == second
    assert first[0] == "dri-renderD128"
    assert all(len(i) <= 63 for i in first)
    assert first[1] == sanitize_id("serial/by-path/pci-0000:00:14.0-usb-0:1:1.0-port0")


def test_replica_suffix_fits_63_characters(host: FakeHost) -> None:
    host.add_char_device("/dev/" + "x" * 80)
    found = _scan(
        host, {"name": "a.com/x", "groups": [{"paths": [{"path": "/dev/x*"}], "count": 100}]}
    )
    (dev,) = found["a.com/x"]
    assert len(dev.id + "::99") <= 63


def test_watch_dirs(host: FakeHost) -> None:
    cfg = _cfg(
        host,
        {"name": "a.com/r", "groups": [{"paths": [{"path": "/dev/dri/renderD*"}]}]},
        {"name": "a.com/u", "groups": [{"usb": [{"vendor": "0403"}]}]},
    )
    dev, sys = str(host.dev_root), str(host.sys_root)
    # nothing exists yet: the nearest existing ancestors are watched
    assert watch_dirs(cfg) == {dev, sys}
    host.add_char_device("/dev/dri/renderD128")
    host.add_usb("0403", "6001", "S", busnum=1, devnum=2)
    assert watch_dirs(cfg) == {
        f"{dev}/dri",
        f"{dev}/bus/usb",
        f"{dev}/bus/usb/001",
        f"{sys}/bus/usb/devices",
    }


def test_colliding_ids_in_one_resource_stay_distinct(host: FakeHost) -> None:
    host.add_char_device("/dev/vhost-net")
    host.add_char_device("/dev/vhost/net")
    found = _scan(
        host,
        {
            "name": "a.com/v",
            "groups": [
                {"paths": [{"path": "/dev/vhost-net"}]},
                {"paths": [{"path": "/dev/vhost/net"}]},
            ],
        },
    )
    ids = _ids(found, "a.com/v")
    assert ids[0] == "vhost-net"
    assert len(set(ids)) == 2
    assert ids == _ids(
        _scan(
            host,
            {
                "name": "a.com/v",
                "groups": [
                    {"paths": [{"path": "/dev/vhost-net"}]},
                    {"paths": [{"path": "/dev/vhost/net"}]},
                ],
            },
        ),
        "a.com/v",
    )


def test_whole_group_of_absent_optional_paths_is_not_offered(host: FakeHost) -> None:
    res = {
        "name": "a.com/o",
        "groups": [
            {"name": "o", "perMatch": False, "paths": [{"path": "/dev/x*", "optional": True}]}
        ],
    }
    assert _scan(host, res)["a.com/o"] == []
    host.add_char_device("/dev/x1")
    assert _ids(_scan(host, res), "a.com/o") == ["o"]


def test_limit_keeps_devices_already_offered(host: FakeHost) -> None:
    # A device that appears later (and sorts first) must not displace one already
    # advertised, which may be allocated; the limit still holds.
    host.add_char_device("/dev/ttyS1")
    host.add_char_device("/dev/ttyS2")
    scanner = Scanner(
        _cfg(
            host,
            {"name": "a.com/one", "limit": 2, "groups": [{"paths": [{"path": "/dev/ttyS*"}]}]},
            {"name": "a.com/rest", "groups": [{"paths": [{"path": "/dev/ttyS*"}]}]},
        )
    )
    assert _ids(scanner.scan(), "a.com/one") == ["ttyS1", "ttyS2"]
    host.add_char_device("/dev/ttyS0")
    found = scanner.scan()
    assert _ids(found, "a.com/one") == ["ttyS1", "ttyS2"]
    assert _ids(found, "a.com/rest") == ["ttyS0"]
    host.remove("/dev/ttyS2")  # a slot frees up: the next device in discovery order
    found = scanner.scan()
    assert _ids(found, "a.com/one") == ["ttyS0", "ttyS1"]
    assert _ids(found, "a.com/rest") == []


def test_watch_dirs_resolve_symlinked_directories(host: FakeHost) -> None:
    # inotify does not follow a symlinked directory (DONT_FOLLOW): watch its target, and
    # the directory holding the link so that replacing the link is seen.
    host.add_char_device("/dev/gpu/renderD128")
    host.symlink("/dev/dri", "gpu")
    cfg = _cfg(host, {"name": "a.com/r", "groups": [{"paths": [{"path": "/dev/dri/renderD*"}]}]})
    dev = str(host.dev_root)
    assert watch_dirs(cfg) == {f"{dev}/gpu", dev}
    host.remove("/dev/dri")
    host.symlink("/dev/dri", str(host.root / "elsewhere"))
    (host.root / "elsewhere").mkdir()
    assert watch_dirs(cfg) == {dev}  # the target is outside devRoot: only the link's dir


def test_directory_and_sysfs_symlinks_out_of_the_roots_are_not_followed(host: FakeHost) -> None:
    outside = host.root / "outside"
    (outside / "dri").mkdir(parents=True)
    (outside / "dri" / "renderD128").touch()
    (outside / "usb").mkdir()
    for attr, value in {"idVendor": "0403", "idProduct": "6001", "busnum": "1"}.items():
        (outside / "usb" / attr).write_text(value + "\n")
    (outside / "usb" / "devnum").write_text("9\n")
    (outside / "numa_node").write_text("1\n")
    # a directory symlink in the glob path
    host.symlink("/dev/dri", str(outside / "dri"))
    # a whole USB sysfs entry outside sysRoot
    links = host.sys_root / "bus" / "usb" / "devices"
    links.mkdir(parents=True)
    (links / "1-9").symlink_to(outside / "usb")
    host.add_char_device("/dev/bus/usb/001/009")
    # a USB device inside sysRoot whose idVendor attribute is a link out of it
    name = host.add_usb("1d6b", "0002", None, busnum=2, devnum=3)
    vendor = host.sys_root / "bus" / "usb" / "devices" / name / "idVendor"
    vendor.unlink()
    vendor.symlink_to(outside / "usb" / "idVendor")
    # a class entry whose ``device`` link (with numa_node) points out of sysRoot
    host.add_char_device("/dev/video0")
    (host.sys_root / "class" / "video4linux" / "video0").mkdir(parents=True)
    (host.sys_root / "class" / "video4linux" / "video0" / "device").symlink_to(outside)
    found = _scan(
        host,
        {"name": "a.com/r", "groups": [{"paths": [{"path": "/dev/dri/*"}]}]},
        {"name": "a.com/u", "groups": [{"usb": [{"vendor": "0403"}]}]},
        {"name": "a.com/v", "groups": [{"paths": [{"path": "/dev/video*"}]}]},
    )
    assert found["a.com/r"] == []
    assert found["a.com/u"] == []
    assert [(d.id, d.numa_node) for d in found["a.com/v"]] == [("video0", None)]

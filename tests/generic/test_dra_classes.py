"""The /dev DRA driver's DeviceClasses select exactly the devices of their resource name."""

from __future__ import annotations

from pathlib import Path

import pytest
from dra.selectors import matches

from kubedevice.errors import ConfigError
from kubedevice.generic.config import parse_config
from kubedevice.generic.dra import GenericDraDriver
from kubedevice.generic.dra.classes import device_classes
from kubedevice.generic.fake import FakeHost

CONFIG = {
    "version": "v1",
    "resources": [
        {"name": "example.com/serial", "groups": [{"paths": [{"path": "/dev/ttyUSB*"}]}]},
        {"name": "example.com/fuse", "groups": [{"paths": [{"path": "/dev/fuse"}], "count": 3}]},
        {"name": "example.com/serial2", "groups": [{"paths": [{"path": "/dev/ttyACM*"}]}]},
    ],
}


def test_each_class_selects_its_resources_devices(tmp_path: Path) -> None:
    host = FakeHost(tmp_path)
    for node in ("/dev/ttyUSB0", "/dev/ttyUSB1", "/dev/fuse", "/dev/ttyACM0"):
        host.add_char_device(node)
    config = parse_config(CONFIG).with_roots(str(host.dev_root), str(host.sys_root))
    devices = GenericDraDriver(config).scan()
    classes = device_classes(config, "dev.example.com")
    assert [c["spec"]["extendedResourceName"] for c in classes] == [
        r["name"] for r in CONFIG["resources"]
    ]
    want = {"example.com/serial": 2, "example.com/fuse": 3, "example.com/serial2": 1}
    for cls in classes:
        [sel] = cls["spec"]["selectors"]
        chosen = [d for d in devices if matches(sel["cel"]["expression"], "dev.example.com", d)]
        name = cls["spec"]["extendedResourceName"]
        assert len(chosen) == want[name]
        assert {d.attributes["resource"] for d in chosen} == {name}
        assert "config" not in cls["spec"]


def test_names_that_the_resource_attribute_cannot_tell_apart_are_refused() -> None:
    prefix = "example.com/" + "a" * 52
    config = parse_config(
        {
            "version": "v1",
            "resources": [
                {"name": prefix + suffix, "groups": [{"paths": [{"path": f"/dev/x{suffix}"}]}]}
                for suffix in ("-one", "-two")
            ],
        }
    )
    with pytest.raises(ConfigError, match="first 64 characters"):
        device_classes(config, "dev.example.com")

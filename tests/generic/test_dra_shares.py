"""``shares: N`` on a generic group: one device the scheduler may give to N claims."""

from __future__ import annotations

from pathlib import Path

import pytest

from kubedevice.dra.api.slices import device_object
from kubedevice.errors import ConfigError
from kubedevice.generic.config import parse_config
from kubedevice.generic.dra import GenericDraDriver
from kubedevice.generic.fake import FakeHost


def _config(**group: object) -> dict[str, object]:
    return {
        "version": "v1",
        "resources": [
            {
                "name": "example.com/serial",
                "groups": [{"paths": [{"path": "/dev/ttyUSB*"}], **group}],
            }
        ],
    }


def test_a_shared_group_publishes_one_device_of_n_shares(tmp_path: Path) -> None:
    host = FakeHost(tmp_path)
    host.add_char_device("/dev/ttyUSB0")
    config = parse_config(_config(shares=3)).with_roots(str(host.dev_root), str(host.sys_root))
    [device] = GenericDraDriver(config).scan()
    assert device.allow_multiple_allocations
    body = device_object(device)
    assert body["allowMultipleAllocations"] is True
    assert body["capacity"] == {
        "shares": {
            "value": "3",
            "requestPolicy": {"default": "1", "validRange": {"min": "1", "step": "1"}},
        }
    }
    # without shares: a plain device, as before
    plain = parse_config(_config()).with_roots(str(host.dev_root), str(host.sys_root))
    [whole] = GenericDraDriver(plain).scan()
    assert "allowMultipleAllocations" not in device_object(whole)
    assert "capacity" not in device_object(whole)


@pytest.mark.parametrize(
    ("group", "error"),
    [
        ({"shares": 1}, "resources[0].groups[0].shares: must be >= 2 (got 1)"),
        ({"shares": 2, "count": 2}, "resources[0].groups[0].shares: not with count > 1"),
    ],
)
def test_bad_shares_are_refused_naming_the_field(group: dict[str, object], error: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(_config(**group), "config.yaml")
    assert f"config.yaml: {error}" in str(caught.value)

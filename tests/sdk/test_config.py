"""Resource-name rule (contract.md#resource-names), socket names and the plugin-dir precedence."""

from __future__ import annotations

from pathlib import Path

import pytest

import kubedevice
from kubedevice.plugin.config import validate_socket_name


@pytest.mark.parametrize(
    "name",
    ["example.com/gpu", "nvidia.com/GPU", "a.b-c.d/x_y.z-1", "x/" + "a" * 63, "e" * 244 + "/x"],
)
def test_valid_names(name: str) -> None:
    assert kubedevice.validate_resource_name(name) == name


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("Example.com/gpu", "DNS-1123"),
        ("gpu", "no domain"),
        ("a/b/c", "exactly one '/'"),
        ("kubernetes.io/foo", "reserved"),
        ("foo.kubernetes.io/x", "reserved"),
        ("example.com/-x", "start and end"),
        ("requests.example.com/x", "requests."),
        ("example.com/", "empty"),
        ("/gpu", "DNS-1123"),
        ("example.com/" + "a" * 64, "at most 63"),
        ("e" * 245 + "/x", "too long"),
        ("", "empty"),
        ("exa_mple.com/x", "DNS-1123"),
    ],
)
def test_invalid_names(name: str, reason: str) -> None:
    with pytest.raises(kubedevice.InvalidResourceNameError) as err:
        kubedevice.validate_resource_name(name)
    assert reason in str(err.value)
    assert err.value.name == name
    assert isinstance(err.value, kubedevice.ConfigError)


def test_default_socket_name() -> None:
    assert kubedevice.default_socket_name("example.com/foo") == "example.com-foo.sock"


@pytest.mark.parametrize("bad", ["", "a/b.sock", "kubelet.sock", ".hidden.sock"])
def test_bad_socket_names(bad: str) -> None:
    with pytest.raises(kubedevice.ConfigError):
        validate_socket_name(bad)


def test_plugin_dir_precedence(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("DP_DEVICE_PLUGIN_DIR", raising=False)
    assert kubedevice.resolve_device_plugin_dir(None) == Path("/var/lib/kubelet/device-plugins")
    monkeypatch.setenv("DP_DEVICE_PLUGIN_DIR", str(tmp_path / "env"))
    assert kubedevice.resolve_device_plugin_dir(None) == tmp_path / "env"
    assert kubedevice.resolve_device_plugin_dir(tmp_path / "x") == tmp_path / "x"

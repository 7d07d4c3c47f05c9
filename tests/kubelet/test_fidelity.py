"""Kubelet behaviours: disconnect health, topology manager policies, strict manifests."""

from __future__ import annotations

import pytest
from kubelet_helpers import PluginFactory, pod_manifest
from rawplugin import devs

from kubedevice.errors import ManifestError
from kubedevice.kubelet import Emulator
from kubedevice.kubelet.pods import parse_pod

R = "example.com/foo"


async def test_disconnected_plugin_devices_are_unhealthy(
    emu: Emulator, plugin: PluginFactory
) -> None:
    p = await plugin(R, devs(2))
    await emu.wait_for_resource(R, allocatable=2)
    await p.stop()
    s = await emu.wait_for_resource(R, allocatable=0)
    assert s.capacity == 2
    assert [(d.id, d.health) for d in s.devices] == [("d0", "Unhealthy"), ("d1", "Unhealthy")]
    assert emu.node().to_dict()["resources"][R]["devices"][0]["health"] == "Unhealthy"


def test_unknown_field_is_refused() -> None:
    m = pod_manifest("p", {})
    m["spec"]["containers"][0]["resources"] = {"request": {R: 1}}
    with pytest.raises(ManifestError) as err:
        parse_pod(m)
    assert str(err.value) == (
        'Pod in version "v1" cannot be handled as a Pod: strict decoding error: '
        'unknown field "spec.containers[0].resources.request"'
    )


def test_several_unknown_fields_all_named() -> None:
    m = pod_manifest("p", {})
    m["spec"]["nodeSelectr"] = {"a": "b"}
    m["metadata"]["label"] = {"a": "b"}
    m["spec"]["containers"][0]["env"] = [{"name": "A", "vaule": "1"}]
    with pytest.raises(ManifestError) as err:
        parse_pod(m)
    msg = str(err.value)
    for f in ("metadata.label", "spec.nodeSelectr", "spec.containers[0].env[0].vaule"):
        assert f'unknown field "{f}"' in msg


def test_known_fields_accepted() -> None:
    m = pod_manifest("p", {R: 1})
    m["metadata"]["labels"] = {"app": "x"}
    m["metadata"]["annotations"] = {"any/key": "v"}
    m["spec"]["nodeSelector"] = {"kubernetes.io/hostname": "n"}
    m["spec"]["containers"][0]["env"] = [{"name": "A", "value": "1"}]
    m["spec"]["containers"][0]["command"] = ["sh", "-c", "true"]
    m["spec"]["containers"][0]["ports"] = [{"containerPort": 80}]
    m["spec"]["volumes"] = [{"name": "v", "emptyDir": {}}]
    m["status"] = {"phase": "Pending"}
    assert parse_pod(m).containers[0].limits == {R: 1}


def test_container_without_image_refused() -> None:
    m = pod_manifest("p", {})
    del m["spec"]["containers"][0]["image"]
    with pytest.raises(ManifestError) as err:
        parse_pod(m)
    assert str(err.value) == 'Pod "p" is invalid: spec.containers[0].image: Required value'

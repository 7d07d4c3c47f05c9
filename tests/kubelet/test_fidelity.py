"""Kubelet behaviours: disconnect health, topology manager policies, strict manifests."""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from kubelet_helpers import PluginFactory, pod_manifest
from rawplugin import Dev, devs

from kubedevice.errors import AdmissionError, ManifestError
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


# ---------------------------------------------------------------- topology manager


def _two_nodes(ids: str) -> list[Dev]:
    """Devices named in ``ids`` (e.g. "0011": d0, d1 on node 0, d2, d3 on node 1)."""
    return [Dev(f"d{i}", numa=(int(n),)) for i, n in enumerate(ids)]


@pytest.fixture
async def temu(request: pytest.FixtureRequest, dp_dir: Path) -> AsyncIterator[Emulator]:
    policy, scope = request.param
    async with Emulator(
        dp_dir,
        control_socket=False,
        dial_timeout_s=2.0,
        topology_manager_policy=policy,
        topology_manager_scope=scope,
    ) as e:
        yield e


async def test_default_policy_none_offers_every_device(
    emu: Emulator, plugin: PluginFactory
) -> None:
    p = await plugin(R, _two_nodes("0011"), preferred_available=True)
    await emu.wait_for_resource(R, allocatable=4)
    p.preferred_fn = lambda avail, must, size: avail[-size:]
    pod = await emu.apply_pod(pod_manifest("p", {R: 1}))
    # policy none: no NUMA hint, GetPreferredAllocation sees the whole available set
    assert p.calls.preferred == [(["d0", "d1", "d2", "d3"], [], 1)]
    assert pod.container("c").devices[R] == ("d3",)


@pytest.mark.parametrize(
    ("temu", "admitted"),
    [
        (("none", "container"), True),
        (("best-effort", "container"), True),
        (("restricted", "container"), False),
        (("single-numa-node", "container"), False),
    ],
    indirect=["temu"],
)
async def test_strict_policies_refuse_unaligned(
    temu: Emulator, plugin: PluginFactory, admitted: bool
) -> None:
    # one free device per node (the others unhealthy): 2 devices could fit one node on
    # this machine (the preferred width is 1), but only both nodes together have them free
    devices = _two_nodes("0011")
    devices[0] = Dev("d0", "Unhealthy", (0,))
    devices[2] = Dev("d2", "Unhealthy", (1,))
    await plugin(R, devices)
    await temu.wait_for_resource(R, allocatable=2)
    if admitted:
        pod = await temu.apply_pod(pod_manifest("two", {R: 2}))
        assert pod.container("c").devices[R] == ("d1", "d3")
    else:
        with pytest.raises(AdmissionError) as err:
            await temu.apply_pod(pod_manifest("two", {R: 2}))
        assert err.value.reason == "TopologyAffinityError"
        assert err.value.message == "Resources cannot be allocated with Topology locality"
        assert temu.node().resources[R].allocated == 0
        assert temu.pods() == []


@pytest.mark.parametrize(
    ("temu", "admitted"),
    [(("restricted", "container"), True), (("single-numa-node", "container"), False)],
    indirect=["temu"],
)
async def test_single_numa_node_refuses_a_request_wider_than_a_node(
    temu: Emulator, plugin: PluginFactory, admitted: bool
) -> None:
    await plugin(R, _two_nodes("0011"))
    await temu.wait_for_resource(R, allocatable=4)
    # 3 devices need both nodes: preferred for restricted, never single-node
    if admitted:
        await temu.apply_pod(pod_manifest("three", {R: 3}))
    else:
        with pytest.raises(AdmissionError) as err:
            await temu.apply_pod(pod_manifest("three", {R: 3}))
        assert err.value.reason == "TopologyAffinityError"


@pytest.mark.parametrize(
    ("temu", "want"),
    [
        (("single-numa-node", "container"), {"a": ("d0",), "b": ("d1",)}),
        (("single-numa-node", "pod"), {"a": ("d1",), "b": ("d2",)}),
    ],
    indirect=["temu"],
)
async def test_pod_scope_aligns_the_whole_pod(
    temu: Emulator, plugin: PluginFactory, want: dict[str, tuple[str, ...]]
) -> None:
    await plugin(R, _two_nodes("011"))
    await temu.wait_for_resource(R, allocatable=3)
    pod = await temu.apply_pod(pod_manifest("p", containers=[("a", {R: 1}), ("b", {R: 1})]))
    assert {c.name: c.devices[R] for c in pod.containers} == want


@pytest.mark.parametrize("temu", [("best-effort", "container")], indirect=True)
async def test_admission_decisions_logged_at_debug(
    temu: Emulator, plugin: PluginFactory, caplog: pytest.LogCaptureFixture
) -> None:
    p = await plugin(R, _two_nodes("0011"), preferred_available=True)
    await temu.wait_for_resource(R, allocatable=4)
    caplog.set_level(logging.DEBUG, logger="kubedevice.kubelet.admission")
    await temu.apply_pod(pod_manifest("p", {R: 1}))
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "hints" in text
    assert "example.com/foo" in text
    assert "best hint" in text
    assert "GetPreferredAllocation" in text
    assert "chosen d0" in text
    assert p.calls.preferred


def test_cli_refuses_unknown_policy() -> None:
    r = subprocess.run(
        [str(Path(sys.executable).parent / "kubedevice"), "kubelet",
         "--topology-manager-policy", "bogus"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert r.returncode == 2
    assert "'bogus' is not one of 'none', 'best-effort', 'restricted'" in r.stderr

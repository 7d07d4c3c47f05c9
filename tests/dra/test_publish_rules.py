"""What the API server takes, on a real API server: slice names that never collide, devices
checked in bytes (one bad device never costs the pool), quantities in canonical form (an
unchanged pool is never written again)."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import kubedevice.dra as dra
from dra.api import RESOURCE, Api
from kubedevice.dra.api.kube import KubeClient
from kubedevice.dra.api.slices import SlicePublisher, slice_name
from kubedevice.dra.model.quantity import canonical_quantity

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
async def kube(kubeconfig: Path) -> AsyncIterator[KubeClient]:
    client = KubeClient.connect(kubeconfig)
    try:
        yield client
    finally:
        client.close()


def _node(api: Api, name: str) -> str:
    api.call("POST", "/api/v1/nodes", {"metadata": {"name": name}})
    return name


def _devices(count: int, prefix: str = "d") -> list[dra.Device]:
    return [dra.Device(name=f"{prefix}-{i}", attributes={"index": i}) for i in range(count)]


async def test_slice_names_never_collide_across_drivers_and_nodes(
    api: Api, kube: KubeClient
) -> None:
    base = f"dgx{uuid.uuid4().hex[:6]}"
    # <node>-<driver> is the same string for both pairs: "dgx…-a100-gpu.example.com"
    pairs = [
        (_node(api, base), "a100-gpu.example.com"),
        (_node(api, f"{base}-a100"), "gpu.example.com"),
    ]
    assert {f"{n}-{d}" for n, d in pairs} == {f"{base}-a100-gpu.example.com"}
    for node, driver in pairs:
        await SlicePublisher(kube, driver, node).reconcile(_devices(2))
    for node, driver in pairs:
        slices = api.slices(driver, node)
        assert len(slices) == 1, (node, driver)
        assert [d["name"] for d in slices[0]["spec"]["devices"]] == ["d-0", "d-1"]
        assert slices[0]["metadata"]["name"].startswith(f"{node}-{driver}-")


async def test_slices_named_by_an_earlier_version_are_adopted_not_duplicated(
    api: Api, kube: KubeClient, node_name: str
) -> None:
    driver = "old.example.com"
    old = slice_name(driver, node_name, 0)  # <node>-<driver>-0
    api.call("POST", f"{RESOURCE}/resourceslices", {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": old},
        "spec": {"driver": driver, "nodeName": node_name,
                 "pool": {"name": node_name, "generation": 3, "resourceSliceCount": 1},
                 "devices": [{"name": "d-0"}]},
    })  # fmt: skip
    publisher = SlicePublisher(kube, driver, node_name)
    await publisher.reconcile(_devices(200))  # two slices now
    slices = api.slices(driver, node_name)
    assert len(slices) == 2
    assert old in {s["metadata"]["name"] for s in slices}  # adopted in place
    assert {s["spec"]["pool"]["generation"] for s in slices} == {4}
    await publisher.reconcile(_devices(1))  # back to one: the other is deleted
    assert len(api.slices(driver, node_name)) == 1


async def test_devices_the_api_server_would_refuse_are_left_out_and_named(
    api: Api, kube: KubeClient, node_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    long_domain = ".".join(["domain"] * 10) + ".example.com"  # 81 bytes, a DNS subdomain
    devices = [
        dra.Device(name="ok-0", attributes={"model": "plain"}),
        dra.Device(name="wide-0", attributes={"model": "é" * 40}),  # 40 characters, 80 bytes
        dra.Device(name="domain-0", attributes={f"{long_domain}/model": "x"}),
        dra.Device(name="ok-1", attributes={"model": "ü" * 32}),  # 64 bytes: fine
    ]
    caplog.set_level(logging.WARNING, "kubedevice.dra.api.slices")
    await SlicePublisher(kube, "bytes.example.com", node_name).reconcile(devices)
    slices = api.slices("bytes.example.com", node_name)
    assert [d["name"] for s in slices for d in s["spec"]["devices"]] == ["ok-0", "ok-1"]
    text = caplog.text
    assert "device wide-0 is not published: attribute 'model': the string is 80 bytes" in text
    assert f"device domain-0 is not published: attribute '{long_domain}/model'" in text


async def test_a_non_ascii_dev_path_keeps_the_generic_device_published(
    tmp_path: Path, api: Api, kube: KubeClient, node_name: str
) -> None:
    from kubedevice.generic import FakeHost, load_config
    from kubedevice.generic.dra import GenericDraDriver

    host = FakeHost(tmp_path / "host")
    path = "/dev/e2e/" + "ж" * 30  # 39 characters, 69 bytes
    host.add_char_device(path)
    config = tmp_path / "c.yaml"
    config.write_text(
        f"version: v1\ndevRoot: {host.dev_root}\nsysRoot: {host.sys_root}\n"
        "resources:\n  - name: example.com/e2e\n    groups:\n"
        "      - name: e2e\n        paths:\n          - path: /dev/e2e/*\n"
    )
    driver = GenericDraDriver(load_config(config))
    snapshots = driver.devices()
    devices = await asyncio.wait_for(anext(snapshots), 30)
    await snapshots.aclose()
    assert len(devices) == 1
    await SlicePublisher(kube, "generic.example.com", node_name).reconcile(devices)
    [published] = [
        d for s in api.slices("generic.example.com", node_name) for d in s["spec"]["devices"]
    ]
    assert "path" not in published["attributes"]  # over 64 bytes: left out, the device kept
    assert published["attributes"]["resource"] == {"string": "example.com/e2e"}


QUANTITIES = ["1024Mi", "1000", "1.5Gi", "0.5Ki", "100m", "2000000n", "1e3", "1500", "80Gi", 1000]


async def test_quantities_are_sent_as_the_api_server_stores_them(
    api: Api, kube: KubeClient, node_name: str
) -> None:
    devices = [dra.Device(name=f"q-{i}", capacity={"memory": q}) for i, q in enumerate(QUANTITIES)]
    publisher = SlicePublisher(kube, "quantity.example.com", node_name)
    await publisher.reconcile(devices)
    [stored] = api.slices("quantity.example.com", node_name)
    values = {d["name"]: d["capacity"]["memory"]["value"] for d in stored["spec"]["devices"]}
    assert values == {f"q-{i}": canonical_quantity(str(q)) for i, q in enumerate(QUANTITIES)}
    assert values["q-0"] == "1Gi"
    assert values["q-1"] == "1k"


async def test_an_unchanged_pool_is_never_written_again(
    api: Api, kube: KubeClient, node_name: str
) -> None:
    """60 checks of an unchanged pool (a LIST and a compare each, what every resync and
    every watch event does) write nothing."""
    devices = [dra.Device(name=f"q-{i}", capacity={"memory": q}) for i, q in enumerate(QUANTITIES)]
    publisher = SlicePublisher(kube, "still.example.com", node_name)
    await publisher.reconcile(devices)
    written = publisher.writes
    assert written == 1
    for _ in range(60):
        await publisher.reconcile(devices)
    assert publisher.writes == written
    [stored] = api.slices("still.example.com", node_name)
    assert stored["spec"]["pool"]["generation"] == 1
    # a restarted driver adopts the pool without writing
    again = SlicePublisher(kube, "still.example.com", node_name)
    await again.reconcile(devices)
    assert again.writes == 0

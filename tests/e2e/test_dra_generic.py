"""``kubedevice run --dra`` on the real scheduler, kubelet and runtime, with a fake /dev tree."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from .cluster import Cluster, envs
from .dra import (
    GenericDra,
    allocated,
    claim_pod,
    claim_spec,
    create_template,
    delete_pod,
    device_class,
    pod_claim,
    release,
    request,
    run_claim_pod,
    slice_devices,
    wait_slices,
)

# a DRA pod may wait for the kubelet's 1-minute pod resync (see dra.POD_TIMEOUT)
pytestmark = pytest.mark.timeout(360)

DRIVER = "dev.kubedevice.io"
CONFIG = """\
version: v1
resources:
  - name: example.com/e2e
    groups:
      - name: e2e
        paths:
          - path: /dev/e2e*
        envs:
          E2E_PATHS: "{paths}"
"""
IS_E2E = (
    f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].resource == "example.com/e2e"'
)


@pytest.fixture
def dev_dra(cluster: Cluster, ns: str) -> Iterator[Callable[..., GenericDra]]:
    made: list[GenericDra] = []

    def make(*nodes: str, start: bool = True) -> GenericDra:
        d = GenericDra(cluster, CONFIG)
        made.append(d)
        for node in nodes:
            d.host.add_char_device(node)
        if start:
            d.start()
        return d

    yield make
    release(cluster, ns, list(made))
    for d in made:
        d.close()


def test_a_dev_node_reaches_the_container(
    cluster: Cluster, ns: str, dev_dra: Callable[..., GenericDra]
) -> None:
    drv = dev_dra("/dev/e2e0")
    [name] = wait_slices(cluster, DRIVER, lambda n: len(n) == 1, "1 device")
    attrs = slice_devices(cluster, DRIVER)[name].attributes
    assert attrs["path"].string == "/dev/e2e0"
    assert attrs["group"].string == "e2e"
    with device_class(cluster, IS_E2E) as cls:
        create_template(cluster, ns, "one", claim_spec(request("dev", cls)))
        run_claim_pod(cluster, ns, claim_pod("p", template="one"))
        assert allocated(pod_claim(cluster, ns, "p")) == [name]
        record = cluster.kubelet.created(ns, "p", "main")  # type: ignore[union-attr]
        [cdi_id] = [d["name"] for d in record["cdiDevices"]]
        [spec] = drv.cdi_specs().values()
        [device] = spec["devices"]
        assert cdi_id == f"{spec['kind']}={device['name']}"
        edits = device["containerEdits"]
        assert [n["hostPath"] for n in edits["deviceNodes"]] == ["/dev/e2e0"]
        assert {"E2E_PATHS=/dev/e2e0"} <= set(edits["env"])
        # the runtime does not apply CDI edits itself here: the record holds the CDI names
        assert "E2E_PATHS" not in envs(record)
        delete_pod(cluster, ns, "p")
        drv.wait_specs(lambda specs: not specs, "the claim's CDI spec removed")


def test_hot_plug_reaches_the_slices(
    cluster: Cluster, ns: str, dev_dra: Callable[..., GenericDra]
) -> None:
    drv = dev_dra("/dev/e2e0")
    wait_slices(cluster, DRIVER, lambda n: len(n) == 1, "1 device")
    drv.host.add_char_device("/dev/e2e1")
    two = wait_slices(cluster, DRIVER, lambda n: len(n) == 2, "2 devices")
    drv.host.remove("/dev/e2e0")
    [left] = wait_slices(cluster, DRIVER, lambda n: len(n) == 1, "1 device after unplug")
    assert left in two
    paths = {d.attributes["path"].string for d in slice_devices(cluster, DRIVER).values()}
    assert paths == {"/dev/e2e1"}
    with device_class(cluster, IS_E2E) as cls:
        create_template(cluster, ns, "one", claim_spec(request("dev", cls)))
        run_claim_pod(cluster, ns, claim_pod("p", template="one"))
        assert allocated(pod_claim(cluster, ns, "p")) == [left]


def test_pci_attributes_from_sysfs_select_the_device(
    cluster: Cluster, ns: str, dev_dra: Callable[..., GenericDra]
) -> None:
    drv = dev_dra("/dev/e2e0", "/dev/e2e1", start=False)
    # e2e1 belongs to PCI device 0000:3b:00.0 under root complex pci0000:3a
    host = drv.host
    pci = host.sys("/sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0")
    pci.mkdir(parents=True)
    cls_dir = host.sys("/sys/class/e2e/e2e1")
    cls_dir.mkdir(parents=True)
    (cls_dir / "device").symlink_to(os.path.relpath(pci, cls_dir))
    link = host.sys("/sys/bus/pci/devices/0000:3b:00.0")
    link.parent.mkdir(parents=True)
    link.symlink_to(os.path.relpath(pci, link.parent))
    drv.start()
    wait_slices(cluster, DRIVER, lambda n: len(n) == 2, "2 devices")
    std = "resource.kubernetes.io"
    with device_class(
        cluster,
        IS_E2E,
        f'"pcieRoot" in device.attributes["{std}"] && '
        f'device.attributes["{std}"].pcieRoot == "pci0000:3a"',
    ) as cls:
        create_template(cluster, ns, "pci", claim_spec(request("dev", cls)))
        run_claim_pod(cluster, ns, claim_pod("p", template="pci"))
        [name] = allocated(pod_claim(cluster, ns, "p"))
        attrs: Any = slice_devices(cluster, DRIVER)[name].attributes
        assert attrs["path"].string == "/dev/e2e1"
        assert attrs[f"{std}/pciBusID"].string == "0000:3b:00.0"

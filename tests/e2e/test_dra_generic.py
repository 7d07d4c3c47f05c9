"""``kubedevice run --dra`` on the real scheduler, kubelet and runtime, with a fake /dev tree."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from .cluster import Cluster, envs
from .dra import (
    POD_TIMEOUT,
    UNPREPARED,
    GenericDra,
    allocated,
    claim_pod,
    claim_spec,
    create_template,
    delete_pod,
    device_class,
    docs_yaml,
    log_count,
    pod_claim,
    release,
    request,
    resource_api,
    run_claim_pod,
    share_one_claim,
    slice_devices,
    wait_file,
    wait_slices,
    wait_unschedulable,
)

# a DRA pod may wait for the kubelet's next pod sync (see dra.POD_TIMEOUT)
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
# the same devices with a health check: healthy while /sys/class/e2e/<name>/ok reads "1"
HEALTH_CONFIG = (
    CONFIG
    + """\
        health:
          periodSeconds: 0.2
          sysfsAttribute:
            path: /sys/class/e2e/{name}/ok
            expect: "1"
"""
)
IS_E2E = (
    f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].resource == "example.com/e2e"'
)


@pytest.fixture
def dev_dra(cluster: Cluster, ns: str) -> Iterator[Callable[..., GenericDra]]:
    made: list[GenericDra] = []

    def make(*nodes: str, start: bool = True, config: str = CONFIG) -> GenericDra:
        d = GenericDra(cluster, config)
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


def test_a_claim_shared_by_two_pods_is_prepared_once(
    cluster: Cluster, ns: str, dev_dra: Callable[..., GenericDra]
) -> None:
    drv = dev_dra("/dev/e2e0", "/dev/e2e1")
    wait_slices(cluster, DRIVER, lambda n: len(n) == 2, "2 devices")
    with device_class(cluster, IS_E2E) as cls:
        share_one_claim(cluster, ns, drv, cls)


def test_restarts_of_the_driver_and_the_kubelet(
    cluster: Cluster, ns: str, dev_dra: Callable[..., GenericDra]
) -> None:
    """A driver killed with a prepared claim unprepares it after its restart (from its
    checkpoint); a kubelet restart registers it again and a new pod gets the free device."""
    drv = dev_dra("/dev/e2e0", "/dev/e2e1")
    wait_slices(cluster, DRIVER, lambda n: len(n) == 2, "2 devices")
    with device_class(cluster, IS_E2E) as cls:
        create_template(cluster, ns, "one", claim_spec(request("dev", cls)))
        run_claim_pod(cluster, ns, claim_pod("dev-before", template="one"))
        first = allocated(pod_claim(cluster, ns, "dev-before"))
        assert len(drv.cdi_specs()) == 1
        drv.kill()  # a crash: no clean-up
        drv.start()
        registered = log_count(drv.log, "registered with the kubelet as DRA driver")
        cluster.restart_kubelet()
        drv.wait_registered(registered + 1)
        run_claim_pod(cluster, ns, claim_pod("dev-after", template="one"))
        second = allocated(pod_claim(cluster, ns, "dev-after"))
        assert len(second) == 1
        assert second != first
        assert len(drv.cdi_specs()) == 2
        delete_pod(cluster, ns, "dev-before")
        drv.wait_specs(lambda specs: len(specs) == 1, "the first claim's spec removed")
        # the restarted process did it, from its checkpoint (the spec goes just before the line)
        wait_file(drv.log, lambda p: log_count(p, UNPREPARED) >= 1, 30, "unprepared, logged")
        assert log_count(drv.log, UNPREPARED) == 1


def test_an_unhealthy_device_is_tainted_and_not_allocated(
    cluster: Cluster, ns: str, dev_dra: Callable[..., GenericDra]
) -> None:
    drv = dev_dra("/dev/e2e0", "/dev/e2e1", start=False, config=HEALTH_CONFIG)
    ok = {}
    for name in ("e2e0", "e2e1"):
        d = drv.host.sys(f"/sys/class/e2e/{name}")
        d.mkdir(parents=True)
        ok[name] = d / "ok"
        ok[name].write_text("1\n")
    drv.start()
    wait_slices(cluster, DRIVER, lambda n: len(n) == 2, "2 healthy devices")
    bad = next(
        n
        for n, d in slice_devices(cluster, DRIVER).items()
        if d.attributes["path"].string == "/dev/e2e1"
    )
    ok["e2e1"].write_text("0\n")
    names = wait_slices(cluster, DRIVER, lambda n: bad not in n, f"{bad} tainted")
    assert len(names) == 1
    [taint] = slice_devices(cluster, DRIVER)[bad].taints  # still published, tainted
    assert (taint.key, taint.value, taint.effect) == (  # keyed by why: group e2e's check
        f"{DRIVER}/health-check",
        "e2e",
        "NoSchedule",
    )
    with device_class(
        cluster, IS_E2E, 'device.attributes["dev.kubedevice.io"].path == "/dev/e2e1"'
    ) as cls:
        create_template(cluster, ns, "that-one", claim_spec(request("dev", cls)))
        cluster.create_pod(ns, claim_pod("p", template="that-one"))
        wait_unschedulable(cluster, ns, "p")
        ok["e2e1"].write_text("1\n")
        wait_slices(cluster, DRIVER, lambda n: bad in n, f"{bad} healthy again", timeout=90)
        cluster.wait_running(ns, "p", timeout=POD_TIMEOUT)
        assert allocated(pod_claim(cluster, ns, "p")) == [bad]


SERIAL_CONFIG = """\
version: v1
resources:
  - name: example.com/serial
    groups:
      - name: ttys
        paths:
          - path: /dev/ttyUSB*
"""


def test_the_docs_device_class_allocates_a_serial_port(
    cluster: Cluster, ns: str, dev_dra: Callable[..., GenericDra]
) -> None:
    """docs/generic-dra.md's DeviceClass for the /dev driver, as written, selects serial ports."""
    [cls] = [d for d in docs_yaml() if d["kind"] == "DeviceClass" and "dev.kubedevice.io" in str(d)]
    dev_dra(
        "/dev/ttyUSB0",
        "/dev/e2e0",
        config=SERIAL_CONFIG + CONFIG.removeprefix("version: v1\nresources:\n"),
    )
    wait_slices(cluster, DRIVER, lambda n: len(n) == 2, "a serial port and another device")
    api = resource_api(cluster)
    api.create_device_class(cls)
    try:
        create_template(cluster, ns, "tty", claim_spec(request("tty", cls["metadata"]["name"])))
        run_claim_pod(cluster, ns, claim_pod("p", template="tty"))
        [name] = allocated(pod_claim(cluster, ns, "p"))
        assert slice_devices(cluster, DRIVER)[name].attributes["path"].string == "/dev/ttyUSB0"
    finally:
        api.delete_device_class(cls["metadata"]["name"])

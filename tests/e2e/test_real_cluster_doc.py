"""docs/real-cluster.md's manifests, as the guide writes them, on the real components.

The guide's YAML blocks are read from its text (so an edit there is what gets tested) and
created without kubectl, the way its last section shows (the official client's
``create_from_yaml``), while the generic plugin and the generic DRA driver serve the guide's
config (examples/fuse.yaml) on a fake /dev, one after the other as the guide says (never
both on one node): the real scheduler places both pods, the real kubelet admits them, and
the runtime receives /dev/fuse from the device plugin, then the CDI device of the claim.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, utils

from .cluster import NODE, Cluster, wait_for
from .dra import POD_TIMEOUT, GenericDra, delete_pod, resource_api, wait_slices
from .plugins import GenericDaemon

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "real-cluster.md"
DRIVER = "dev.kubedevice.io"


def _blocks() -> list[str]:
    return re.findall(r"```yaml\n(.*?)```", DOC.read_text(), re.S)


def _running(cluster: Cluster, ns: str, name: str) -> Any:
    return cluster.wait_running(ns, name, timeout=POD_TIMEOUT)


def _create(cluster: Cluster, ns: str, block: str, path: Path) -> None:
    """One YAML block as a user would: a file, created by the official client (no kubectl)."""
    path.write_text(block)
    utils.create_from_yaml(cluster.api, str(path), namespace=ns)


def test_the_guide_s_pods_get_dev_fuse(
    cluster: Cluster, ns: str, generic_plugin: Callable[..., GenericDaemon], tmp_path: Path
) -> None:
    config = (ROOT / "examples" / "fuse.yaml").read_text()
    assert "kubedevice examples fuse.yaml" in DOC.read_text()
    blocks = _blocks()
    kinds = [[d["kind"] for d in yaml.safe_load_all(b) if d] for b in blocks]
    assert kinds == [["Pod"], ["DeviceClass", "ResourceClaim", "Pod"]]

    # step 3: the device plugin
    plugin = generic_plugin(config, start=False)
    plugin.host.add_char_device("/dev/fuse")
    plugin.start()
    wait_for(
        cluster.core.list_node,
        lambda n: (n.status.allocatable or {}).get("example.com/fuse") == "110",
        60,
        "110 example.com/fuse allocatable",
        field_selector=f"metadata.name={NODE}",
    )
    _create(cluster, ns, blocks[0], tmp_path / "fuse-user.yaml")
    _running(cluster, ns, "fuse-user")
    record = cluster.kubelet.created(ns, "fuse-user", "main")  # type: ignore[union-attr]
    nodes = {d["container_path"]: d["host_path"] for d in record.get("devices") or []}
    assert nodes == {"/dev/fuse": "/dev/fuse"}

    # step 4: the pod deleted, the DRA driver in the plugin's place
    delete_pod(cluster, ns, "fuse-user")
    plugin.close()
    drv = GenericDra(cluster, config)
    drv.host.add_char_device("/dev/fuse")
    drv.start()
    try:
        wait_slices(cluster, DRIVER, lambda n: len(n) == 110, "the 110 shares of /dev/fuse")
        _create(cluster, ns, blocks[1], tmp_path / "fuse-claim.yaml")
        _running(cluster, ns, "fuse-claimer")
        claim = resource_api(cluster).read_namespaced_resource_claim("one-fuse", ns)
        [result] = claim.status.allocation.devices.results
        assert result.driver == DRIVER
        record = cluster.kubelet.created(ns, "fuse-claimer", "main")  # type: ignore[union-attr]
        [cdi_id] = [d["name"] for d in record["cdiDevices"]]
        [spec] = drv.cdi_specs().values()
        [device] = spec["devices"]
        assert cdi_id == f"{spec['kind']}={device['name']}"
        assert [n["hostPath"] for n in device["containerEdits"]["deviceNodes"]] == ["/dev/fuse"]
    finally:
        with contextlib.suppress(client.ApiException):
            delete_pod(cluster, ns, "fuse-claimer")
        drv.wait_specs(lambda specs: not specs, "the claim's CDI spec removed")
        with contextlib.suppress(client.ApiException):
            resource_api(cluster).delete_device_class("fuse.example.com")
        drv.close()

"""Item 5: ``kubedevice inspect`` on the real node.

The real kubelet's checkpoint and its PodResources ``List`` and ``GetAllocatableResources``
map every device to its pod; exit 0 on a healthy node; a killed plugin's stale socket is
flagged.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from .cluster import DEVICE_PLUGIN_DIR, Cluster, envs, pod_manifest
from .conftest import GENERIC_CONFIG, GENERIC_RESOURCE, GPU

KUBEDEVICE = str(Path(sys.executable).with_name("kubedevice"))


def _inspect(cluster: Cluster, *extra: str) -> tuple[int, dict[str, Any], str]:
    assert cluster.kubelet is not None
    proc = subprocess.run(
        [KUBEDEVICE, "inspect", "-o", "json", "--device-plugin-dir", str(DEVICE_PLUGIN_DIR),
         "--pod-resources-socket", str(cluster.kubelet.pod_resources_socket), *extra],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    return proc.returncode, json.loads(proc.stdout), proc.stderr


def test_inspect_maps_every_device_to_its_pod(
    cluster: Cluster, ns: str, gpu_plugin, generic_plugin
) -> None:
    gpu = gpu_plugin()
    generic = generic_plugin(GENERIC_CONFIG, start=False)
    for i in range(3):
        generic.host.add_char_device(f"/dev/e2e{i}")
    generic.start()
    cluster.wait_resource(GPU, allocatable=8)
    cluster.wait_resource(GENERIC_RESOURCE, allocatable=3)
    pods = {"two-gpus": {GPU: 2}, "one-gpu": {GPU: 1}, "gadget": {GENERIC_RESOURCE: 2}}
    uids = {}
    for name, limits in pods.items():
        uids[name] = cluster.run_pod(ns, pod_manifest(name, limits)).metadata.uid

    rc, doc, err = _inspect(cluster)
    assert (doc["inputErrors"], err) == ([], "")
    # nothing is wrong with this test's plugins and pods: exit 0 on a node where earlier
    # tests left nothing behind (the kubelet keeps a stopped plugin's resource, without
    # healthy devices, for 5 minutes, and inspect says so)
    ours = [f for f in doc["findings"] if GPU in f["message"] or GENERIC_RESOURCE in f["message"]]
    assert ours == []
    others = [f["code"] for f in doc["findings"]]
    assert set(others) <= {"no-healthy-devices", "stale-socket"}, doc["findings"]
    assert rc == (1 if others else 0)

    # the plugin sockets: live, named by their file names
    by_res = {p["resource"]: p for p in doc["plugins"]}
    assert by_res[GPU]["state"] == by_res[GENERIC_RESOURCE]["state"] == "ok"
    assert by_res[GPU]["options"]["getPreferredAllocationAvailable"] is True
    assert doc["kubeletSocket"] == "ok"

    # the real checkpoint: checksum verified, every healthy device, one entry per container
    cp = doc["checkpoint"]
    assert cp["checksumOk"] is True
    assert sorted(cp["healthyAtLastWrite"][GPU]) == sorted(gpu.uuids)
    assert len(cp["healthyAtLastWrite"][GENERIC_RESOURCE]) == 3
    entries = {(e["podUID"], e["resource"]): sorted(e["deviceIDs"]) for e in cp["entries"]}

    # the real PodResources: allocatable with NUMA, and who holds what
    pr = doc["podResources"]
    assert sorted(pr["allocatable"][GPU]) == sorted(gpu.uuids)
    assert sum(pr["allocatableNuma"][GPU].values()) == 8
    assigned = {
        (a["namespace"], a["pod"], a["container"], a["resource"]): sorted(a["deviceIDs"])
        for a in pr["assigned"]
        if a["namespace"] == ns
    }
    assert set(assigned) == {(ns, name, "main", r) for name, lim in pods.items() for r in lim}
    for name, limits in pods.items():
        for resource, n in limits.items():
            ids = assigned[(ns, name, "main", resource)]
            assert len(ids) == n
            assert entries[(uids[name], resource)] == ids  # checkpoint and List agree
            record = cluster.kubelet.created(ns, name, "main")
            if resource == GPU:
                assert sorted(envs(record)["NVIDIA_VISIBLE_DEVICES"].split(",")) == ids
    held = [i for (_, _, _, r), ids in assigned.items() if r == GPU for i in ids]
    assert len(held) == len(set(held)) == 3


def test_a_killed_plugins_stale_socket_is_flagged(
    cluster: Cluster, ns: str, generic_plugin
) -> None:
    generic = generic_plugin(GENERIC_CONFIG, start=False)
    generic.host.add_char_device("/dev/e2e0")
    generic.start()
    cluster.wait_resource(GENERIC_RESOURCE, allocatable=1)
    _, doc, _ = _inspect(cluster)  # earlier tests' stopped plugins may be flagged too
    [plugin] = [p for p in doc["plugins"] if p["resource"] == GENERIC_RESOURCE]
    assert plugin["state"] == "ok"
    sock = plugin["socket"]
    plugin_codes = {"stale-socket", "no-healthy-devices", "resource-without-plugin"}
    assert not [
        f for f in doc["findings"] if f["code"] in plugin_codes and GENERIC_RESOURCE in f["message"]
    ]

    generic.kill()  # SIGKILL: the socket file stays, nothing listens on it
    assert (DEVICE_PLUGIN_DIR / sock).is_socket()
    cluster.wait_resource(GENERIC_RESOURCE, allocatable=0)
    rc, doc, _ = _inspect(cluster)
    assert rc == 1
    states = {p["socket"]: p["state"] for p in doc["plugins"]}
    assert states[sock] == "stale"
    findings = {(f["code"], f["message"].split(":")[0]) for f in doc["findings"]}
    assert ("stale-socket", f"{sock} ({GENERIC_RESOURCE})") in findings
    assert ("no-healthy-devices", GENERIC_RESOURCE) in findings

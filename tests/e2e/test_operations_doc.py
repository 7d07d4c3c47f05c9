"""docs/operations.md's pods, as the guide writes them, on the real kubelet.

Section 6's ``kubedevice inspect`` pod and section 4's clean-up pod are taken from the guide's
text (so an edit there is what gets tested), created in the real API server for this node, and
must be admitted by the real kubelet (hostPath types checked) and run in the fake runtime with
the mounts the guide asks for. The one adaptation is the one the guide itself names: this
kubelet's root is not ``/var/lib/kubelet``, so the PodResources hostPath is the kubelet's own.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import yaml

from .cluster import NODE, Cluster

DOC = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


def _section(number: int) -> str:
    text = DOC.read_text()
    start = text.index(f"\n## {number}. ")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def _inspect_pod() -> dict[str, Any]:
    """Section 6's manifest: the heredoc fed to ``kubectl apply``, with ``$NODE`` set."""
    [heredoc] = re.findall(r"apply -f - <<EOF\n(.*?)\nEOF\n", _section(6), re.S)
    manifest: dict[str, Any] = yaml.safe_load(heredoc.replace("$NODE", NODE))
    return manifest


def _cleanup_pod() -> dict[str, Any]:
    """Section 4's ``kubectl run kd-cleanup ... --overrides=JSON`` as the Pod kubectl makes."""
    [command] = re.findall(
        r"```sh\n(kubectl -n kube-system run kd-cleanup.*?)\n```", _section(4), re.S
    )
    argv = shlex.split(command.replace("\\\n", " "))
    [overrides] = [a.split("=", 1)[1] for a in argv if a.startswith("--overrides=")]
    spec = json.loads(overrides.replace("NODE", NODE))["spec"]
    assert "--restart=Never" in argv
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": argv[argv.index("run") + 1]},
        "spec": {"restartPolicy": "Never", **spec},
    }


def _mounts(cluster: Cluster, ns: str, pod: str, container: str) -> dict[str, dict[str, Any]]:
    kubelet = cluster.kubelet
    assert kubelet is not None
    record = kubelet.created(ns, pod, container)
    assert not record.get("error"), record["error"]
    return {m["container_path"]: m for m in record["mounts"]}


def test_the_inspect_pod_of_section_6_runs_on_the_node(cluster: Cluster, ns: str) -> None:
    kubelet = cluster.kubelet
    assert kubelet is not None
    pod = _inspect_pod()
    name = pod["metadata"]["name"]
    assert name == f"kubedevice-inspect-{NODE}"
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    # this kubelet's --root-dir is a temp dir: its PodResources socket lives there (section 1)
    volumes["pod-resources"]["hostPath"]["path"] = str(kubelet.pod_resources_socket.parent)
    cluster.run_pod(ns, pod)
    mounts = _mounts(cluster, ns, name, "inspect")
    for m in pod["spec"]["containers"][0]["volumeMounts"]:
        got = mounts[m["mountPath"]]
        assert got["host_path"] == volumes[m["name"]]["hostPath"]["path"], m
        assert got.get("readonly") is True, m  # nothing written on the node
    [spec] = cluster.core.read_namespaced_pod(name, ns).spec.containers
    assert spec.command == ["kubedevice", "inspect"]
    assert spec.security_context.capabilities.drop == ["ALL"]


def test_the_cleanup_pod_of_section_4_runs_on_the_node(cluster: Cluster, ns: str) -> None:
    pod = _cleanup_pod()
    assert pod["spec"]["nodeName"] == NODE
    cluster.run_pod(ns, pod)
    mounts = _mounts(cluster, ns, pod["metadata"]["name"], "c")
    assert mounts["/cdi"]["host_path"] == "/var/run/cdi"
    assert mounts["/nfd"]["host_path"] == "/etc/kubernetes/node-feature-discovery/features.d"
    [spec] = cluster.core.read_namespaced_pod(pod["metadata"]["name"], ns).spec.containers
    assert spec.command[:2] == ["rm", "-fv"]

"""Helpers of the tests on the real runtime (marked ``containerd``): pods of busybox that print
what they see from inside (their device nodes with major:minor, their env, files), run to their
end; real char device nodes for the plugins' fake hosts.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .cluster import Cluster, pod_manifest, poll_until
from .runtime import SHOW, busybox, container_output, mknod_char, parse_show

#: where the generic plugin's real nodes are made (in the tier's private /dev)
REAL_DEV = Path("/dev/kde2e")
#: the generic plugin on real nodes: GENERIC_CONFIG's group, on /dev/kde2e/e2e*
REAL_GENERIC_CONFIG = """\
version: v1
resources:
  - name: example.com/e2e
    groups:
      - name: e2e
        paths:
          - path: /dev/kde2e/e2e*
            permissions: rw
        envs:
          E2E_PATHS: "{paths}"
        mounts:
          - hostPath: /etc/hostname
            containerPath: /etc/e2e-hostname
            readOnly: true
"""
#: a real NVIDIA node's major (the fake NVML's nodes are made with it)
NVIDIA_MAJOR = 195


@dataclass
class Seen:
    """What a container saw from inside: its char device nodes, env, and the rest it printed."""

    phase: str
    output: str
    devices: dict[str, tuple[int, int]]
    env: dict[str, str]
    #: the start's token (a pod that keeps running prints one after what it saw)
    token: str = ""

    def under(self, prefix: str) -> dict[str, tuple[int, int]]:
        return {p: mm for p, mm in self.devices.items() if p.startswith(prefix)}


def show_pod(
    name: str,
    limits: dict[str, int] | None = None,
    *,
    extra: str = "",
    claims: list[str] | None = None,
    keep_running: bool = False,
) -> dict[str, Any]:
    """A pod whose container prints what it sees (``SHOW``, then ``extra``'s output) and ends;
    with ``keep_running``, it then sleeps (a pod that holds its devices)."""
    script = f"{SHOW}; {extra}" if extra else SHOW
    if keep_running:  # one token per start: a restarted container's lines are told apart
        script += "; echo SHOWN $(cat /proc/sys/kernel/random/uuid); exec sleep 100000"
    m = pod_manifest(name, containers=[busybox("main", script, limits, claims)])
    m["spec"]["restartPolicy"] = "Always" if keep_running else "Never"
    return m


def finished(cluster: Cluster, ns: str, name: str, timeout: float = 60) -> Seen:
    """Wait (watch) until the pod ends; what its container saw."""
    pod = cluster.wait_pod(
        ns,
        name,
        lambda p: p.status.phase in ("Succeeded", "Failed"),
        timeout,
        "Succeeded or Failed",
    )
    return seen(ns, pod, pod.status.phase)


def seen(ns: str, pod: Any, phase: str = "Running") -> Seen:
    """What the pod's container printed (of a pod that keeps running: its last start's)."""
    out = container_output(ns, pod.metadata.name, pod.metadata.uid, "main")
    lines = out.splitlines()
    marks = [i for i, ln in enumerate(lines) if ln.startswith("SHOWN ")]
    token = ""
    if marks:
        start = marks[-2] + 1 if len(marks) > 1 else 0
        token = lines[marks[-1]].split()[1]
        out = "\n".join(lines[start : marks[-1]])
    devices, env = parse_show(out)
    return Seen(phase, out, devices, env, token)


def run_all(cluster: Cluster, ns: str, manifests: list[dict[str, Any]]) -> dict[str, Seen]:
    """Create the pods at once (they start in parallel), then wait for each to end."""
    for m in manifests:
        cluster.create_pod(ns, m)
    return {m["metadata"]["name"]: finished(cluster, ns, m["metadata"]["name"]) for m in manifests}


@contextlib.contextmanager
def real_generic_nodes(minors: list[int]) -> Iterator[dict[str, tuple[int, int]]]:
    """``/dev/kde2e/e2e<i>`` as real char nodes ``1:<minor>`` (null, zero, full ...)."""
    made = {}
    try:
        for i, minor in enumerate(minors):
            made[str(mknod_char(REAL_DEV / f"e2e{i}", 1, minor))] = (1, minor)
        yield made
    finally:
        for p in made:
            with contextlib.suppress(FileNotFoundError):
                Path(p).unlink()


def nvidia_numbers(dev_nodes: tuple[str, ...] | list[str]) -> dict[str, tuple[int, int]]:
    """A real (major, minor) for each of the fake machine's NVIDIA nodes."""
    out = {}
    for i, node in enumerate(n for n in dev_nodes if n.rstrip("/") != "/dev/nvidia-caps"):
        name = node.rsplit("/", 1)[-1]
        if name.startswith("nvidia") and name[6:].isdigit():
            out[node] = (NVIDIA_MAJOR, int(name[6:]))
        elif name == "nvidiactl":
            out[node] = (NVIDIA_MAJOR, 255)
        elif name == "nvidia-modeset":
            out[node] = (NVIDIA_MAJOR, 254)
        else:  # nvidia-uvm, nvidia-uvm-tools, caps: a dynamic major on a real host
            out[node] = (509, i)
    return out


@contextlib.contextmanager
def real_nvidia_nodes(
    dev_nodes: tuple[str, ...] | list[str],
) -> Iterator[dict[str, tuple[int, int]]]:
    """The fake machine's ``/dev/nvidia*`` as real char nodes in the tier's private /dev."""
    numbers = nvidia_numbers(dev_nodes)
    try:
        for node, (major, minor) in numbers.items():
            mknod_char(Path(node), major, minor)
        yield numbers
    finally:
        for node in numbers:
            with contextlib.suppress(FileNotFoundError):
                Path(node).unlink()


def claim_show_pod(
    name: str, *, template: str | None = None, claim: str | None = None, extra: str = ""
) -> dict[str, Any]:
    """``show_pod`` using one claim (``dev``) from ``template`` or the existing ``claim``; it
    keeps running (holding the claim) after printing."""
    m = show_pod(name, claims=["dev"], extra=extra, keep_running=True)
    ref: dict[str, Any] = {"name": "dev"}
    if template is not None:
        ref["resourceClaimTemplateName"] = template
    else:
        ref["resourceClaimName"] = claim
    m["spec"]["resourceClaims"] = [ref]
    return m


def shown(cluster: Cluster, ns: str, name: str, timeout: float = 150) -> Seen:
    """Wait until the pod runs and its container has printed what it sees (it then sleeps)."""
    pod = cluster.wait_running(ns, name, timeout)

    def printed() -> bool:
        out = container_output(ns, name, pod.metadata.uid, "main")
        return any(ln.startswith("SHOWN ") for ln in out.splitlines())

    poll_until(f"{ns}/{name} printed what it sees", printed, 30)
    return seen(ns, pod)


def run_holding(
    cluster: Cluster, ns: str, manifests: list[dict[str, Any]], timeout: float = 150
) -> dict[str, Seen]:
    """Create the pods at once, then wait until each runs and has printed what it sees."""
    for m in manifests:
        cluster.create_pod(ns, m)
    return {
        m["metadata"]["name"]: shown(cluster, ns, m["metadata"]["name"], timeout) for m in manifests
    }

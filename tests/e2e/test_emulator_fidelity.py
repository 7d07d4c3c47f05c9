"""Item 8: emulator fidelity, side by side.

One scenario runs twice: through the real kubelet (v1.36, with the real scheduler bypassed
where the kubelet itself must decide) and through the emulator, with the same stand-in plugin
(``tests/kubelet/rawplugin.py``: raw grpc.aio, every call it gets recorded). Each step gives an
observation; the two are compared item by item. Every item where they differ must be listed,
with its reason, in docs/emulator.md's "Measured against the real kubelet" table, and every
item listed there must still differ: the test keeps that list true both ways.

Steps: registration (capacity, allocatable with one Unhealthy device, what the kubelet asked
the plugin, the refusal texts of a bad Register), admission (GetPreferredAllocation's
arguments, Allocate, PodResources), a rejection for too few devices, init-container reuse, a
kubelet restart with the checkpoint (pods keep their devices, the plugin registers again, a new
pod gets the free device), and a dead plugin (capacity kept, allocatable 0, admission refused).
"""

from __future__ import annotations

import asyncio
import re
import shutil
import sys
import tempfile
import threading
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

from grpc import aio

from kubedevice._api import pr, pr_grpc
from kubedevice.errors import AdmissionError
from kubedevice.kubelet import Emulator

from .cluster import (
    DEVICE_PLUGIN_DIR,
    NODE,
    Cluster,
    container,
    pod_manifest,
    poll_until,
    unix_socket_answers,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kubelet"))

from rawplugin import Dev, RawPlugin

R = "example.com/fidelity"
DOC = Path(__file__).resolve().parents[2] / "docs" / "emulator.md"
T = TypeVar("T")


class Loop:
    """An asyncio loop on its own thread: the plugin (and the emulator) live there."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 60) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


def _plugin(dp_dir: Path) -> RawPlugin:
    devices = [Dev(f"d{i}") for i in range(5)] + [Dev("d5", "Unhealthy")]
    p = RawPlugin(dp_dir, R, devices, name="fidelity.sock", preferred_available=True)
    p.preferred_fn = lambda available, must, size: sorted(available)[-size:]
    return p


def _calls(p: RawPlugin, since: dict[str, int]) -> dict[str, Any]:
    """What the plugin was asked since the ``since`` marks (and move the marks)."""
    c = p.calls
    out = {
        "preferred": [(sorted(a), sorted(m), n) for a, m, n in c.preferred[since["preferred"] :]],
        "allocate": [[sorted(g) for g in call] for call in c.allocate[since["allocate"] :]],
    }
    since.update(preferred=len(c.preferred), allocate=len(c.allocate))
    return out


async def _refused(p: RawPlugin, **register: str) -> str:
    """How the kubelet refuses a Register call: its status code and text."""
    try:
        await p.register(**register)
    except aio.AioRpcError as exc:
        return f"{exc.code().name}: {exc.details()}"
    return "accepted"


def _ids(devices: Any) -> list[str]:
    return sorted(i for d in devices if d.resource_name == R for i in d.device_ids)


class Node:
    """What a scenario needs of a node: the real kubelet's or the emulator's."""

    loop: Loop
    plugin: RawPlugin
    admitted: set[str]

    def admit(self, name: str, manifest: dict[str, Any]) -> str:
        """'admitted', or 'rejected: REASON: MESSAGE'."""
        verdict = self._admit(name, {**manifest, "metadata": {"name": name}})
        if verdict == "admitted":
            self.admitted.add(name)
        return verdict

    def wait(self, capacity: int, allocatable: int) -> None: ...
    def _admit(self, name: str, manifest: dict[str, Any]) -> str: ...
    def restart(self) -> None: ...
    def pod_resources_socket(self) -> Path: ...

    def listed(self) -> dict[str, dict[str, list[str]]]:
        """Pod -> container -> devices of ``R``: PodResources List (this node's pods only)."""

        async def call() -> Any:
            async with aio.insecure_channel(f"unix://{self.pod_resources_socket()}") as ch:
                stub = pr_grpc.PodResourcesListerStub(ch)
                return await stub.List(pr.ListPodResourcesRequest(), timeout=5)

        out: dict[str, dict[str, list[str]]] = {}
        for pod in self.loop.run(call()).pod_resources:
            if self.mine(pod.namespace):
                out[pod.name] = {
                    c.name: sorted(
                        i for d in c.devices if d.resource_name == R for i in d.device_ids
                    )
                    for c in pod.containers
                }
        return out

    def pod_devices(
        self, names: list[str], *, after_restart: bool = False
    ) -> dict[str, dict[str, list[str]]]:
        """Pod -> container -> devices, from PodResources List (``{}``: a pod not listed).

        Right after a restart the real kubelet's List answers no pods at all until its pod
        sources have synced (about a second after the resource is back in the Node status):
        ``after_restart`` waits until it lists the pods.
        """
        if after_restart:
            admitted = set(names) & self.admitted
            poll_until(
                f"PodResources List to list {admitted}", lambda: admitted <= set(self.listed())
            )
        listed = self.listed()
        return {n: listed.get(n, {}) for n in names}

    def mine(self, namespace: str) -> bool: ...


class RealNode(Node):
    def __init__(self, cluster: Cluster, ns: str, loop: Loop) -> None:
        self.cluster, self.ns, self.loop = cluster, ns, loop
        self.admitted = set()
        self.plugin = _plugin(DEVICE_PLUGIN_DIR)
        loop.run(self.plugin.start())

    def wait(self, capacity: int, allocatable: int) -> None:
        self.cluster.wait_resource(R, capacity=capacity, allocatable=allocatable)

    def _admit(self, name: str, manifest: dict[str, Any]) -> str:
        # the kubelet decides: nodeName is set, the scheduler is not asked
        manifest["spec"] = {**manifest["spec"], "nodeName": NODE}
        self.cluster.create_pod(self.ns, manifest)

        def decided(p: Any) -> bool:
            return p.status.phase in ("Running", "Failed") or any(
                s.state.running or s.state.terminated or s.state.waiting
                for s in (p.status.init_container_statuses or [])
            )

        pod = self.cluster.wait_pod(self.ns, name, decided)
        if pod.status.phase != "Failed":
            return "admitted"
        # the emulator's AdmissionError carries the admit result, as the kubelet's event
        # does; the Pod's status.message is the same text after "Pod was rejected: "
        reason = pod.status.reason
        assert pod.status.message.startswith("Pod was rejected: ")
        poll_until(
            f"the {reason} event of {name}",
            lambda: any(e.reason == reason for e in self.cluster.events(self.ns, name)),
        )
        [event] = [e for e in self.cluster.events(self.ns, name) if e.reason == reason]
        assert pod.status.message == f"Pod was rejected: {event.message}"
        return f"rejected: {reason}: {event.message}"

    def restart(self) -> None:
        # Not restart_kubelet(), which waits for a Ready heartbeat: about a second after it
        # starts, the new kubelet admits the running pods again, and refuses one whose
        # container reuses its init container's devices (UnexpectedAdmissionError, the pod
        # is then killed) unless the plugin has registered again by then. start() returns as
        # soon as the new kubelet.sock accepts; the scenario restarts the plugin right away.
        assert self.cluster.kubelet is not None
        self.cluster.kubelet.stop()
        self.cluster.kubelet.start()

    def pod_resources_socket(self) -> Path:
        assert self.cluster.kubelet is not None
        return self.cluster.kubelet.pod_resources_socket

    def mine(self, namespace: str) -> bool:
        return namespace == self.ns


class EmulatedNode(Node):
    def __init__(self, dp_dir: Path, loop: Loop) -> None:
        self.loop = loop
        self.admitted = set()
        self.emu = Emulator(dp_dir, control_socket=False)
        loop.run(self.emu.start())
        self.plugin = _plugin(dp_dir)
        loop.run(self.plugin.start())

    def wait(self, capacity: int, allocatable: int) -> None:
        def match() -> bool:
            r = self.emu.node().resources.get(R)
            got = (r.capacity, r.allocatable) if r is not None else (0, 0)
            return got == (capacity, allocatable)

        self.loop.run(self.emu.wait_until(match, 30))

    def _admit(self, name: str, manifest: dict[str, Any]) -> str:
        try:
            self.loop.run(self.emu.apply_pod(manifest))
        except AdmissionError as exc:
            return f"rejected: {exc.reason}: {exc.message}"
        return "admitted"

    def restart(self) -> None:
        self.loop.run(self.emu.restart())

    def pod_resources_socket(self) -> Path:
        return self.emu.pod_resources_socket

    def mine(self, namespace: str) -> bool:
        return True

    def close(self) -> None:
        self.loop.run(self.emu.stop())


def _run(node: Node) -> dict[str, Any]:
    """The scenario; the observation of each step by name."""
    seen: dict[str, Any] = {}
    p = node.plugin
    marks = {"preferred": 0, "allocate": 0}
    node.wait(capacity=6, allocatable=5)
    seen["registration: capacity, allocatable (one device Unhealthy)"] = (6, 5)
    seen["registration: ListAndWatch streams opened"] = p.calls.list_and_watch
    seen["registration: GetDevicePluginOptions calls"] = p.calls.options
    seen["registration: unsupported version"] = node.loop.run(_refused(p, version="v1alpha1"))
    seen["registration: invalid resource name"] = node.loop.run(
        _refused(p, resource="example.com/not a name")
    )

    seen["admission: pod asking 2"] = node.admit("two", pod_manifest("two", {R: 2}))
    seen["admission: plugin calls"] = _calls(p, marks)
    seen["admission: PodResources"] = node.pod_devices(["two"])

    seen["too few devices: pod asking 4 of 3 free"] = node.admit(
        "greedy", pod_manifest("greedy", {R: 4})
    )
    seen["too few devices: plugin calls"] = _calls(p, marks)

    init = pod_manifest(
        "init", containers=[container("main", {R: 2})], init_containers=[container("setup", {R: 2})]
    )
    seen["init-container reuse: pod"] = node.admit("init", init)
    seen["init-container reuse: plugin calls"] = _calls(p, marks)
    seen["init-container reuse: PodResources"] = node.pod_devices(["init"])

    before = p.calls.list_and_watch
    node.restart()
    node.loop.run(p.stop())  # the restart removed its socket: the plugin starts again
    kubelet_sock = p.socket_dir / "kubelet.sock"
    # the previous kubelet's socket file may still be there: wait for one that answers
    poll_until("the new kubelet.sock to accept", lambda: unix_socket_answers(kubelet_sock))
    node.loop.run(p.start())
    node.wait(capacity=6, allocatable=5)
    seen["restart: PodResources of the running pods"] = node.pod_devices(
        ["two", "init"], after_restart=True
    )
    seen["restart: new ListAndWatch streams"] = p.calls.list_and_watch - before
    seen["restart: plugin calls for the running pods"] = _calls(p, marks)
    seen["restart: new pod asking 1"] = node.admit("after", pod_manifest("after", {R: 1}))
    seen["restart: new pod's plugin calls"] = _calls(p, marks)

    seen["unregistered resource: pod asking 1"] = node.admit(
        "stray", pod_manifest("stray", {"example.com/never-registered": 1})
    )

    node.loop.run(p.stop())
    node.wait(capacity=6, allocatable=0)
    seen["dead plugin: capacity, allocatable"] = (6, 0)
    seen["dead plugin: pod asking 1"] = node.admit("late", pod_manifest("late", {R: 1}))
    return seen


def _listed_differences() -> dict[str, str]:
    """Item -> reason, from the table in docs/emulator.md."""
    text = DOC.read_text()
    section = text.split("## Measured against the real kubelet", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([^`]+)` \| (.+?) \|$", section, flags=re.M)
    return dict(rows)


def test_emulator_and_real_kubelet_side_by_side(cluster: Cluster, ns: str) -> None:
    loop = Loop()
    real_node = RealNode(cluster, ns, loop)
    try:
        real = _run(real_node)
    finally:
        loop.run(real_node.plugin.stop())
    short = Path(tempfile.mkdtemp(prefix="kdf-", dir="/tmp"))  # short socket paths
    emu_node = EmulatedNode(short / "dp", loop)
    try:
        emulated = _run(emu_node)
    finally:
        loop.run(emu_node.plugin.stop())
        emu_node.close()
        loop.close()
        shutil.rmtree(short, ignore_errors=True)
    assert list(real) == list(emulated)
    differ = {k: (emulated[k], real[k]) for k in real if real[k] != emulated[k]}
    listed = _listed_differences()
    report = "\n".join(f"{k}:\n  emulator {e!r}\n  kubelet  {r!r}" for k, (e, r) in differ.items())
    assert set(differ) == set(listed), f"differences:\n{report}\nlisted: {sorted(listed)}"
    # the items every kubelet must agree on are not in the list
    assert real["admission: pod asking 2"] == "admitted"
    assert "v1alpha1" in real["registration: unsupported version"]
    assert "not a name" in real["registration: invalid resource name"]
    assert (
        real["restart: PodResources of the running pods"]
        == emulated["restart: PodResources of the running pods"]
    )

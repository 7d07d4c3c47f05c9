"""A DaemonSet rollout (maxSurge 1, maxUnavailable 0) stops at the first node whose new
version cannot reach the API server, and goes on once it can.

The real DaemonSet controller rolls a DaemonSet over two real kubelets (``kd-node`` and
``kd-node-2``). kd-fakecri runs no container, so each version's driver is started by the test
on the host, as its container would run it: the real GPU DRA driver, old version A (the API
server reachable) and new version B (its kubeconfig names a port where nothing forwards to
the API server yet), both registered with ``kd-node``'s kubelet under their pod UIDs. Each
version's pod template has the real kubelet probe that version's ``/readyz`` (``httpGet``
on 127.0.0.1, that version's port): the kubelet's prober, the pods' Ready condition and the
controller's rollout are the real ones; only the process behind the probe is started by hand.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client

from .cluster import NODE, Cluster, Kubelet, free_port, poll_until, wait_for, write_kubeconfig
from .dra import GpuDra, wait_slices

pytestmark = pytest.mark.timeout(300)

DRIVER = "gpu.kubedevice.io"
UID_A = "aaaaaaaa-0000-4000-8000-0000000000a1"
UID_B = "bbbbbbbb-0000-4000-8000-0000000000b2"
LABELS = {"app": "dra-rollout"}
#: Readiness failures of the new pod that say the rollout is held (1 s apart).
HELD_AFTER = 5


class _Forwarder:
    """127.0.0.1:``port`` forwarded to ``target`` (threads) while open: the network
    between a pod and the API server."""

    def __init__(self, port: int, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", port))
        self.sockets: list[socket.socket] = [self.listener]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
                upstream = socket.create_connection(self.target)
            except OSError:
                return
            self.sockets += [conn, upstream]
            for a, b in ((conn, upstream), (upstream, conn)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        for sock in self.sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


def _readyz(port: int) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _daemonset(port: int, version: str) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "dra-rollout"},
        "spec": {
            "selector": {"matchLabels": LABELS},
            "updateStrategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
            },
            "template": {
                "metadata": {"labels": LABELS, "annotations": {"version": version}},
                "spec": {
                    "terminationGracePeriodSeconds": 1,
                    "containers": [
                        {
                            "name": "driver",
                            "image": f"kubedevice:{version}",
                            "readinessProbe": {
                                "httpGet": {"host": "127.0.0.1", "port": port, "path": "/readyz"},
                                "periodSeconds": 1,
                                "failureThreshold": 1,
                            },
                        }
                    ],
                },
            },
        },
    }


def _ready(pod: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def _generation(pod: Any) -> str:
    return str(pod.metadata.labels.get("pod-template-generation", ""))


def _readiness_failures(cluster: Cluster, ns: str, pod: str) -> int:
    events = cluster.events(ns, pod)
    return sum(
        max(e.count or 1, (e.series.count if e.series else 0) or 0)
        for e in events
        if e.reason == "Unhealthy" and "Readiness probe failed" in (e.message or "")
    )


@pytest.fixture
def new_version(cluster: Cluster) -> Iterator[Callable[..., GpuDra]]:
    made: list[GpuDra] = []

    def make(**kwargs: Any) -> GpuDra:
        d = GpuDra(cluster, name="gpu-dra-v2", **kwargs)
        made.append(d)
        d.start()
        return d

    yield make
    for d in made:
        d.close()


def test_a_rollout_stops_at_the_first_node_whose_new_pod_cannot_reach_the_api_server(
    cluster: Cluster,
    ns: str,
    second_node: Kubelet,
    gpu_dra: Callable[..., GpuDra],
    new_version: Callable[..., GpuDra],
) -> None:
    apps = client.AppsV1Api(cluster.api)
    port_a, port_b, api_port = free_port(), free_port(), free_port()
    gpu_dra(extra=("--pod-uid", UID_A, "--metrics-address", f"127.0.0.1:{port_a}"))
    wait_slices(cluster, DRIVER, lambda n: len(n) == 8, "8 GPUs")
    far = write_kubeconfig(
        cluster.workdir / "far.kubeconfig",
        f"https://127.0.0.1:{api_port}",
        cluster.pki / "ca.crt",
        "admin",
        cluster.tokens["admin"],
    )
    new_version(
        kubeconfig=far, extra=("--pod-uid", UID_B, "--metrics-address", f"127.0.0.1:{port_b}")
    )  # registered with kd-node's kubelet (that needs no API server)
    apps.create_namespaced_daemon_set(ns, _daemonset(port_a, "v1"))
    selector = ",".join(f"{k}={v}" for k, v in LABELS.items())

    def pods() -> list[Any]:
        return list(cluster.core.list_namespaced_pod(ns, label_selector=selector).items)

    wait_for(
        apps.list_namespaced_daemon_set,
        lambda d: (
            (d.status.number_ready or 0) == 2 and (d.status.updated_number_scheduled or 0) == 2
        ),
        90,
        "v1 Ready on both nodes",
        ns,
    )
    old = {p.spec.node_name: p.metadata.uid for p in pods()}
    assert set(old) == {NODE, second_node.node}

    # v2: B's /readyz (B cannot reach the API server)
    start = time.monotonic()
    apps.patch_namespaced_daemon_set("dra-rollout", ns, _daemonset(port_b, "v2"))
    seen: dict[str, Any] = {}

    def settled() -> bool:
        current = pods()
        new = [p for p in current if _generation(p) == "2"]
        if len(new) == 2 and all(_ready(p) for p in new) and len(current) == 2:
            seen["replaced"] = time.monotonic() - start
            return True
        if len(new) == 1:
            failures = _readiness_failures(cluster, ns, new[0].metadata.name)
            if failures >= HELD_AFTER:
                seen["held"], seen["pod"], seen["failures"] = (
                    time.monotonic() - start,
                    new[0],
                    failures,
                )
                return True
        return False

    poll_until("the rollout to finish or to be held", settled, 120)
    assert "replaced" not in seen, (
        f"every node's working pod was replaced in {seen.get('replaced', 0):.1f} s by a version "
        f"that cannot reach the API server (its /readyz: {_readyz(port_b)})"
    )
    status, why = _readyz(port_b)
    assert status == 503
    assert why.startswith("API server calls failing: "), why
    current = pods()
    held = seen["pod"]
    assert not _ready(next(p for p in current if p.metadata.uid == held.metadata.uid))
    survivors = {p.spec.node_name: p.metadata.uid for p in current if _generation(p) == "1"}
    assert survivors == old  # both old pods stay, the other node is not touched
    assert all(_ready(p) for p in current if _generation(p) == "1")
    assert [_generation(p) for p in current].count("2") == 1  # no second node touched
    print(
        f"\nrollout held at the first node ({held.spec.node_name}) {seen['held']:.1f} s after "
        f"the update: {seen['failures']} readiness failures, 0 of 2 working pods replaced"
    )

    # B reaches the API server: ready, and the rollout goes on over both nodes
    forwarder = _Forwarder(api_port, ("127.0.0.1", int(cluster.server.rsplit(":", 1)[1])))
    try:
        fixed = time.monotonic()
        wait_for(
            apps.list_namespaced_daemon_set,
            lambda d: (
                (d.status.updated_number_scheduled or 0) == 2
                and (d.status.number_available or 0) == 2
                and (d.status.number_ready or 0) == 2
                and (d.status.current_number_scheduled or 0) == 2
            ),
            120,
            "v2 Ready on both nodes",
            ns,
        )
        poll_until("the old pods gone", lambda: all(_generation(p) == "2" for p in pods()), 60)
        print(f"B reached the API server: rollout done {time.monotonic() - fixed:.1f} s later")
        assert _readyz(port_b) == (200, "ok\n")
    finally:
        apps.delete_namespaced_daemon_set("dra-rollout", ns)
        forwarder.close()

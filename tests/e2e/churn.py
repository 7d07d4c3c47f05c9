"""Pods with a claim created and deleted continuously, as load during a driver's upgrade.

:class:`PodChurn` creates a pod from a ResourceClaimTemplate every ``interval`` seconds while
fewer than ``in_flight`` of its pods are on the way to Running; a watch of the namespace's
pods sees each one Running (the time from its create call is recorded) and deletes it. The
kubelet's events are watched too: every ``FailedPrepareDynamicResources`` is kept, split by
cause: a driver's ``NodePrepareResources`` failing (:attr:`PodChurn.failed_prepares`), or the
kubelet's own read of the claim refused before any driver is called (the API server's node
authorizer has not linked the new pod's claim to the node yet, "no relationship found": the
kubelet retries at its next pod sync; :attr:`PodChurn.claim_read_retries`).
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

from kubernetes import client, watch

from .cluster import Cluster, ClusterError
from .dra import claim_pod, create_claim, resource_api

FAILED_PREPARE = "FailedPrepareDynamicResources"


def authorizer_race(message: str) -> bool:
    """Whether a ``FailedPrepareDynamicResources`` message is the kubelet's read of the claim
    refused by the node authorizer (no driver called), not a driver's failure."""
    return "fetch ResourceClaim" in message and "no relationship found" in message


class PodChurn:
    """Pods with a claim of ``spec`` in ``ns``, created and deleted in a background thread."""

    def __init__(
        self,
        cluster: Cluster,
        ns: str,
        spec: dict[str, Any],
        *,
        interval: float = 0.1,
        in_flight: int = 3,
        prefix: str = "churn",
    ) -> None:
        self.cluster = cluster
        self.ns = ns
        self.spec = spec
        self.interval = interval
        self.in_flight = in_flight
        self.prefix = prefix
        self.created: dict[str, float] = {}  # pod -> monotonic time of its create call
        self.running: dict[str, float] = {}  # pod -> seconds from create to Running
        self.failed_prepares: list[str] = []  # the events' messages: a driver failed
        self.claim_read_retries: list[str] = []  # the kubelet could not read the claim yet
        self.errors: list[str] = []
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._watches: list[watch.Watch] = []

    def start(self) -> None:
        for target in (self._watch_pods, self._watch_events, self._create):
            t = threading.Thread(target=target, name=f"churn-{target.__name__}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self, timeout: float = 60) -> None:
        """Stop creating; wait until every pod created is Running (and deleted)."""
        self._stop.set()
        deadline = time.monotonic() + timeout
        with self._cond:
            while set(self.created) - set(self.running):
                left = deadline - time.monotonic()
                if left <= 0:
                    waiting = sorted(set(self.created) - set(self.running))
                    raise ClusterError(f"pods never Running: {waiting}")
                self._cond.wait(left)
        for w in self._watches:
            w.stop()

    def wait_running(self, count: int, timeout: float = 60) -> None:
        """Wait until ``count`` pods in all have been seen Running."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while len(self.running) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ClusterError(f"{len(self.running)} pods Running, not {count}")
                self._cond.wait(left)

    def _create(self) -> None:
        n = 0
        while not self._stop.is_set():
            with self._cond:
                while len(self.created) - len(self.running) >= self.in_flight:
                    if self._stop.is_set():
                        return
                    self._cond.wait(1)
            name = f"{self.prefix}-{n}"
            n += 1
            t0 = time.monotonic()
            try:
                create_claim(self.cluster, self.ns, f"{name}-gpu", self.spec)
                self.cluster.core.create_namespaced_pod(
                    self.ns, claim_pod(name, claim=f"{name}-gpu")
                )
            except client.ApiException as exc:
                self.errors.append(f"create {name}: {exc.status} {exc.reason}")
                continue
            with self._cond:
                self.created[name] = t0
            self._stop.wait(self.interval)  # the pace of new pods

    def _watch_pods(self) -> None:
        with contextlib.suppress(Exception):  # the watch ended (stop() closes it)
            self._watch_pods_until_stopped()

    def _watch_events(self) -> None:
        with contextlib.suppress(Exception):
            self._watch_events_until_stopped()

    def _watch_pods_until_stopped(self) -> None:
        w = watch.Watch()
        self._watches.append(w)
        for ev in w.stream(self.cluster.core.list_namespaced_pod, self.ns, timeout_seconds=300):
            pod = ev["object"]
            name = pod.metadata.name
            if ev["type"] == "DELETED" or pod.status.phase != "Running":
                continue
            with self._cond:
                if name in self.running or name not in self.created:
                    continue
                self.running[name] = time.monotonic() - self.created[name]
                self._cond.notify_all()
            try:
                # not at once (the pods' grace period is 0): the kubelet unprepares the
                # claim before the pod object goes, and only then is its device freed
                self.cluster.core.delete_namespaced_pod(name, self.ns, grace_period_seconds=1)
                resource_api(self.cluster).delete_namespaced_resource_claim(f"{name}-gpu", self.ns)
            except client.ApiException as exc:
                self.errors.append(f"delete {name}: {exc.status} {exc.reason}")

    def _watch_events_until_stopped(self) -> None:
        w = watch.Watch()
        self._watches.append(w)
        for ev in w.stream(self.cluster.core.list_namespaced_event, self.ns, timeout_seconds=300):
            event: Any = ev["object"]
            if event.reason == FAILED_PREPARE:
                text = f"{event.involved_object.name}: {event.message}"
                kind = self.claim_read_retries if authorizer_race(text) else self.failed_prepares
                kind.append(text)

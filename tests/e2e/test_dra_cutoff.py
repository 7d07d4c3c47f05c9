"""Cut-off calls and freed devices on the real kubelet, with a driver whose prepare hook is a
slow plain ``def`` (tests/e2e/slow_dra.py: it sleeps 4 s in its thread).

* A rolling upgrade: instance A gets SIGTERM while its hook runs for the kubelet's
  ``NodePrepareResources``, instance B starting beside it. A waits for the hook (its stop
  grace), still registered, records it and answers the kubelet's call; B takes over with
  the claim prepared. Never two hooks of one claim at once, nothing made that is not
  recorded, no failed prepare, the pod runs.
* A pod force-deleted (grace 0): the next pod gets its device at once, and runs within
  seconds instead of after the kubelet's back-off.
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from .cluster import Cluster, Process
from .dra import (
    POD_TIMEOUT,
    DraDriver,
    claim_pod,
    claim_spec,
    create_template,
    delete_pod,
    device_class,
    log_count,
    release,
    request,
    wait_file,
    wait_slices,
)

pytestmark = pytest.mark.timeout(300)

DRIVER = "slow.kubedevice.io"
IS_SLOW = f'device.driver == "{DRIVER}"'
UID_A = "aaaaaaaa-0000-4000-8000-00000000000a"
UID_B = "bbbbbbbb-0000-4000-8000-00000000000b"
TESTS = Path(__file__).resolve().parents[1]


class SlowDra(DraDriver):
    """``python -m e2e.slow_dra`` on the harness's kubelet; ``state`` is shared by the
    instances made with :meth:`next_instance` (one node)."""

    def __init__(
        self, cluster: Cluster, root: Path, pod_uid: str, hook_s: float, name: str = "slow-dra"
    ) -> None:
        super().__init__(cluster, name, DRIVER, [], root, None)
        kubelet = cluster.kubelet
        assert kubelet is not None
        self.state = root / "state"
        self.hook_s = hook_s
        python_path = os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH")) if p)
        self.process = Process(
            self.name,
            [sys.executable, "-m", "e2e.slow_dra", "--state", str(self.state),
             "--log-level", "debug", "--driver-name", DRIVER, "--node-name", kubelet.node,
             "--kubelet-dir", str(kubelet.root), "--cdi-dir", str(self.cdi_dir),
             "--kubeconfig", str(cluster.admin_kubeconfig), "--pod-uid", pod_uid],
            self.log,
            root / "cwd",
            env={**os.environ, "PYTHONPATH": python_path, "SLOW_DRA_HOOK_S": str(hook_s)},
        )  # fmt: skip

    def next_instance(self, pod_uid: str) -> SlowDra:
        return SlowDra(self.cluster, self.root, pod_uid, self.hook_s, "slow-dra-next")

    def journal(self) -> list[tuple[str, int, str, float]]:
        path = self.state / "journal"
        if not path.exists():
            return []
        out = []
        for line in path.read_text().splitlines():
            what, pid, uid, at = line.split()
            out.append((what, int(pid), uid, float(at)))
        return out

    def made(self) -> list[str]:
        return sorted(p.name for p in (self.state / "made").glob("*"))


@pytest.fixture
def slow_dra(cluster: Cluster, ns: str) -> Iterator[Callable[..., SlowDra]]:
    made: list[SlowDra] = []

    def make(pod_uid: str = UID_A, hook_s: float = 4.0, start: bool = True) -> SlowDra:
        root = made[0].root if made else Path(tempfile.mkdtemp(prefix="kdds-", dir="/tmp"))
        d = made[0].next_instance(pod_uid) if made else SlowDra(cluster, root, pod_uid, hook_s)
        made.append(d)
        if start:
            d.start()
        return d

    yield make
    release(cluster, ns, [d for d in made if d.process.alive()] or made[-1:])
    for d in made:
        d.stop()
    if made:
        made[0].close()


def _overlaps(journal: list[tuple[str, int, str, float]]) -> list[str]:
    """Hooks of one claim that ran at the same time (by their enter/leave lines)."""
    inside: dict[str, list[str]] = {}
    found = []
    for what, pid, uid, _at in journal:
        kind, hook = what.split("-", 1)
        who = f"{hook}@{pid}"
        if kind == "enter":
            if inside.get(uid):
                found.append(f"{uid}: {who} entered while {inside[uid]} ran")
            inside.setdefault(uid, []).append(who)
        else:
            inside[uid].remove(who)
    return found


def test_a_sigterm_during_a_slow_prepare_hook_waits_for_it_and_hands_the_claim_over(
    cluster: Cluster, ns: str, slow_dra: Callable[..., SlowDra]
) -> None:
    a = slow_dra(UID_A)
    wait_slices(cluster, DRIVER, lambda n: len(n) == 2, "2 devices")
    with device_class(cluster, IS_SLOW) as cls:
        create_template(cluster, ns, "one", claim_spec(request("dev", cls)))
        created = time.monotonic()
        cluster.create_pod(ns, claim_pod("p", template="one"))
        journal = a.state / "journal"
        wait_file(journal, lambda p: p.exists() and "enter-prepare" in p.read_text(), 120,
                  "A in its prepare hook for the kubelet's call")  # fmt: skip
        b = slow_dra(UID_B, start=False)
        b.start(wait=False)  # the DaemonSet's next pod starts beside A ...
        assert a.process.popen is not None
        sent = time.monotonic()
        os.kill(a.process.pid, signal.SIGTERM)  # ... and A is told to go, its hook running
        code = a.process.popen.wait(60)
        exit_s = time.monotonic() - sent
        b.wait_registered(1)
        cluster.wait_running(ns, "p", timeout=POD_TIMEOUT)
        running_s = time.monotonic() - created
        print(f"\nSIGTERM -> exit with a hook in flight: {exit_s:.2f} s (hook {a.hook_s:g} s); "
              f"pod created -> Running: {running_s:.2f} s")  # fmt: skip
        assert code == 0
        failed = [
            e.message
            for e in cluster.events(ns, "p")
            if e.reason == "FailedPrepareDynamicResources"
        ]
        assert failed == [], failed  # the kubelet got A's answer to its call
        entered = [e for e in a.journal() if e[0] == "enter-prepare"]
        assert len(entered) == 1, f"the claim was prepared again: {a.journal()}"
        assert _overlaps(a.journal()) == []
        assert len(a.made()) == 1  # what A's hook made, recorded
        assert log_count(a.log, "calls still in flight after the stop grace") == 0
        delete_pod(cluster, ns, "p")  # B unprepares what A recorded
        b.wait_specs(lambda specs: not specs, "the claim's spec removed")
        stop_sent = time.monotonic()
        assert b.stop() == 0
        idle_exit_s = time.monotonic() - stop_sent
        print(f"SIGTERM -> exit, idle: {idle_exit_s:.2f} s")
    assert _overlaps(a.journal()) == []
    assert a.made() == [], f"made by a hook and recorded nowhere: {a.made()}"
    assert [e[0] for e in a.journal()] == [
        "enter-prepare", "leave-prepare", "enter-unprepare", "leave-unprepare",
    ]  # fmt: skip


def test_the_next_pod_on_the_device_of_a_force_deleted_pod_runs_at_once(
    cluster: Cluster, ns: str, slow_dra: Callable[..., SlowDra]
) -> None:
    slow_dra(UID_A, hook_s=0.0)
    wait_slices(cluster, DRIVER, lambda n: len(n) == 2, "2 devices")
    only_first = f'device.attributes["{DRIVER}"].index == 0'
    with device_class(cluster, IS_SLOW, only_first) as cls:
        create_template(cluster, ns, "one", claim_spec(request("dev", cls)))
        cluster.create_pod(ns, claim_pod("first", template="one"))
        cluster.wait_running(ns, "first", timeout=POD_TIMEOUT)
        cluster.core.delete_namespaced_pod("first", ns, grace_period_seconds=0)
        created = time.monotonic()
        cluster.create_pod(ns, claim_pod("next", template="one"))  # gets slow-0 once it is free
        pod: Any = cluster.wait_running(ns, "next", timeout=POD_TIMEOUT)
        running_s = time.monotonic() - created
        print(f"\nforce delete -> the next pod on the device Running: {running_s:.2f} s")
        assert pod.status.phase == "Running"
        failed = [
            e.message
            for e in cluster.events(ns, "next")
            if e.reason == "FailedPrepareDynamicResources"
        ]
        assert failed == [], failed
        assert running_s < 10

"""Device health through DRA on the real Kubernetes components: how fast a fault shows; prints JSON.

Brings up the end-to-end tier's cluster (``tests/e2e/cluster.py``: etcd, kube-apiserver,
kube-scheduler, kube-controller-manager, a real kubelet with kd-fakecri; binaries from
``$KUBEDEVICE_K8S_BIN``, found as the end-to-end tier finds them) and runs the drivers as
the tier does (``tests/e2e/dra.py``): ``kubedevice nvidia dra --nvml fake:dgx-8gpu`` with
XIDs sent to the fake NVML's control socket, and ``kubedevice run --dra`` on a fake /dev
tree whose sysfs health check is made to fail. Every time is seen by a watch of the API
server (one watch of the pods, one of the ResourceSlices, each for the whole run), from the
moment the fault is injected:

* ``xid``: an XID 79 on the GPU of a running pod, and at once one on the free GPU the
  scheduler would give next; then a new pod is created. XID -> the taint
  ``gpu.kubedevice.io/xid=79`` (NoSchedule) in the ResourceSlice; -> the pod's
  ``allocatedResourcesStatus`` Unhealthy with the XID's message; the new pod created ->
  Running, and whether it got a GPU with the XID (it must not). The GPUs recover after the
  quiet period (``xidPolicies: {79: quiet}``, ``quietPeriod``; XID 79's default policy
  waits for a reset): taint seen -> taint gone, and Unhealthy seen -> the pod's status
  Healthy again (both include the quiet period, given in the output).
* ``evict``: ``health.evictOn: [xid]``: XID -> taint (NoExecute) -> the controller-manager's
  device-taint eviction: XID -> the pod's ``deletionTimestamp`` set, -> the pod gone.
* ``dev_evict``: the /dev driver with ``--evict-on health-check`` and a 0.2 s check period:
  the check's sysfs file written bad -> taint, -> pod status Unhealthy (when seen before
  the pod goes), -> ``deletionTimestamp``, -> gone; written good again -> taint gone.

For the GPU driver the driver's own log splits the first step: XID -> the event thread
marks the GPU Unhealthy (``Unhealthy until`` line) -> the ResourceSlice written
(``published`` line).

Usage: ``sudo .venv/bin/python bench/bench_dra_health.py [--runs N] [--seconds S]
[--keep-logs]`` (each figure: ``N`` runs, or fewer when ``S`` seconds have passed; the
components' logs kept for reading their timestamps). Needs root (a real kubelet);
re-runs itself in a private mount namespace, as scripts/e2e does.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from _common import cpu_model, e2e_cluster, pct  # noqa: E402

GPU_DRIVER = "gpu.kubedevice.io"
DEV_DRIVER = "dev.kubedevice.io"
XID_MESSAGE = "XID 79: GPU has fallen off the bus"
QUIET_S = 1.0
GPU_CONFIG = f"version: v1\nhealth:\n  quietPeriod: {QUIET_S}s\n  xidPolicies: {{79: quiet}}\n"

Event = tuple[float, str, Any]  # (monotonic time it arrived, watch event type, object)


class Recorder:
    """One list and watch, in a thread, for the whole bench: every event with the time it
    arrived, so a figure is read off the events that came after its fault was injected."""

    def __init__(self, list_fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        self._list = (list_fn, args, kwargs)
        self._cond = threading.Condition()
        self._events: list[Event] = []
        self._watch: Any = None
        self._stopped = False
        self._listing: Any = None
        rv = self._relist()
        threading.Thread(target=self._run, args=(rv,), daemon=True).start()

    def _relist(self) -> str:
        list_fn, args, kwargs = self._list
        self._listing = list_fn(*args, **kwargs)
        self._add([(time.monotonic(), "LISTED", o) for o in self._listing.items])
        return str(self._listing.metadata.resource_version)

    def _add(self, events: list[Event]) -> None:
        with self._cond:
            self._events.extend(events)
            self._cond.notify_all()

    def _run(self, rv: str) -> None:
        from e2e.cluster import watch_of
        from kubernetes.client import ApiException

        list_fn, args, kwargs = self._list
        while not self._stopped:
            self._watch = watch_of(self._listing)
            try:
                for ev in self._watch.stream(
                    list_fn, *args, resource_version=rv, timeout_seconds=300, **kwargs
                ):
                    if ev["type"] == "ERROR":  # 410 Gone: list again
                        rv = self._relist()
                        break
                    rv = ev["object"].metadata.resource_version
                    self._add([(time.monotonic(), ev["type"], ev["object"])])
            except ApiException as e:
                if e.status != 410 or self._stopped:
                    raise
                rv = self._relist()
            except Exception:
                if self._stopped:  # the cluster stopped under the watch
                    return
                raise

    def first(
        self, since: float, match: Callable[[str, Any], bool], timeout: float, what: str
    ) -> float:
        """The arrival time of the first event after ``since`` that ``match(type, obj)``."""
        deadline = time.monotonic() + timeout
        seen = 0
        with self._cond:
            while True:
                for at, kind, obj in self._events[seen:]:
                    if at >= since and match(kind, obj):
                        return at
                seen = len(self._events)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no event in {timeout:.0f} s: {what}")
                self._cond.wait(left)

    def stop(self) -> None:
        """Stop watching (the thread ends at its next event or when the cluster stops)."""
        self._stopped = True
        if self._watch is not None:
            self._watch.stop()


def _taints(kind: str, s: Any, device: str) -> list[Any] | None:
    """The taints of ``device`` in the slice event, ``None`` where it is not in it."""
    for d in s.spec.devices or [] if kind != "DELETED" else []:
        if d.name == device:
            return list(d.taints or [])
    return None


def tainted(device: str) -> Callable[[str, Any], bool]:
    return lambda kind, s: bool(_taints(kind, s, device))


def untainted(device: str) -> Callable[[str, Any], bool]:
    return lambda kind, s: _taints(kind, s, device) == []


def pod_is(name: str, predicate: Callable[[Any], bool]) -> Callable[[str, Any], bool]:
    return lambda kind, p: kind != "DELETED" and p.metadata.name == name and predicate(p)


def pod_gone(name: str) -> Callable[[str, Any], bool]:
    return lambda kind, p: kind == "DELETED" and p.metadata.name == name


def _log_time(log: Path, after_wall: float, *needles: str) -> float | None:
    """The wall time of the first line of a log after ``after_wall`` holding every needle."""
    found = _log_line(log, after_wall, *needles)
    return None if found is None else found[0]


def _log_line(log: Path, after_wall: float, *needles: str) -> tuple[float, str] | None:
    """The first line of a log after ``after_wall`` holding every needle, and its time:
    our text format (``2026-11-27 12:41:50,065 ...``, this machine's time zone) or klog's
    (``I1127 12:41:50.065205 ...``, UTC, this year)."""
    year = time.gmtime(after_wall).tm_year
    for line in log.read_text(errors="replace").splitlines():
        if not all(n in line for n in needles):
            continue
        try:
            if line[:1] in "IWE" and line[1:5].isdigit():
                text = f"{year}{line[1:21]}+0000"
                stamp = datetime.datetime.strptime(text, "%Y%m%d %H:%M:%S.%f%z").timestamp()
            else:
                stamp = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        except ValueError:
            continue
        if stamp >= after_wall - 0.001:
            return stamp, line
    return None


def summary(samples: list[float]) -> dict[str, float | int]:
    """p50, p99 and max of ``samples`` in seconds (3 decimals) and how many there are."""
    if not samples:
        return {"n": 0}
    return {
        "n": len(samples),
        "p50": round(pct(samples, 0.5), 3),
        "p99": round(pct(samples, 0.99), 3),
        "max": round(max(samples), 3),
    }


class Bench:
    """The cluster, one namespace, the watches; each figure a method."""

    def __init__(self, cluster: Any, ns: str, runs: int, seconds: float) -> None:
        from e2e.dra import resource_api

        self.cluster = cluster
        self.ns = ns
        self.runs = runs
        self.seconds = seconds
        self.pods = Recorder(cluster.core.list_namespaced_pod, ns)
        self.slices = Recorder(resource_api(cluster).list_resource_slice)
        self.claims = Recorder(resource_api(cluster).list_namespaced_resource_claim, ns)

    def repeat(self) -> Iterator[int]:
        """Run numbers until ``runs`` are done or ``seconds`` have passed."""
        start = time.monotonic()
        for i in range(self.runs):
            if i and time.monotonic() - start > self.seconds:
                return
            yield i

    def gpu_of(self, pod: str) -> str:
        from e2e.dra import allocated, pod_claim

        [name] = allocated(pod_claim(self.cluster, self.ns, pod))
        return str(name)

    def run_pod(self, name: str, template: str) -> float:
        """Create a pod on the template's claim; seconds from the create call to Running."""
        from e2e.dra import claim_pod

        t0 = time.monotonic()
        self.cluster.create_pod(self.ns, claim_pod(name, template=template))
        running = self.pods.first(t0, pod_is(name, _running), 150, f"{name} Running")
        return running - t0

    def xid(self, drv: Any) -> dict[str, Any]:
        """Figures 1, 2 and 4: the pod's status, the taint, the next pod, the recovery."""
        from e2e.dra import device_health

        drv.start()
        gpus = [f"gpu-{i}" for i in range(8)]
        self.wait_clean(GPU_DRIVER, gpus)
        uuid_of = dict(zip(gpus, drv.uuids, strict=True))
        self.run_pod("p", "one")
        bad = self.gpu_of("p")
        spare = max(g for g in gpus if g != bad)  # the one GPU without an XID
        hit = [g for g in gpus if g != spare]

        def unhealthy(p: Any) -> bool:
            return ("Unhealthy", XID_MESSAGE) in device_health(p)

        def healthy(p: Any) -> bool:
            return [h for h, _ in device_health(p)] == ["Healthy"]

        f: dict[str, list[float]] = {
            k: []
            for k in (
                "xid_to_driver_unhealthy_s",
                "xid_to_slice_written_s",
                "xid_to_taint_seen_s",
                "xid_to_kubelet_health_notice_s",
                "xid_to_pod_status_unhealthy_s",
                "next_pod_at_once_created_to_running_s",
                "next_pod_after_taint_created_to_running_s",
                "taint_seen_to_taint_lifted_s",
                "unhealthy_to_pod_status_healthy_s",
            )
        }
        uid = self.cluster.core.read_namespaced_pod("p", self.ns).metadata.uid
        kubelet_log = self.cluster.logs / "kubelet.log"
        landed: dict[str, list[str]] = {"at_once": [], "after_taint": []}
        on_bad_gpu: list[str] = []
        resync: dict[str, list[str]] = {"at_once": [], "after_taint": []}
        for i in self.repeat():
            # even runs: the next pod created at once after the XIDs; odd: once the watch
            # has seen every taint
            when = "at_once" if i % 2 == 0 else "after_taint"
            wall0, t0 = time.time(), time.monotonic()
            drv.send({"op": "xid", "uuid": uuid_of[bad], "xid": 79})
            for g in hit:
                if g != bad:
                    drv.send({"op": "xid", "uuid": uuid_of[g], "xid": 79})
            q = f"q{i}"
            if when == "after_taint":
                for g in hit:
                    self.slices.first(t0, tainted(g), 30, f"{g} tainted")
            t_create = self.run_pod(q, "one")
            t_taint = self.slices.first(t0, tainted(bad), 30, f"{bad} tainted")
            t_all = max(self.slices.first(t0, tainted(g), 30, f"{g} tainted") for g in hit)
            t_bound = self.pods.first(t0, pod_is(q, lambda p: bool(p.spec.node_name)), 0, "")
            t_bad = self.pods.first(t0, pod_is("p", unhealthy), 60, "p Unhealthy")
            got = self.gpu_of(q)
            landed[when].append(got)
            if got != spare:
                on_bad_gpu.append(
                    f"run {i} ({when}): {q} got {got}, bound {t_bound - t_all:+.3f} s after "
                    "the last taint was seen"
                )
            t_lifted = self.slices.first(t_taint, untainted(bad), 60, f"{bad} untainted")
            for g in hit:
                self.slices.first(t_taint, untainted(g), 60, f"{g} untainted")
            t_good = self.pods.first(t_bad, pod_is("p", healthy), 90, "p Healthy again")
            marked = _log_time(drv.log, wall0, uuid_of[bad], "Unhealthy until")
            written = _log_time(drv.log, wall0, "published 8 devices (", " tainted)")
            notice = _log_time(kubelet_log, wall0, "Sending health update notification", uid)
            if marked is not None and written is not None:
                f["xid_to_driver_unhealthy_s"].append(marked - wall0)
                f["xid_to_slice_written_s"].append(written - wall0)
            if notice is not None:
                f["xid_to_kubelet_health_notice_s"].append(notice - wall0)
            f["xid_to_taint_seen_s"].append(t_taint - t0)
            f["xid_to_pod_status_unhealthy_s"].append(t_bad - t0)
            refused = _log_line(
                kubelet_log, wall0, "Failed to prepare dynamic resources", f'pod="{self.ns}/{q}"'
            )
            if refused is None:
                f[f"next_pod_{when}_created_to_running_s"].append(t_create)
            else:  # the kubelet prepares again at its next pod sync (10 s here)
                why = "node authorizer" if "no relationship found" in refused[1] else "refused"
                if "is Unhealthy" in refused[1]:
                    why = "driver refused: device Unhealthy"
                resync[when].append(f"run {i}: {t_create:.1f} s ({why})")
            f["taint_seen_to_taint_lifted_s"].append(t_lifted - t_taint)
            f["unhealthy_to_pod_status_healthy_s"].append(t_good - t_bad)
            self.delete(q, drv)
        self.delete("p", drv)
        drv.close()
        out: dict[str, Any] = {k: summary(v) for k, v in f.items()}
        # by run (even runs: the next pod created at once): what the p99 is made of
        out["xid_to_pod_status_unhealthy_by_run_s"] = [
            round(t, 3) for t in f["xid_to_pod_status_unhealthy_s"]
        ]
        out["quiet_period_s"] = QUIET_S
        out["spare_gpu"] = spare
        out["next_pod_gpu"] = landed
        out["next_pod_on_a_gpu_with_the_xid"] = on_bad_gpu
        out["next_pod_waited_for_a_kubelet_resync"] = resync
        return out

    def delete(self, pod: str, drv: Any) -> None:
        """Delete the pod; wait until its claim (from the template) is gone and the driver
        has unprepared it, so the next pod finds its device free."""
        from e2e.dra import delete_pod, pod_claim

        claim = pod_claim(self.cluster, self.ns, pod).metadata
        t0 = time.monotonic()
        delete_pod(self.cluster, self.ns, pod)
        self.released(drv, claim, t0)

    def released(self, drv: Any, claim: Any, since: float) -> None:
        """Until the claim is deleted (after ``since``) and the driver has unprepared it.

        A pod deleted with no grace period leaves the API server before the kubelet has
        unprepared its claim; the device may then be allocated again while the driver still
        holds it for the old claim, and the driver refuses the new one until the kubelet
        retries (its next pod sync)."""
        self.claims.first(
            since,
            lambda kind, c: kind == "DELETED" and c.metadata.uid == claim.uid,
            60,
            f"claim {claim.name} deleted",
        )
        drv.wait_specs(
            lambda specs: not any(claim.uid in name for name in specs),
            f"claim {claim.name} unprepared",
        )

    def evict(self, drv: Any) -> dict[str, Any]:
        """Figure 3 for the GPU driver: ``evictOn: [xid]``."""
        from e2e.dra import pod_claim

        drv.start()
        self.wait_clean(GPU_DRIVER, [f"gpu-{i}" for i in range(8)])
        uuid_of = {f"gpu-{i}": u for i, u in enumerate(drv.uuids)}
        f: dict[str, list[float]] = {"xid_to_taint_seen_s": [], "xid_to_deletion_started_s": []}
        f["xid_to_pod_gone_s"] = []
        for i in self.repeat():
            v = f"v{i}"
            self.run_pod(v, "one")
            claim = pod_claim(self.cluster, self.ns, v).metadata
            gpu = self.gpu_of(v)
            t0 = time.monotonic()
            drv.send({"op": "xid", "uuid": uuid_of[gpu], "xid": 79})
            t_taint = self.slices.first(t0, tainted(gpu), 30, f"{gpu} tainted")
            t_del = self.pods.first(t0, pod_is(v, _deleting), 60, f"{v} evicted")
            t_gone = self.pods.first(t0, pod_gone(v), 60, f"{v} gone")
            self.released(drv, claim, t0)
            f["xid_to_taint_seen_s"].append(t_taint - t0)
            f["xid_to_deletion_started_s"].append(t_del - t0)
            f["xid_to_pod_gone_s"].append(t_gone - t0)
            self.slices.first(t_taint, untainted(gpu), 60, f"{gpu} untainted")
        drv.close()
        return {k: summary(v) for k, v in f.items()}

    def dev_evict(self, drv: Any) -> dict[str, Any]:
        """Figure 3 (and the taint's way back) for the /dev driver's failing group check."""
        from e2e.dra import device_health, pod_claim

        drv.host.add_char_device("/dev/e2e0")
        ok = drv.host.sys("/sys/class/e2e/e2e0")
        ok.mkdir(parents=True)
        (ok / "ok").write_text("1\n")
        drv.start()
        from e2e.dra import slice_devices

        self.wait_clean(DEV_DRIVER, None)
        [dev] = slice_devices(self.cluster, DEV_DRIVER)
        f: dict[str, list[float]] = {
            k: []
            for k in (
                "check_failed_to_taint_seen_s",
                "check_failed_to_pod_status_unhealthy_s",
                "check_failed_to_deletion_started_s",
                "check_failed_to_pod_gone_s",
                "check_ok_to_taint_lifted_s",
            )
        }
        for i in self.repeat():
            d = f"d{i}"
            self.run_pod(d, "dev")
            claim = pod_claim(self.cluster, self.ns, d).metadata
            t0 = time.monotonic()
            (ok / "ok").write_text("0\n")
            t_taint = self.slices.first(t0, tainted(dev), 30, f"{dev} tainted")
            t_del = self.pods.first(t0, pod_is(d, _deleting), 60, f"{d} evicted")
            t_gone = self.pods.first(t0, pod_gone(d), 60, f"{d} gone")
            self.released(drv, claim, t0)
            with contextlib.suppress(TimeoutError):  # the pod may go before the kubelet says
                t_bad = self.pods.first(
                    t0, pod_is(d, lambda p: "Unhealthy" in dict(device_health(p))), 0, ""
                )
                f["check_failed_to_pod_status_unhealthy_s"].append(t_bad - t0)
            f["check_failed_to_taint_seen_s"].append(t_taint - t0)
            f["check_failed_to_deletion_started_s"].append(t_del - t0)
            f["check_failed_to_pod_gone_s"].append(t_gone - t0)
            t1 = time.monotonic()
            (ok / "ok").write_text("1\n")
            t_lifted = self.slices.first(t1, untainted(dev), 30, f"{dev} untainted")
            f["check_ok_to_taint_lifted_s"].append(t_lifted - t1)
        drv.close()
        return {k: summary(v) for k, v in f.items()}

    def wait_clean(self, driver: str, devices: list[str] | None) -> None:
        """Until the driver's devices (all, with ``None``) are published without a taint."""
        from e2e.dra import wait_slices

        wait_slices(
            self.cluster,
            driver,
            lambda names: bool(names) and (devices is None or set(devices) <= names),
            "published, untainted",
        )


def _running(p: Any) -> bool:
    return p.status.phase == "Running" and p.metadata.deletion_timestamp is None


def _deleting(p: Any) -> bool:
    return p.metadata.deletion_timestamp is not None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="runs per figure (default 20)")
    parser.add_argument(
        "--seconds", type=float, default=180, help="no new run of a figure after this long"
    )
    parser.add_argument(
        "--keep-logs", action="store_true", help="keep the components' logs (path on stderr)"
    )
    args = parser.parse_args()
    from e2e.cluster import namespace
    from e2e.dra import (
        CHECKED_DEV_CONFIG,
        GenericDra,
        GpuDra,
        claim_spec,
        create_template,
        device_class,
        request,
    )

    out: dict[str, Any] = {"machine": cpu_model(), "kubernetes": "v1.36.2"}
    with e2e_cluster("bench_dra_health", keep_logs=args.keep_logs) as cluster:
        with (
            namespace(cluster, "bench") as ns,
            device_class(cluster, f'device.driver == "{GPU_DRIVER}"') as gpu,
            device_class(cluster, f'device.driver == "{DEV_DRIVER}"') as dev,
        ):
            create_template(cluster, ns, "one", claim_spec(request("gpu", gpu)))
            create_template(cluster, ns, "dev", claim_spec(request("dev", dev)))
            bench = Bench(cluster, ns, args.runs, args.seconds)
            out["xid"] = bench.xid(GpuDra(cluster, config=GPU_CONFIG))
            evict = GPU_CONFIG + "  evictOn: [xid]\n"
            out["evict"] = bench.evict(GpuDra(cluster, config=evict))
            dev_drv = GenericDra(cluster, CHECKED_DEV_CONFIG, extra=("--evict-on", "health-check"))
            out["dev_evict"] = bench.dev_evict(dev_drv)
            for recorder in (bench.pods, bench.slices, bench.claims):
                recorder.stop()
        out["load_1m"] = round(os.getloadavg()[0], 2)
    print(json.dumps(out))


if __name__ == "__main__":
    main()

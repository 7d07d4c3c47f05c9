"""What a driver costs the control plane per node, with many nodes; prints JSON.

For each layout and node count N: the real etcd, kube-apiserver, kube-scheduler and
kube-controller-manager (``tests/e2e/cluster.py``, no kubelet; the node lifecycle controller
off, so Nodes without heartbeats stay schedulable) and N Nodes (Ready, 64 CPUs, 110 pods).
The DRA layouts' nodes are simulated by ``_fleet_nodes.py`` workers: per node the kit's own
``KubeClient`` and ``SlicePublisher``, publishing what the driver builds and watching its
slices (see that file). Layouts:

* ``gpu``: 8 GPUs as the GPU DRA driver publishes them (fake NVML ``dgx-8gpu``);
* ``mig``: the same with MIG on demand (``dgx-8gpu-mig``: 208 devices, 8 counter sets);
* ``mig-few``: MIG on demand offering only 1g.10gb and 3g.40gb (``dra.migOnDemandProfiles``:
  80 devices, 8 counter sets);
* ``dev``: 1,000 ``/dev`` devices, as the ``/dev`` DRA driver publishes them;
* ``plugin``: the device plugin's way: ``nvidia.com/gpu: 8`` in each Node's allocatable
  (the plugin itself never calls the API server; the kubelet's node status carries it).

Per case: start -> every node's slices published (s); during a quiet window, the API server's
requests for ResourceSlices and Nodes by verb (``apiserver_request_total`` deltas, per node
per minute; 0 LIST and 0 writes expected), watches of ResourceSlices open
(``apiserver_longrunning_requests``) and ``apiserver_registered_watchers``; etcd's size in use
per node; the API server's RSS and CPU per 100 nodes (``/proc``); a rolling upgrade (each
node's publisher replaced by a new instance that adopts the slices): its requests by verb and
its slice writes; the scheduler's throughput and latency for pods with a 1-GPU claim (and, for
the GPU layouts, 2 GPUs on one PCIe root by ``matchAttribute``; for ``mig`` also a 1g.10gb
MIG device), created held by a scheduling gate and released all at once: pods/s from the
first release to the last binding, release -> bound p50/p99 (no kubelets: pods are bound,
never run). The scheduler runs with ``--kube-api-qps=1000 --kube-api-burst=1000`` (its
default 50/100 caps it at ~25 DRA pods/s, two writes each).

Also the RSS of one real driver process (``kubedevice nvidia dra`` on fake NVML), to say how
many would fit on this machine.

Usage: ``python bench/bench_fleet.py [--quick] [--nodes 10,100,1000] [--layouts
gpu,mig,mig-few,dev,plugin] [--quiet-s 60] [--pods 300] [--workers 2] [--all-sizes]``: the
``mig``, ``mig-few`` and ``dev`` layouts run up to 100 nodes unless ``--all-sizes``, the MIG
layouts with at most 40 pods per scheduling run. ``--quick``: N=10, the gpu
and plugin layouts, a 10 s quiet window, no real driver process (the CI test's mode).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import http.client
import json
import os
import re
import shutil
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import defaultdict
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "tests"))

from _common import cpu_model, pct  # noqa: E402

from kubedevice.errors import KubeApiError  # noqa: E402

GPU_DRIVER = "gpu.kubedevice.io"
DEV_DRIVER = "dev.kubedevice.io"
PREFIX = "fleet-"
_SAMPLE = re.compile(r"^(\w+)(?:\{(.*)\})? ([0-9.eE+-]+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


# ---------------------------------------------------------------------------------------------
# the control plane's figures


def metrics(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    out = []
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m and m.group(1) == name:
            out.append((dict(_LABEL.findall(m.group(2) or "")), float(m.group(3))))
    return out


AUDIT_POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [ResponseStarted, ResponseComplete, Panic]
rules:
- level: Metadata
  resources:
  - {group: "", resources: [nodes, nodes/status]}
  - {group: resource.k8s.io, resources: [resourceslices]}
- level: None
"""


def audit_flags(workdir: Path) -> tuple[str, ...]:
    """The API server's audit log of every request for Nodes and ResourceSlices (who, verb)."""
    policy = workdir / "audit-policy.yaml"
    policy.write_text(AUDIT_POLICY)
    return (f"--audit-policy-file={policy}", f"--audit-log-path={workdir / 'audit.log'}")


class Plane:
    """The control plane and what it says about itself."""

    def __init__(self, cluster: Any, audit: Path) -> None:
        from kubedevice.dra.api.kube import KubeClient

        self.cluster = cluster
        self.audit = audit
        self.kube = KubeClient.connect(cluster.admin_kubeconfig)
        self.api_pid = cluster.procs["kube-apiserver"].pid

    def call(
        self, method: str, path: str, body: Any = None, ctype: str = "application/json"
    ) -> Any:
        return self.kube.call(method, path, body=body, content_type=ctype)

    def api_metrics(self) -> str:
        conn = self.connection(30)
        try:
            conn.request("GET", "/metrics", headers=self.headers)
            return conn.getresponse().read().decode()
        finally:
            conn.close()

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.cluster.tokens['admin']}"}

    def connection(self, timeout: float | None) -> http.client.HTTPSConnection:
        """A connection of its own to the API server (a scrape, a watch read raw)."""
        ctx = ssl.create_default_context(cafile=str(self.cluster.pki / "ca.crt"))
        return http.client.HTTPSConnection(
            "127.0.0.1", self.cluster.api_port, context=ctx, timeout=timeout
        )

    def requests(self, text: str) -> dict[str, float]:
        """``apiserver_request_total`` of ResourceSlices and Nodes, by resource and verb."""
        out: dict[str, float] = defaultdict(float)
        for labels, value in metrics(text, "apiserver_request_total"):
            if labels.get("resource") in ("resourceslices", "nodes"):
                sub = f"/{labels['subresource']}" if labels.get("subresource") else ""
                key = f"{labels['resource']}{sub} {labels['verb']}"
                out[key] += value
        return out

    def watches(self, text: str) -> dict[str, float]:
        open_ = sum(
            v
            for labels, v in metrics(text, "apiserver_longrunning_requests")
            if labels.get("resource") == "resourceslices" and labels.get("verb") == "WATCH"
        )
        return {"open": open_}

    def etcd_bytes(self) -> float:
        url = f"http://127.0.0.1:{self.cluster.etcd_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as r:
            text = r.read().decode()
        return sum(v for _, v in metrics(text, "etcd_mvcc_db_total_size_in_use_in_bytes"))

    def proc(self, name: str = "kube-apiserver") -> tuple[float, float]:
        """A component's CPU seconds so far and RSS (MB)."""
        pid = self.cluster.procs[name].pid
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        rss = 0.0
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) / 1024
        return cpu, rss

    def drivers(self, since: int) -> tuple[dict[str, float], int]:
        """The drivers' requests (user agent ``kubedevice-dra``) in the audit log after byte
        ``since``, by resource and verb; and the log's size now. The bench's own calls on
        Nodes and ResourceSlices are made outside the windows this is asked about."""
        out: dict[str, float] = defaultdict(float)
        if not self.audit.exists():
            return out, since
        with self.audit.open("rb") as f:
            f.seek(since)
            data = f.read()
        end = since + data.rfind(b"\n") + 1
        for line in data[: end - since].splitlines():
            event = json.loads(line)
            if event.get("userAgent", "").startswith("kubedevice-dra"):
                ref = event.get("objectRef", {})
                sub = f"/{ref['subresource']}" if ref.get("subresource") else ""
                out[f"{ref.get('resource')}{sub} {event['verb']}"] += 1
        return out, end

    def snapshot(self, since: int = 0) -> dict[str, Any]:
        text = self.api_metrics()
        cpu, rss = self.proc()
        drivers, offset = self.drivers(since)
        return {
            "drivers": drivers,
            "offset": offset,
            "t": time.monotonic(),
            "requests": self.requests(text),
            "watches": self.watches(text),
            "etcd": self.etcd_bytes(),
            "cpu": cpu,
            "rss": rss,
        }


def delta(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    return {
        k: b.get(k, 0) - a.get(k, 0) for k in sorted(set(a) | set(b)) if b.get(k, 0) != a.get(k, 0)
    }


def parallel(fn: Any, items: list[Any], threads: int = 8) -> list[Any]:
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        return list(pool.map(fn, items))


# ---------------------------------------------------------------------------------------------
# nodes


def make_nodes(plane: Plane, n: int, layout: str) -> None:
    capacity = {"cpu": "64", "memory": "512Gi", "pods": "110"}
    if layout == "plugin":
        capacity["nvidia.com/gpu"] = "8"

    def one(i: int) -> None:
        name = f"{PREFIX}{i:04d}"
        plane.call("POST", "/api/v1/nodes", {"metadata": {"name": name, "labels": {"fleet": "1"}}})
        status = {
            "status": {
                "capacity": capacity,
                "allocatable": capacity,
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
            }
        }
        plane.call("PATCH", f"/api/v1/nodes/{name}/status", status, "application/merge-patch+json")

    parallel(one, list(range(n)))


class Workers:
    """The worker processes simulating the nodes of a DRA layout."""

    def __init__(self, kubeconfig: Path, layout: str, n: int, processes: int) -> None:
        self.procs: list[subprocess.Popen[str]] = []
        per = -(-n // processes)
        for first in range(0, n, per):
            count = min(per, n - first)
            self.procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        str(HERE / "_fleet_nodes.py"),
                        str(kubeconfig),
                        layout,
                        PREFIX,
                        str(first),
                        str(count),
                    ],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                )
            )

    def answers(self, event: str, timeout: float) -> list[dict[str, Any]]:
        out = []
        for p in self.procs:
            assert p.stdout is not None
            line = p.stdout.readline()
            if not line:
                raise RuntimeError(f"a fleet worker exited (status {p.wait(timeout)})")
            answer = json.loads(line)
            assert answer["event"] == event, answer
            out.append(answer)
        return out

    def send(self, command: str) -> None:
        for p in self.procs:
            assert p.stdin is not None
            p.stdin.write(command + "\n")
            p.stdin.flush()

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            self.send("stop")
        for p in self.procs:
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def wait_watches(plane: Plane, want: float, timeout: float = 60) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    while True:
        w = plane.watches(plane.api_metrics())
        if w["open"] >= want or time.monotonic() > deadline:
            return w
        time.sleep(0.5)


# ---------------------------------------------------------------------------------------------
# scheduling


class PodWatch:
    """When each pod of a namespace got its node (a watch, read raw)."""

    def __init__(self, plane: Plane, ns: str) -> None:
        self.bound: dict[str, float] = {}
        self.changed = threading.Condition()
        self.error: str | None = None
        #: times the API server ended the watch (a slow reader is cut off) and it was made again
        #: from the last version seen (what came meanwhile is then seen late)
        self.rewatches = 0
        self._plane, self._ns = plane, ns
        self._closed = False
        self._version = ""
        self._conn = self._open()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _open(self) -> http.client.HTTPSConnection:
        conn = self._plane.connection(None)
        path = f"/api/v1/namespaces/{self._ns}/pods?watch=1&resourceVersion={self._version}"
        conn.request("GET", path, headers=self._plane.headers)
        self._response = conn.getresponse()
        return conn

    def _read(self) -> None:
        try:
            while True:
                while line := self._response.readline():
                    now = time.monotonic()
                    if not line.strip():
                        continue
                    obj = json.loads(line).get("object", {})
                    meta = obj.get("metadata", {})
                    self._version = meta.get("resourceVersion", self._version)
                    name = meta.get("name")
                    if obj.get("spec", {}).get("nodeName") and name not in self.bound:
                        with self.changed:
                            self.bound[name] = now
                            self.changed.notify_all()
                if self._closed:
                    return
                self.rewatches += 1
                self._conn.close()
                self._conn = self._open()
        except Exception as exc:  # closed by close(), or broken
            if not self._closed:
                self.error = f"{type(exc).__name__}: {exc}"

    def wait(self, count: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with self.changed:
            while len(self.bound) < count and time.monotonic() < deadline:
                self.changed.wait(1)

    def close(self) -> None:
        self._closed = True
        sock = self._conn.sock
        if sock is not None:  # the reader's recv returns at once
            with contextlib.suppress(OSError):
                socket.socket.shutdown(sock, socket.SHUT_RDWR)
        self._thread.join(10)
        self._conn.close()


def schedule(
    plane: Plane, ns: str, pods: int, claim: dict[str, Any] | None, limits: dict[str, str] | None
) -> dict[str, Any]:
    """``pods`` pods (each its own claim of ``claim``'s spec, or extended resources
    ``limits``), created held by a scheduling gate, then released at once."""
    plane.call("POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
    deadline = time.monotonic() + 60
    while True:  # pods are admitted once the namespace has its default ServiceAccount
        try:
            plane.call("GET", f"/api/v1/namespaces/{ns}/serviceaccounts/default")
            break
        except KubeApiError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    names = [f"p{i:05d}" for i in range(pods)]

    def create(name: str) -> None:
        container: dict[str, Any] = {"name": "main", "image": "registry.k8s.io/pause:3.10"}
        spec: dict[str, Any] = {
            "containers": [container],
            "schedulingGates": [{"name": "kubedevice.io/fleet-bench"}],
            "tolerations": [{"operator": "Exists"}],
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 0,
            "nodeSelector": {"fleet": "1"},
        }
        if claim is not None:
            plane.call(
                "POST",
                f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims",
                {"metadata": {"name": name}, "spec": claim},
            )
            spec["resourceClaims"] = [{"name": "gpu", "resourceClaimName": name}]
            container["resources"] = {"claims": [{"name": "gpu"}]}
        else:
            container["resources"] = {"limits": limits}
        plane.call(
            "POST", f"/api/v1/namespaces/{ns}/pods", {"metadata": {"name": name}, "spec": spec}
        )

    parallel(create, names)
    watch = PodWatch(plane, ns)
    released: dict[str, float] = {}

    def release(name: str) -> None:
        plane.call(
            "PATCH",
            f"/api/v1/namespaces/{ns}/pods/{name}",
            {"spec": {"schedulingGates": None}},
            "application/merge-patch+json",
        )
        released[name] = time.monotonic()

    t0 = time.monotonic()
    parallel(release, names)
    watch.wait(pods, timeout=60 + pods * 0.5)
    error, rewatches = watch.error, watch.rewatches
    watch.close()
    bound = {n: t for n, t in watch.bound.items() if n in released}
    latencies = [(bound[n] - released[n]) * 1000 for n in bound]
    end = max(bound.values(), default=t0)
    why: list[str] = []
    if len(bound) < pods:  # the scheduler's word on one pod left; then none left to queue
        left = sorted(set(names) - set(bound))[0]
        pod = plane.call("GET", f"/api/v1/namespaces/{ns}/pods/{left}")
        why = [json.dumps(c)[:600] for c in pod.get("status", {}).get("conditions") or []]
        plane.call(
            "DELETE",
            f"/api/v1/namespaces/{ns}/pods",
            {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0},
        )
    return {
        **({"unbound_why": why} if why else {}),
        "pods": pods,
        "bound": len(bound),
        "pods_per_s": round(len(bound) / (end - t0), 1) if bound else 0,
        "released_per_s": round(pods / (max(released.values()) - t0), 1),
        "release_to_bound_ms_p50": round(statistics.median(latencies), 1) if latencies else None,
        "release_to_bound_ms_p99": round(pct(latencies, 0.99), 1) if latencies else None,
        **({"watch_error": error} if error else {}),
        **({"pod_rewatches": rewatches} if rewatches else {}),
    }


def device_class(plane: Plane, name: str, expression: str) -> None:
    plane.call(
        "POST",
        "/apis/resource.k8s.io/v1/deviceclasses",
        {"metadata": {"name": name}, "spec": {"selectors": [{"cel": {"expression": expression}}]}},
    )


#: The most nodes a layout runs with unless ``--all-sizes``: beyond, the API server of a small
#: machine holds gigabytes and the scheduler takes hours (MIG on demand: ~0.6 pods/s).
MAX_NODES = {"mig": 100, "mig-few": 100, "dev": 100}
#: The most pods per scheduling run of the MIG layouts (each takes seconds to schedule).
MIG_PODS = 40


def scheduling(plane: Plane, layout: str, n: int, pods: int) -> dict[str, Any]:
    """The scheduler's figures for the layout's claims."""
    if layout.startswith("mig"):
        pods = min(pods, MIG_PODS)
    one = min(pods, 2 * n)
    if layout == "plugin":
        return {"1-gpu": schedule(plane, "one", one, None, {"nvidia.com/gpu": "1"})}
    if layout == "dev":
        device_class(plane, "fleet-dev", f'device.driver == "{DEV_DRIVER}"')
        claim = {
            "devices": {"requests": [{"name": "d", "exactly": {"deviceClassName": "fleet-dev"}}]}
        }
        return {"1-device": schedule(plane, "one", one, claim, None)}
    attr = f'device.attributes["{GPU_DRIVER}"]'
    device_class(plane, "fleet-gpu", f'device.driver == "{GPU_DRIVER}" && {attr}.type == "gpu"')
    out = {}
    claim = {"devices": {"requests": [{"name": "g", "exactly": {"deviceClassName": "fleet-gpu"}}]}}
    out["1-gpu"] = schedule(plane, "one", one, claim, None)
    pair = {
        "devices": {
            "requests": [{"name": "g", "exactly": {"deviceClassName": "fleet-gpu", "count": 2}}],
            "constraints": [{"matchAttribute": "resource.kubernetes.io/pcieRoot"}],
        }
    }
    out["2-gpu-matchAttribute-pcieRoot"] = schedule(plane, "pair", min(pods, n), pair, None)
    if layout.startswith("mig"):
        device_class(
            plane,
            "fleet-1g",
            f'device.driver == "{GPU_DRIVER}" && {attr}.type == "mig"'
            f' && {attr}.profile == "1g.10gb"',
        )
        mig = {"devices": {"requests": [{"name": "m", "exactly": {"deviceClassName": "fleet-1g"}}]}}
        out["1g.10gb"] = schedule(plane, "mig", one, mig, None)
    return out


# ---------------------------------------------------------------------------------------------
# one real driver process


def real_driver_rss(plane: Plane, kubeconfig: Path) -> dict[str, Any]:
    """One ``kubedevice nvidia dra`` process on fake NVML for Node fleet-real: RSS once its
    slices are published."""
    from kubedevice.nvidia.fake import FakeNvml, write_fake_dev, write_fake_sysfs

    root = Path(tempfile.mkdtemp(prefix="kd-fleet-real-", dir="/tmp"))
    node = "fleet-real"
    plane.call("POST", "/api/v1/nodes", {"metadata": {"name": node}})
    nvml = FakeNvml.from_file("dgx-8gpu")
    write_fake_dev(nvml, root / "dev")
    write_fake_sysfs(nvml, root / "sys")
    nvml.close()
    (root / "gpu.yaml").write_text("version: v1\n")
    (root / "kubelet" / "plugins_registry").mkdir(parents=True)
    proc = subprocess.Popen(
        [sys.executable, "-m", "kubedevice", "nvidia", "dra", "--config", str(root / "gpu.yaml"),
         "--nvml", "fake:dgx-8gpu", "--dev-root", str(root / "dev"),
         "--sys-root", str(root / "sys"), "--node-name", node,
         "--kubelet-dir", str(root / "kubelet"), "--cdi-dir", str(root / "cdi"),
         "--kubeconfig", str(kubeconfig)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=root,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            got = plane.call("GET", "/apis/resource.k8s.io/v1/resourceslices", None)
            if any(s["spec"].get("nodeName") == node for s in got.get("items", [])):
                break
            time.sleep(0.5)
        time.sleep(2)
        status = Path(f"/proc/{proc.pid}/status").read_text()
        rss = next(int(x.split()[1]) for x in status.splitlines() if x.startswith("VmRSS:"))
        avail = next(
            int(x.split()[1])
            for x in Path("/proc/meminfo").read_text().splitlines()
            if x.startswith("MemTotal:")
        )
        return {
            "rss_mb": round(rss / 1024, 1),
            "machine_mem_total_mb": round(avail / 1024),
            "would_fit": avail // rss,
        }
    finally:
        proc.terminate()
        proc.wait(30)
        plane.call("DELETE", f"/api/v1/nodes/{node}")
        shutil.rmtree(root, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# one case


def per_node_per_min(d: dict[str, float], n: int, seconds: float) -> dict[str, float]:
    return {k: round(v / n / (seconds / 60), 3) for k, v in d.items()}


def run_case(
    bin_dir: Path, layout: str, n: int, args: argparse.Namespace, real: bool
) -> dict[str, Any]:
    from e2e.cluster import Cluster

    workdir = Path(tempfile.mkdtemp(prefix="kd-fleet-", dir="/tmp"))
    cluster = Cluster.control_plane(
        bin_dir,
        workdir / "cluster",
        kcm_controllers="*,-node-lifecycle-controller",
        scheduler_flags=("--kube-api-qps=1000", "--kube-api-burst=1000"),
        apiserver_flags=audit_flags(workdir),
    )
    workers: Workers | None = None
    out: dict[str, Any] = {"layout": layout, "nodes": n}
    try:
        plane = Plane(cluster, workdir / "audit.log")
        base = plane.snapshot()
        t0 = time.monotonic()
        make_nodes(plane, n, layout)
        out["nodes_created_s"] = round(time.monotonic() - t0, 2)
        before = plane.snapshot(base["offset"])
        if layout != "plugin":
            t0 = time.monotonic()
            workers = Workers(cluster.admin_kubeconfig, layout, n, min(args.workers, n))
            published = workers.answers("published", timeout=600)
            out["start_to_published_s"] = round(time.monotonic() - t0, 2)
            out["devices_per_node"] = published[0]["devices"]
            out["counter_sets_per_node"] = published[0]["counter_sets"]
            out["slice_writes_per_node"] = sum(p["writes"] for p in published) / n
            out["worker_processes"] = len(published)
            out["worker_rss_mb_per_node"] = round(
                sum(p["rss_mb"] - p["rss_mb_before"] for p in published) / n, 2
            )
            out["worker_rss_mb_base"] = round(published[0]["rss_mb_before"], 1)
            wait_watches(plane, before["watches"]["open"] + n)
        after = plane.snapshot(before["offset"])
        out["publish_requests_per_node_by_drivers"] = {
            k: round(v / n, 2) for k, v in after["drivers"].items()
        }
        out["etcd_bytes_per_node"] = round((after["etcd"] - base["etcd"]) / n)
        out["apiserver_rss_mb_idle_before_nodes"] = round(base["rss"])
        out["apiserver_rss_mb_per_100_nodes"] = round((after["rss"] - base["rss"]) / n * 100, 1)
        out["apiserver_cpu_s_publish_per_100_nodes"] = round(
            (after["cpu"] - before["cpu"]) / n * 100, 2
        )
        time.sleep(args.quiet_s)
        quiet = plane.snapshot(after["offset"])
        span = quiet["t"] - after["t"]
        out["quiet_s"] = round(span, 1)
        out["quiet_requests_per_node_per_min_by_drivers"] = per_node_per_min(
            quiet["drivers"], n, span
        )
        out["quiet_requests_per_node_per_min_all_clients"] = per_node_per_min(
            delta(after["requests"], quiet["requests"]), n, span
        )
        out["slice_watches_open"] = quiet["watches"]["open"]
        out["slice_watches_open_per_node"] = round(
            (quiet["watches"]["open"] - before["watches"]["open"]) / n, 3
        )
        out["apiserver_cpu_ms_per_s_quiet"] = round((quiet["cpu"] - after["cpu"]) / span * 1000, 1)
        out["apiserver_rss_mb"] = round(quiet["rss"])
        if workers is not None:
            t0 = time.monotonic()
            workers.send("upgrade")
            upgraded = workers.answers("upgraded", timeout=600)
            done = plane.snapshot(quiet["offset"])
            out["upgrade"] = {
                "s": round(time.monotonic() - t0, 2),
                "slice_writes": sum(u["writes"] for u in upgraded),
                "requests_per_node_by_drivers": {
                    k: round(v / n, 2) for k, v in done["drivers"].items()
                },
            }
            wait_watches(plane, before["watches"]["open"] + n)
        if args.pods:
            cpu0, _ = plane.proc("kube-scheduler")
            out["scheduler"] = scheduling(plane, layout, n, args.pods)
            cpu1, rss = plane.proc("kube-scheduler")
            out["scheduler_cpu_s"], out["scheduler_rss_mb"] = round(cpu1 - cpu0, 1), round(rss)
        if real:
            out["real_driver_process"] = real_driver_rss(plane, cluster.admin_kubeconfig)
        plane.kube.close()
    finally:
        if workers is not None:
            workers.stop()
        cluster.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--nodes", default="10,100,1000")
    parser.add_argument("--layouts", default="gpu,mig,mig-few,dev,plugin")
    parser.add_argument("--quiet-s", type=float, default=60)
    parser.add_argument("--pods", type=int, default=300)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--all-sizes", action="store_true", help="every layout at every N")
    args = parser.parse_args()
    if args.quick:
        args.nodes, args.layouts, args.quiet_s, args.pods = "10", "gpu,plugin", 10, 20
    from e2e.cluster import find_binaries

    bin_dir = find_binaries(ROOT)
    if bin_dir is None:
        print(
            "bench_fleet: no Kubernetes binaries: set KUBEDEVICE_K8S_BIN to a directory with etcd, "
            "kube-apiserver, kube-scheduler and kube-controller-manager (v1.34+)",
            file=sys.stderr,
        )
        return 2
    cases = []
    real = not args.quick
    for n in (int(x) for x in args.nodes.split(",")):
        for layout in args.layouts.split(","):
            if n > MAX_NODES.get(layout, n) and not args.all_sizes:
                print(f"bench_fleet: {layout} skipped at {n} nodes (--all-sizes)", file=sys.stderr)
                continue
            case = run_case(bin_dir, layout, n, args, real and layout == "gpu")
            real = real and layout != "gpu"
            print(json.dumps(case), file=sys.stderr, flush=True)
            cases.append(case)
    out = {
        "machine": cpu_model(),
        "cores": os.cpu_count(),
        "python": sys.version.split()[0],
        "kubernetes": "v1.36.2",
        "load_1m": round(os.getloadavg()[0], 2),
        "cases": cases,
    }
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

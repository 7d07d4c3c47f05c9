"""The GPU plugin on the real kubelet next to the emulator; prints JSON.

On a real Kubernetes v1.34+ (etcd, kube-apiserver, kube-scheduler, kube-controller-manager,
kubelet with kd-fakecri: the harness of ``tests/e2e``) and, side by side, on the kubelet
emulator in this process, with ``kubedevice nvidia run --nvml fake:dgx-8gpu`` as a process:

* plugin start -> the Node shows 8 allocatable GPUs (process spawn to the watch event; for the
  emulator, to its node status);
* kubelet restart -> the plugin registered again, and the first Node status from the new kubelet
  with 8 allocatable (from the new kubelet process's start; the emulator: ``restart()``);
* XID -> allocatable 7 in the Node status (control datagram to the Node watch event);
* pod created -> Running, 1 GPU (API create to the Running watch event; the emulator:
  ``apply_pod`` to admitted, its last step).

The real kubelet publishes device changes in its Node status at its status update period: the
harness sets ``nodeStatusUpdateFrequency: 1s`` (the kubelet's default is 10 s), so the XID and
start figures are mostly the wait for the next update; each such change is made at a random
phase of that period.

Needs root and the binaries (``KUBEDEVICE_K8S_BIN``, found as the end-to-end tier finds
them); without them it prints one line and exits 0. Runs itself in a private mount
namespace (``unshare -m``) with a
tmpfs on /var/lib/kubelet/device-plugins, as ``scripts/e2e`` does.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from _common import ROOT, cpu_model, stop_process

sys.path.insert(0, str(ROOT / "tests"))

from e2e.cluster import (
    NODE,
    Cluster,
    find_binaries,
    namespace,
    pod_manifest,
    poll_until,
)
from e2e.plugins import GpuDaemon
from kubernetes import watch

from kubedevice.kubelet import Emulator, RegistrationEvent
from kubedevice.nvidia.fake import send_control

GPU = "nvidia.com/gpu"
CONFIG = "version: v1\nhealth:\n  quietPeriod: 3s\n"
DP = "/var/lib/kubelet/device-plugins"
PERIOD_S = 1.0  # the harness's kubelet nodeStatusUpdateFrequency


class NodeTimeline:
    """A thread watching the Node: (arrival time, allocatable GPUs) of every event, in order."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.events: list[tuple[float, int]] = []
        self.cond = threading.Condition()
        self.stopped = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        core = self.cluster.core
        while not self.stopped:
            w = watch.Watch()
            try:
                for ev in w.stream(
                    core.list_node, field_selector=f"metadata.name={NODE}", timeout_seconds=30
                ):
                    t = time.monotonic()
                    alloc = int((ev["object"].status.allocatable or {}).get(GPU, "0"))
                    with self.cond:
                        self.events.append((t, alloc))
                        self.cond.notify_all()
                    if self.stopped:
                        break
            except Exception:  # the API server stopping at the end
                if self.stopped:
                    return
            finally:
                w.stop()

    def first(self, after: float, alloc: int, timeout: float = 60) -> float:
        """Arrival time of the first event after ``after`` showing ``alloc`` allocatable GPUs."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                for t, a in self.events:
                    if t > after and a == alloc:
                        return t
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RuntimeError(
                        f"no Node event with {alloc} GPUs allocatable after {after:.3f}: "
                        f"{[(round(t, 3), a) for t, a in self.events[-20:]]}"
                    )
                self.cond.wait(left)

    def stop(self) -> None:
        self.stopped = True


def random_phase() -> None:
    """Sleep 0-1 s at random: the previous step ended on a Node status update, and the next
    change must not always start just after one (the kubelet publishes once a period)."""
    time.sleep(random.uniform(0, PERIOD_S))


def ms(seconds: float) -> float:
    return round(seconds * 1000, 1)


def summary(samples: list[float]) -> dict[str, Any]:
    return {
        "median_ms": round(statistics.median(samples), 1),
        "min_ms": round(min(samples), 1),
        "max_ms": round(max(samples), 1),
        "runs": len(samples),
    }


def real_kubelet(bin_dir: Path, runs: int) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="kdb-", dir="/tmp"))
    cluster = Cluster.start(bin_dir, workdir)
    timeline = NodeTimeline(cluster)
    out: dict[str, Any] = {}
    try:
        # plugin start -> Node shows the resource
        start: list[float] = []
        for _ in range(runs):
            plugin = GpuDaemon(cluster, CONFIG)
            random_phase()
            t0 = time.monotonic()
            plugin.start()
            start.append(ms(timeline.first(t0, 8) - t0))
            plugin.close()
            plugin.wait_gone()
        out["start_to_node_allocatable"] = summary(start)

        plugin = GpuDaemon(cluster, CONFIG)
        plugin.start()
        cluster.wait_resource(GPU, allocatable=8)

        # kubelet restart -> registered again, allocatable back in the Node status
        rereg: list[float] = []
        back: list[float] = []
        for i in range(runs):
            assert cluster.kubelet is not None
            cluster.kubelet.stop()
            t0 = time.monotonic()
            cluster.kubelet.start()
            poll_until(
                "registered again",
                lambda i=i: (
                    plugin.metric("kubedevice_plugin_registrations_total", resource=GPU) >= i + 2
                ),
            )
            t_reg = time.monotonic()
            rereg.append(ms(t_reg - t0))
            back.append(ms(timeline.first(t_reg, 8) - t0))
        cluster.wait_node_ready()
        out["kubelet_restart_to_reregistered"] = summary(rereg)
        out["kubelet_restart_to_node_allocatable_back"] = summary(back)

        # XID -> allocatable down in the Node status
        xid: list[float] = []
        for i in range(runs):
            uuid = plugin.uuids[i % 8]
            random_phase()
            t0 = time.monotonic()
            plugin.xid(uuid, 62)
            try:
                xid.append(ms(timeline.first(t0, 7, timeout=20) - t0))
            except RuntimeError:
                print(plugin.log_text()[-5000:], file=sys.stderr)
                raise
            timeline.first(t0, 8)  # recovered (3 s quiet period)
        out["xid_to_node_allocatable_down"] = summary(xid)

        # pod created -> Running, 1 GPU
        running: list[float] = []
        with namespace(cluster, "bench") as ns:
            for i in range(runs):
                t0 = time.monotonic()
                cluster.create_pod(ns, pod_manifest(f"one-gpu-{i}", {GPU: 1}))
                cluster.wait_running(ns, f"one-gpu-{i}")
                running.append(ms(time.monotonic() - t0))
                cluster.core.delete_namespaced_pod(f"one-gpu-{i}", ns, grace_period_seconds=0)
        out["pod_created_to_running_1gpu"] = summary(running)
        plugin.close()
    finally:
        timeline.stop()
        cluster.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return out


async def emulator(runs: int) -> dict[str, Any]:
    from kubedevice.nvidia.fake import FakeNvml, write_fake_dev, write_fake_sysfs

    root = Path(tempfile.mkdtemp(prefix="kdbe-", dir="/tmp"))
    nvml = FakeNvml.from_file("dgx-8gpu")
    write_fake_dev(nvml, root / "dev")
    write_fake_sysfs(nvml, root / "sys")
    uuids = [g.info.uuid for g in nvml.machine.gpus]
    nvml.close()
    dp_dir = root / "dp"
    dp_dir.mkdir()
    (root / "gpu.yaml").write_text(CONFIG)
    control = root / "nvml.sock"
    args = [
        str(Path(sys.executable).with_name("kubedevice")), "--log-level", "warning",
        "nvidia", "run", "--config", str(root / "gpu.yaml"), "--nvml", "fake:dgx-8gpu",
        "--device-plugin-dir", str(dp_dir), "--dev-root", str(root / "dev"),
        "--sys-root", str(root / "sys"), "--features-dir", str(root / "features.d"),
        "--cdi-dir", str(root / "cdi"), "--pod-resources-socket", str(root / "none.sock"),
    ]  # fmt: skip
    env = {**os.environ, "KUBEDEVICE_FAKE_NVML_CONTROL": str(control)}

    def spawn() -> Any:
        return asyncio.create_subprocess_exec(
            *args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )

    out: dict[str, Any] = {}
    try:
        async with Emulator(dp_dir, control_socket=False) as emu:
            start: list[float] = []
            for _ in range(runs):
                t0 = time.monotonic()
                proc = await spawn()
                await emu.wait_for_resource(GPU, allocatable=8, timeout=30)
                start.append(ms(time.monotonic() - t0))
                await stop_process(proc)
                await emu.wait_for_resource(GPU, allocatable=0, timeout=30)
            out["start_to_node_allocatable"] = summary(start)

            proc = await spawn()
            try:
                await emu.wait_for_resource(GPU, allocatable=8, timeout=30)

                def registrations() -> int:
                    return sum(1 for e in emu.events if isinstance(e, RegistrationEvent) and e.ok)

                rereg: list[float] = []
                back: list[float] = []
                for _ in range(runs):
                    n = registrations()
                    t0 = time.monotonic()
                    await emu.restart()
                    await emu.wait_until(lambda n=n: registrations() > n, 30)  # type: ignore[misc]
                    rereg.append(ms(time.monotonic() - t0))
                    await emu.wait_for_resource(GPU, allocatable=8, timeout=30)
                    back.append(ms(time.monotonic() - t0))
                out["kubelet_restart_to_reregistered"] = summary(rereg)
                out["kubelet_restart_to_node_allocatable_back"] = summary(back)

                xid: list[float] = []
                for i in range(runs):
                    t0 = time.monotonic()
                    send_control(control, {"op": "xid", "uuid": uuids[i % 8], "xid": 62})
                    await emu.wait_for_resource(GPU, allocatable=7, timeout=30)
                    xid.append(ms(time.monotonic() - t0))
                    await emu.wait_for_resource(GPU, allocatable=8, timeout=30)
                out["xid_to_node_allocatable_down"] = summary(xid)

                admitted: list[float] = []
                for i in range(runs):
                    manifest = pod_manifest(f"one-gpu-{i}", {GPU: 1})
                    manifest["metadata"]["namespace"] = "default"
                    del manifest["spec"]["automountServiceAccountToken"]
                    del manifest["spec"]["terminationGracePeriodSeconds"]
                    t0 = time.monotonic()
                    await emu.apply_pod(manifest)
                    admitted.append(ms(time.monotonic() - t0))
                    await emu.delete_pod(f"one-gpu-{i}")
                out["pod_created_to_running_1gpu"] = summary(admitted)
            finally:
                await stop_process(proc)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return out


def reexec_in_namespace() -> None:
    """Run this script again in a private mount namespace with a tmpfs on the plugin dir."""
    if os.environ.get("KUBEDEVICE_E2E_IN_NS"):
        return
    if subprocess.run(["unshare", "-m", "true"], capture_output=True, check=False).returncode:
        return  # no namespaces here: the harness refuses a live kubelet's directory itself
    os.makedirs(DP, exist_ok=True)
    os.environ["KUBEDEVICE_E2E_IN_NS"] = "1"
    script = 'mount -t tmpfs -o mode=0755 tmpfs "$1" && shift && exec "$@"'
    argv = ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", DP]
    os.execvp("unshare", [*argv, sys.executable, *sys.argv])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench_e2e: skipped: a real kubelet needs root")
        return
    bin_dir = find_binaries(ROOT)
    if bin_dir is None:
        print(
            "bench_e2e: skipped: no Kubernetes binaries "
            "(set KUBEDEVICE_K8S_BIN; see tests/e2e/README.md)"
        )
        return
    reexec_in_namespace()
    version = subprocess.run(
        [str(bin_dir / "kubelet"), "--version"], capture_output=True, text=True, check=False
    ).stdout.strip()
    result = {
        "machine": cpu_model(),
        "load_average_before": [round(x, 2) for x in os.getloadavg()],
        "kubelet": version,
        "node_status_update_frequency": "1s",
        "real_kubelet": real_kubelet(bin_dir, args.runs),
        "emulator": asyncio.run(emulator(args.runs)),
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()

"""The DRA drivers next to the Go reference driver, called as the kubelet calls them; JSON.

One API server (etcd and kube-apiserver v1.36.2 started for the run, or ``--kubeconfig``)
and, each on a node of its own: the upstream reference driver (``dra-example-kubeletplugin``,
on the Go ``kubeletplugin`` helper, ``--device-profile gpu``, 8 GPUs), ``kubedevice nvidia
dra`` (fake 8-GPU box) and ``kubedevice run --dra`` (8 device nodes). The calls are made by
``drabench``, a Go client on ``k8s.io/kubelet/pkg/apis/dra/v1`` (as the kubelet calls a
driver's socket), one claim per call, 8 claims on the 8 devices at a time; the drivers take
turns, ``--calls`` calls each per round (the order reversed every other round), for
``--rounds`` rounds:

* ``prepare``: a new claim (created and allocated in the API server beforehand);
* ``again``: the same claim prepared again (answered from the driver's checkpoint);
* ``unprepare``: the claim unprepared;
* ``cpu_ms_per_claim``: the driver process's CPU over those three calls (all its threads,
  while the calls ran), per claim.

With ``--baseline DIR`` (another source tree's ``src/``, e.g. an older commit unpacked with
``git archive``) its two drivers run too, in the same turns, for a before/after in one run.

Per driver also: RSS right after start (slices published, before any call), CPU per 60 s
while idle (all drivers in one window of ``--seconds``), SIGTERM -> exit.

The Go binaries come from ``$KUBEDEVICE_ANCHORS``: a directory holding
``dra-example-kubeletplugin`` (the dra-example-driver's kubelet plugin, built from its
sources) and ``drabench`` (a Go client that calls a DRA socket as the kubelet does), plain or
``.xz`` (unpacked once under ``~/.cache/kubedevice-anchors``); without them the bench prints
one line and exits 0.

Usage: ``python bench/bench_dra_go.py [--calls 30] [--rounds 2] [--seconds 60]``.
"""

from __future__ import annotations

import argparse
import compileall
import json
import lzma
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import grpc
from _common import (
    KUBEDEVICE,
    ROOT,
    cpu_model,
    cpu_ns_and_wakeups,
    memory_mb,
    pct,
    wait_for,
    write_generic_config,
)
from bench_dra import api_server
from bench_dra_daemon import Running

GO_DRIVER = "gpu.example.com"
BINARIES = ("dra-example-kubeletplugin", "drabench")


def anchors() -> Path | None:
    """The directory with the two Go binaries unpacked (``None``: not on this machine)."""
    env = os.environ.get("KUBEDEVICE_ANCHORS")
    if not env:
        return None
    source = Path(env)
    if all(os.access(source / b, os.X_OK) for b in BINARIES):
        return source
    cache = Path.home() / ".cache" / "kubedevice-anchors"
    for name in BINARIES:
        target = cache / name
        if target.is_file():
            continue
        packed = source / f"{name}.xz"
        if not packed.is_file():
            return None
        cache.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(".tmp")
        tmp.write_bytes(lzma.decompress(packed.read_bytes()))
        tmp.chmod(0o755)
        tmp.replace(target)
    return cache


class GoRunning(Running):
    """The Go reference driver, serving and published (the same claim and stop helpers)."""

    def __init__(self, root: Path, binary: Path, kubeconfig: Path, api: Any) -> None:
        self.name, self.driver, self.api = "go_helper", GO_DRIVER, api
        self.node = f"bench-{uuid.uuid4().hex[:6]}"
        api.call("POST", "/api/v1/nodes", {"metadata": {"name": self.node}})
        self.kdir = root / "k-go"
        plugins, registry = self.kdir / "plugins", self.kdir / "plugins_registry"
        registry.mkdir(parents=True)
        argv = [str(binary), "--device-profile", "gpu", "--num-devices", "8",
                "--node-name", self.node, "--kubeconfig", str(kubeconfig),
                "--cdi-root", str(self.kdir / "cdi"),
                "--kubelet-plugins-directory-path", str(plugins),
                "--kubelet-registrar-directory-path", str(registry),
                "--kube-api-qps", "1000", "--kube-api-burst", "1000"]  # fmt: skip
        self.log = self.kdir / "driver.log"
        with self.log.open("w") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=out)
        self.sock = plugins / GO_DRIVER / "dra.sock"
        wait_for(lambda: self.sock.exists() or self.proc.poll() is not None, 60, self.name)
        if self.proc.poll() is not None:
            raise SystemExit(f"go_helper did not start: {self.log.read_text()[-2000:]}")
        self.channel = grpc.insecure_channel(f"unix:{self.sock}")
        self.devices = self._published()


def drabench(binary: Path, sock: str, claims: list[Any], mode: str, work: Path) -> list[float]:
    """Per-call ms of ``drabench`` calling ``sock`` with one claim per call."""
    listing = work / f"claims-{uuid.uuid4().hex[:8]}.json"
    listing.write_text(
        json.dumps([{"namespace": c.namespace, "name": c.name, "uid": c.uid} for c in claims])
    )
    out = subprocess.run(
        [str(binary), "-socket", sock, "-claims", str(listing), "-mode", mode, "-per-call", "1"],
        capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    listing.unlink()
    if out.returncode != 0:
        raise SystemExit(f"drabench {mode} on {sock} failed: {out.stderr.strip()[-2000:]}")
    result = json.loads(out.stdout)
    if result.get("errors"):
        raise SystemExit(f"drabench {mode} on {sock}: {result}")
    return [float(ms) for ms in result["samples_ms"]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--settle", type=float, default=3.0)
    parser.add_argument("--kubeconfig", default=None)
    parser.add_argument(
        "--baseline",
        default=None,
        help="another source tree's src/ (an older commit): its GPU and generic drivers run "
        "too, as gpu_dra_8_base and generic_dra_8_base",
    )
    args = parser.parse_args()
    go = anchors()
    if go is None:
        print("bench_dra_go: skipped: no Go reference driver (set KUBEDEVICE_ANCHORS)")
        return
    compileall.compile_dir(ROOT / "src" / "kubedevice", quiet=1)  # as pip install leaves it
    root = Path(tempfile.mkdtemp(prefix="kd-go-", dir="/tmp"))
    running: dict[str, Running] = {}
    times: dict[str, dict[str, list[float]]] = {}
    rss: dict[str, float] = {}
    try:
        with api_server(args.kubeconfig) as kubeconfig:
            sys.path.insert(0, str(ROOT / "tests"))
            from dra.api import Api

            from kubedevice.nvidia.fake import FakeNvml, write_fake_dev, write_fake_sysfs

            api = Api(kubeconfig)
            nvml = FakeNvml.from_file("dgx-8gpu")
            write_fake_dev(nvml, root / "gpu" / "dev")
            write_fake_sysfs(nvml, root / "gpu" / "sys")
            nvml.close()
            generic = write_generic_config(root / "generic", "bench", [f"d{i}" for i in range(8)])
            ours = {
                "gpu_dra_8": ("gpu.bench.example.com", [
                    KUBEDEVICE, "nvidia", "dra", "--nvml", "fake:dgx-8gpu",
                    "--dev-root", str(root / "gpu" / "dev"),
                    "--sys-root", str(root / "gpu" / "sys"),
                    "--driver-name", "gpu.bench.example.com"]),
                "generic_dra_8": ("dev.bench.example.com", [
                    KUBEDEVICE, "run", "--dra", "--config", str(generic),
                    "--driver-name", "dev.bench.example.com"]),
            }  # fmt: skip
            running["go_helper"] = GoRunning(root, go / BINARIES[0], kubeconfig, api)
            rss["go_helper"] = memory_mb(running["go_helper"].proc.pid)["rss_mb"]
            trees = [("", os.environ.get("PYTHONPATH"))]
            if args.baseline:
                trees.append(("_base", str(Path(args.baseline).resolve())))
                compileall.compile_dir(Path(args.baseline) / "kubedevice", quiet=1)
            for suffix, tree in trees:
                for name, (driver, argv) in ours.items():
                    if tree is not None:  # the driver's code from that tree
                        os.environ["PYTHONPATH"] = tree
                    tag = suffix.replace("_", "-")  # a DNS name
                    name, driver = name + suffix, driver.replace(".bench.", f".bench{tag}.")
                    argv = [driver if a.endswith(".bench.example.com") else a for a in argv]
                    running[name] = Running(root, name, driver, argv, kubeconfig, api)
                    rss[name] = memory_mb(running[name].proc.pid)["rss_mb"]
            if trees[0][1] is not None:
                os.environ["PYTHONPATH"] = trees[0][1]
            bench = go / BINARIES[1]
            cpu: dict[str, int] = {}
            for turn in range(args.rounds):
                order = list(running.items())
                for name, run in order if turn % 2 == 0 else order[::-1]:  # taking turns
                    got = times.setdefault(name, {"prepare": [], "again": [], "unprepare": []})
                    for start in range(0, args.calls, len(run.devices)):
                        # one claim per device at a time (a device is held by one claim)
                        claims = run.claims(run.devices[: args.calls - start])
                        used = cpu_ns_and_wakeups(run.proc.pid)[0]
                        for mode, key in (("prepare", "prepare"), ("prepare", "again"),
                                          ("unprepare", "unprepare")):  # fmt: skip
                            got[key] += drabench(bench, str(run.sock), claims, mode, root)
                        used = cpu_ns_and_wakeups(run.proc.pid)[0] - used
                        cpu[name] = cpu.get(name, 0) + used
            pids = {n: r.proc.pid for n, r in running.items()}
            time.sleep(args.settle)  # the last calls' background work done first
            before = {n: cpu_ns_and_wakeups(pid) for n, pid in pids.items()}
            t0 = time.monotonic()
            time.sleep(args.seconds)  # the idle window is what is measured
            elapsed = time.monotonic() - t0
            after = {n: cpu_ns_and_wakeups(pid) for n, pid in pids.items()}
            idle = {n: round((after[n][0] - before[n][0]) / 1e6 * 60.0 / elapsed, 1) for n in pids}
            stop = {n: r.stop_ms() for n, r in running.items()}
    finally:
        for run in running.values():
            if run.proc.poll() is None:
                run.proc.kill()
                run.proc.wait(10)
        shutil.rmtree(root, ignore_errors=True)
    drivers = {
        name: {
            **{
                f"{what}_{q}_ms": round(pct(samples, p), 2)
                for what, samples in got.items()
                for q, p in (("p50", 0.5), ("p90", 0.9))
            },
            "cpu_ms_per_claim": round(cpu[name] / 1e6 / len(got["prepare"]), 2),
            "sigterm_to_exit_ms": stop[name],
            "idle_cpu_ms_per_60s": idle[name],
            "rss_after_start_mb": rss[name],
        }
        for name, got in times.items()
    }
    print(json.dumps({
        "bench": "dra_go", "cpu": cpu_model(), "cores": os.cpu_count(),
        "load_1m": round(os.getloadavg()[0], 2), "python": sys.version.split()[0],
        "calls_per_round": args.calls, "rounds": args.rounds,
        "idle_window_s": round(elapsed, 1), "drivers": drivers,
    }, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()

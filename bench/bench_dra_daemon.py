"""The DRA drivers as daemons: prepare, unprepare, RSS, idle CPU, SIGTERM; one JSON object.

Each driver runs as a process on a fake kubelet directory against a real API server (etcd
and kube-apiserver started for the run, or ``--kubeconfig``): the generic DRA driver
(``kubedevice run --dra``), the GPU DRA driver (``kubedevice nvidia dra`` on the fake
8-GPU box ``dgx-8gpu``) and the kit's example (``examples/dra_minimal.py``). A synchronous
grpcio client calls the driver's v1 DRA socket as the kubelet would:

* ``claims_1`` / ``claims_8``: ``--calls`` calls with 1 and with 8 claims each, every claim
  new (created and allocated in the API server beforehand, each on its own device): the
  first ``NodePrepareResources`` (``prepare``), the same call again (``again``: answered
  from the checkpoint), then ``NodeUnprepareResources`` (``unprepare``), per call in ms;
* ``held_300`` (generic driver only: it has the devices): the same 1-claim calls while
  300 other claims are prepared (in the checkpoint) on the node;
* ``checkpoint_save``: one synced ``Checkpoint.save()`` with 1 and with 300 claims in it
  (one claim changed before each), in this process.

Then, with every driver idle and serving, in one window of ``--seconds`` shared by all: CPU
(``/proc/PID/task/*/schedstat``) and wake-ups (voluntary context switches) per 60 s, RSS
and PSS (``smaps_rollup``), next to the generic and GPU device plugins (each with a kubelet
emulator holding its ListAndWatch stream) and the floor: ``bare-grpc-aio-dra``, a bare
``grpc.aio`` server holding the two sockets a DRA driver serves (registration and
DRAPlugin) and doing nothing else. Last, SIGTERM -> exit of each driver (one run;
bench/bench_dra_stop.py repeats it).

Usage: ``python bench/bench_dra_daemon.py [--calls 40] [--seconds 60] [--only generic,...]``.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import select
import shutil
import signal
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
    PY,
    ROOT,
    cpu_model,
    cpu_ns_and_wakeups,
    gpu_plugin_command,
    memory_mb,
    pct,
    spawn_ready,
    start_emulator,
    terminate_all,
    wait_allocatable,
    wait_for,
    write_generic_config,
)
from bench_dra import api_server

from kubedevice._api.dra.v1 import api_pb2 as v1, api_pb2_grpc as v1_grpc
from kubedevice._api.pluginregistration.v1 import api_pb2 as reg, api_pb2_grpc as reg_grpc

CLAIMS = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"
HELD = 300


def _drivers(root: Path, generic_devices: int) -> dict[str, tuple[str, list[str]]]:
    """name -> (driver name, command line less node, kubeconfig and directories)."""
    from kubedevice.nvidia.fake import FakeNvml, write_fake_dev, write_fake_sysfs

    nvml = FakeNvml.from_file("dgx-8gpu")
    write_fake_dev(nvml, root / "gpu" / "dev")
    write_fake_sysfs(nvml, root / "gpu" / "sys")
    nvml.close()
    devices = [f"d{i:04d}" for i in range(generic_devices)]
    generic = write_generic_config(root / "generic", "bench", devices)
    return {
        "generic_dra": ("dev.bench.example.com", [
            KUBEDEVICE, "run", "--dra", "--config", str(generic),
            "--driver-name", "dev.bench.example.com"]),
        "gpu_dra_8": ("gpu.bench.example.com", [
            KUBEDEVICE, "nvidia", "dra", "--nvml", "fake:dgx-8gpu",
            "--dev-root", str(root / "gpu" / "dev"), "--sys-root", str(root / "gpu" / "sys"),
            "--driver-name", "gpu.bench.example.com"]),
        "example_dra": ("counter.example.com", [PY, str(ROOT / "examples" / "dra_minimal.py")]),
    }  # fmt: skip


class Running:
    """One driver process, serving and published."""

    def __init__(self, root: Path, name: str, driver: str, argv: list[str], kubeconfig: Path,
                 api: Any) -> None:  # fmt: skip
        self.name, self.driver, self.api = name, driver, api
        self.node = f"bench-{uuid.uuid4().hex[:6]}"
        api.call("POST", "/api/v1/nodes", {"metadata": {"name": self.node}})
        self.kdir = root / f"k-{name}"
        (self.kdir / "plugins_registry").mkdir(parents=True)
        argv = [*argv, "--node-name", self.node, "--kubeconfig", str(kubeconfig),
                "--kubelet-dir", str(self.kdir), "--cdi-dir", str(self.kdir / "cdi"),
                "--log-level", "warning"]  # fmt: skip
        self.log = self.kdir / "driver.log"
        with self.log.open("w") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=out)
        registry = self.kdir / "plugins_registry"
        wait_for(lambda: any(registry.iterdir()) or self.proc.poll() is not None, 60, name)
        if self.proc.poll() is not None:
            raise SystemExit(f"{name} did not start: {self.log.read_text()[-2000:]}")
        sock = next(p for p in registry.iterdir() if p.name.endswith("-reg.sock"))
        with grpc.insecure_channel(f"unix:{sock}") as channel:
            info = reg_grpc.RegistrationStub(channel).GetInfo(reg.InfoRequest(), timeout=10)
        self.sock = Path(info.endpoint)
        self.channel = grpc.insecure_channel(f"unix:{info.endpoint}")
        self.stub = v1_grpc.DRAPluginStub(self.channel)
        self.devices = self._published()

    def _published(self) -> list[str]:
        query = f"spec.driver={self.driver},spec.nodeName={self.node}"
        names: list[str] = []

        def ready() -> bool:
            items = self.api.call("GET", "/apis/resource.k8s.io/v1/resourceslices",
                                  fieldSelector=query)["items"]  # fmt: skip
            names[:] = [
                d["name"]
                for s in items
                for d in s["spec"].get("devices") or []
                if not d.get("allowMultipleAllocations") and "mig" not in d["name"]
            ]
            return bool(names)

        wait_for(ready, 60, f"{self.name}'s slices")
        return sorted(names)

    def claims(self, devices: list[str]) -> list[v1.Claim]:
        """One new claim per device, allocated to it in the API server."""
        out = []
        for device in devices:
            body = {
                "metadata": {"name": f"b-{uuid.uuid4().hex[:12]}", "namespace": "default"},
                "spec": {"devices": {"requests": [
                    {"name": "r", "exactly": {"deviceClassName": "x", "count": 1}}]}},
            }  # fmt: skip
            claim = self.api.call("POST", CLAIMS, body)
            claim["status"] = {"allocation": {"devices": {"results": [
                {"request": "r", "driver": self.driver, "pool": self.node, "device": device}
            ]}}}  # fmt: skip
            self.api.call("PUT", f"{CLAIMS}/{claim['metadata']['name']}/status", claim)
            meta = claim["metadata"]
            out.append(v1.Claim(namespace="default", name=meta["name"], uid=meta["uid"]))
        return out

    def prepare(self, batch: list[v1.Claim]) -> float:
        t0 = time.perf_counter_ns()
        answer = self.stub.NodePrepareResources(
            v1.NodePrepareResourcesRequest(claims=batch), timeout=30
        )
        took = (time.perf_counter_ns() - t0) / 1e6
        errors = [c.error for c in answer.claims.values() if c.error]
        if errors:
            raise SystemExit(f"{self.name}: prepare failed: {errors[0]}")
        return took

    def unprepare(self, batch: list[v1.Claim]) -> float:
        t0 = time.perf_counter_ns()
        answer = self.stub.NodeUnprepareResources(
            v1.NodeUnprepareResourcesRequest(claims=batch), timeout=30
        )
        took = (time.perf_counter_ns() - t0) / 1e6
        errors = [c.error for c in answer.claims.values() if c.error]
        if errors:
            raise SystemExit(f"{self.name}: unprepare failed: {errors[0]}")
        return took

    def cycle(self, per_call: int, calls: int, devices: list[str]) -> dict[str, Any]:
        """prepare, again, unprepare of ``calls`` calls with ``per_call`` new claims each."""
        batches = [self.claims(devices[:per_call]) for _ in range(calls)]
        first: list[float] = []
        again: list[float] = []
        gone: list[float] = []
        for batch in batches:
            first.append(self.prepare(batch))
            again.append(self.prepare(batch))
            gone.append(self.unprepare(batch))
        return {
            "calls": calls,
            **{
                f"{what}_{q}_ms": round(pct(samples, p), 3)
                for what, samples in (("prepare", first), ("again", again), ("unprepare", gone))
                for q, p in (("p50", 0.5), ("p99", 0.99))
            },
        }

    def stop_ms(self) -> float:
        self.channel.close()
        pidfd = os.pidfd_open(self.proc.pid)  # readable the moment the process exits
        try:
            t0 = time.perf_counter()
            self.proc.send_signal(signal.SIGTERM)
            ready, _, _ = select.select([pidfd], [], [], 30)
            took = (time.perf_counter() - t0) * 1000
        finally:
            os.close(pidfd)
        if not ready:
            raise SystemExit(f"{self.name} did not exit within 30 s of SIGTERM")
        self.proc.wait(10)
        return round(took, 1)


def _checkpoint_saves() -> dict[str, Any]:
    """p50 ms of one ``Checkpoint.save()`` (synced, as a prepare saves) with 1 and 300 claims
    in it, each save after one claim changed, in this process."""
    from types import MappingProxyType

    from kubedevice.dra.model.types import ClaimRef, PreparedClaim
    from kubedevice.dra.state.checkpoint import Checkpoint

    def claim(i: int, n: int = 0) -> PreparedClaim:
        uid = f"{i:08d}-1111-2222-3333-444455556666"
        return PreparedClaim(
            ref=ClaimRef("default", f"claim-{i}", uid),
            devices=(("gpu", "node-a", f"gpu-{i}"),),
            cdi_ids=((f"k8s.gpu.example.com/claim={uid}-gpu-{i}",),),
            share_ids=(None,),
            data=(MappingProxyType({"slot": i, "n": n}),),
            edits=(MappingProxyType({"env": [f"GPU={i}"], "deviceNodes": [
                {"path": f"/dev/nvidia{i}", "permissions": "rw"}]}),),
            admin_access=(False,),
        )  # fmt: skip

    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        for count in (1, 300):
            checkpoint = Checkpoint(Path(tmp) / f"c{count}.json", "gpu.example.com")
            checkpoint.claims = {c.ref.uid: c for c in (claim(i) for i in range(count))}
            checkpoint.save()
            took = []
            for n in range(50):
                changed = claim(n % count, n + 1)
                checkpoint.claims[changed.ref.uid] = changed
                t0 = time.perf_counter_ns()
                checkpoint.save()
                took.append((time.perf_counter_ns() - t0) / 1e6)
            out[f"claims_{count}_p50_ms"] = round(pct(took, 0.5), 3)
    return out


def _serve_floor(directory: str) -> None:
    """The floor (child process): grpc.aio serving registration and DRAPlugin, nothing else."""
    import asyncio

    class Reg(reg_grpc.RegistrationServicer):  # type: ignore[misc]
        async def GetInfo(self, request: Any, context: Any) -> Any:
            return reg.PluginInfo(type="DRAPlugin", name="floor.example.com")

    class Dra(v1_grpc.DRAPluginServicer):  # type: ignore[misc]
        async def NodePrepareResources(self, request: Any, context: Any) -> Any:
            return v1.NodePrepareResourcesResponse()

    async def main() -> None:
        server = grpc.aio.server()
        reg_grpc.add_RegistrationServicer_to_server(Reg(), server)
        server.add_insecure_port(f"unix:{directory}/reg.sock")
        await server.start()
        dra = grpc.aio.server()
        v1_grpc.add_DRAPluginServicer_to_server(Dra(), dra)
        dra.add_insecure_port(f"unix:{directory}/dra.sock")
        await dra.start()
        print("READY", flush=True)
        await server.wait_for_termination()

    asyncio.run(main())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--settle", type=float, default=3.0)
    parser.add_argument("--only", default="", help="comma-separated driver names")
    parser.add_argument("--kubeconfig", default=None)
    parser.add_argument("--serve-floor", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_floor:
        _serve_floor(args.serve_floor)
        return
    compileall.compile_dir(ROOT / "src" / "kubedevice", quiet=1)  # as pip install leaves it
    only = {n for n in args.only.split(",") if n}
    root = Path(tempfile.mkdtemp(prefix="kd-bench-dradaemon-", dir="/tmp"))
    running: dict[str, Running] = {}
    others: dict[str, subprocess.Popen[Any]] = {}
    emulators: list[subprocess.Popen[Any]] = []
    latency: dict[str, Any] = {}
    try:
        with api_server(args.kubeconfig) as kubeconfig:
            sys.path.insert(0, str(ROOT / "tests"))
            from dra.api import Api

            api = Api(kubeconfig)
            for name, (driver, argv) in _drivers(root, HELD + 16).items():
                if only and name not in only:
                    continue
                run = running[name] = Running(root, name, driver, argv, kubeconfig, api)
                out = latency[name] = {
                    "devices": len(run.devices),
                    "claims_1": run.cycle(1, args.calls, run.devices),
                    "claims_8": run.cycle(8, args.calls, run.devices),
                }
                if len(run.devices) >= HELD + 1:
                    held = run.claims(run.devices[:HELD])
                    for i in range(0, HELD, 8):
                        run.prepare(held[i : i + 8])
                    out[f"held_{HELD}"] = run.cycle(1, args.calls, run.devices[HELD:])
                    for i in range(0, HELD, 8):
                        run.unprepare(held[i : i + 8])
            # the device plugins and the floor, idle beside the drivers
            for name, cmd, resource, count in (
                ("generic_plugin", [KUBEDEVICE, "run", "--config",
                                    str(write_generic_config(root / "gp", "idle",
                                                             ["a", "b", "c", "d"]))],
                 "example.com/idle", 4),
                ("gpu_plugin_8", gpu_plugin_command(root / "gpu-plugin"), "nvidia.com/gpu", 8),
            ):  # fmt: skip
                d = root / name / "device-plugins"
                d.mkdir(parents=True)
                env = {**os.environ, "DP_DEVICE_PLUGIN_DIR": str(d)}
                emulators.append(start_emulator(d, env))
                others[name] = subprocess.Popen(cmd, env=env, stderr=subprocess.DEVNULL)
                wait_allocatable(env, resource, count, 60)
            floor = root / "floor"
            floor.mkdir()
            others["bare_grpc_aio_dra"] = spawn_ready(
                [PY, __file__, "--serve-floor", str(floor)], "the floor"
            )
            pids = {n: r.proc.pid for n, r in running.items()}
            pids |= {n: p.pid for n, p in others.items()}
            time.sleep(args.settle)  # start-up work done before the window opens
            before = {n: cpu_ns_and_wakeups(pid) for n, pid in pids.items()}
            t0 = time.monotonic()
            time.sleep(args.seconds)  # the idle window is what is measured
            elapsed = time.monotonic() - t0
            after = {n: cpu_ns_and_wakeups(pid) for n, pid in pids.items()}
            scale = 60.0 / elapsed
            idle = {
                n: {
                    "cpu_ms_per_60s": round((after[n][0] - before[n][0]) / 1e6 * scale, 1),
                    "wakeups_per_60s": round((after[n][1] - before[n][1]) * scale),
                    "threads": float(after[n][2]),
                    **memory_mb(pid),
                }
                for n, pid in pids.items()
            }
            stop = {n: r.stop_ms() for n, r in running.items()}
    finally:
        for run in running.values():
            if run.proc.poll() is None:
                run.proc.kill()
                run.proc.wait(10)
        terminate_all([*others.values(), *emulators])
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps({
        "bench": "dra_daemon", "cpu": cpu_model(), "load_1m": round(os.getloadavg()[0], 2),
        "python": sys.version.split()[0], "grpcio": grpc.__version__,
        "checkpoint_save": _checkpoint_saves(),
        "latency_ms": latency, "idle_window_s": round(elapsed, 1), "idle": idle,
        "sigterm_to_exit_ms": stop,
    }, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()

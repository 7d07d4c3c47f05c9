"""Benchmark of the generic plugin (``kubedevice run``); prints one JSON object.

Measures, against a real ``kubedevice run`` subprocess on a fake tree and a minimal
kubelet (Registration server + ListAndWatch client, real gRPC over Unix sockets):

* hot-plug latency: create/remove a node -> the kubelet-side stream gets the update (p50/p99)
* health-change latency: an allocated device's node removed/re-created -> Unhealthy/Healthy
* start-up: process spawn -> Register received and first device list streamed (median)
* RSS of the daemon serving 1,000 devices
* CPU the daemon uses while idle (``--idle-seconds``, 60 by default)

Targets: hot-plug p99 < 100 ms, start to registered < 500 ms, RSS < 45 MB with 1,000
devices, < 60 ms CPU in 60 s idle.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc
import psutil
import yaml
from _common import KUBEDEVICE, measure_idle_cpu_ms, pct, stop_process

from kubedevice._api import KUBELET_SOCKET, dp, dp_grpc
from kubedevice.generic import FakeHost

RESOURCE = "example.com/bench"


class MiniKubelet:
    """Registration server; records (time, device ids) of every ListAndWatch message."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.registered_at: float | None = None
        self.messages: list[tuple[float, dict[str, str]]] = []
        self.changed = asyncio.Event()
        self.stub: Any = None
        self._server: grpc.aio.Server | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._channels: list[grpc.aio.Channel] = []

    async def start(self) -> None:
        server = grpc.aio.server()
        outer = self

        class _Reg(dp_grpc.RegistrationServicer):  # type: ignore[misc]
            async def Register(self, request: Any, context: Any) -> Any:
                outer.registered_at = time.perf_counter()
                channel = grpc.aio.insecure_channel(f"unix:{outer.directory / request.endpoint}")
                outer._channels.append(channel)
                stub = dp_grpc.DevicePluginStub(channel)
                await stub.GetDevicePluginOptions(dp.Empty(), timeout=5)
                outer.stub = stub
                outer._tasks.append(asyncio.create_task(outer._watch(stub)))
                return dp.Empty()

        dp_grpc.add_RegistrationServicer_to_server(_Reg(), server)
        server.add_insecure_port(f"unix:{self.directory / KUBELET_SOCKET}")
        await server.start()
        self._server = server

    async def _watch(self, stub: Any) -> None:
        with contextlib.suppress(grpc.aio.AioRpcError):
            async for resp in stub.ListAndWatch(dp.Empty()):
                self.messages.append((time.perf_counter(), {d.ID: d.health for d in resp.devices}))
                self.changed.set()

    async def wait(self, predicate: Any) -> float:
        while True:
            if self.messages and predicate(self.messages[-1][1]):
                return self.messages[-1][0]
            self.changed.clear()
            await self.changed.wait()

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for channel in self._channels:
            await channel.close()
        if self._server is not None:
            await self._server.stop(0)


def _write_config(host: FakeHost, path: str) -> Path:
    cfg = {
        "version": "v1",
        "devRoot": str(host.dev_root),
        "sysRoot": str(host.sys_root),
        "resources": [{"name": RESOURCE, "groups": [{"paths": [{"path": path}]}]}],
    }
    file = host.root / "config.yaml"
    file.write_text(yaml.safe_dump(cfg))
    return file


async def _spawn(config: Path, plugin_dir: Path) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        KUBEDEVICE, "--log-level", "warning", "run", "--config", str(config),
        "--device-plugin-dir", str(plugin_dir),
    )  # fmt: skip


async def bench_startup(runs: int) -> dict[str, float]:
    times = []
    rss_one: list[float] = []
    for _ in range(runs):
        root = Path(tempfile.mkdtemp(prefix="kdb-", dir="/tmp"))
        try:
            host = FakeHost(root / "h")
            host.add_char_device("/dev/ttyUSB0")
            plugin_dir = root / "dp"
            plugin_dir.mkdir()
            kubelet = MiniKubelet(plugin_dir)
            await kubelet.start()
            config = _write_config(host, "/dev/ttyUSB*")
            t0 = time.perf_counter()
            proc = await _spawn(config, plugin_dir)
            try:
                t_list = await asyncio.wait_for(kubelet.wait(lambda s: bool(s)), 30)
                assert kubelet.registered_at is not None
                times.append((kubelet.registered_at - t0, t_list - t0))
                rss_one.append(psutil.Process(proc.pid).memory_info().rss / 1e6)
            finally:
                await stop_process(proc)
                await kubelet.stop()
        finally:
            shutil.rmtree(root, ignore_errors=True)
    return {
        "startup_to_registered_ms_median": statistics.median(t[0] for t in times) * 1000,
        "startup_to_first_list_ms_median": statistics.median(t[1] for t in times) * 1000,
        "startup_runs": runs,
        "rss_mb_1_device": statistics.median(rss_one),
    }


async def bench_daemon(devices: int, changes: int, idle_seconds: float) -> dict[str, float]:
    root = Path(tempfile.mkdtemp(prefix="kdb-", dir="/tmp"))
    try:
        host = FakeHost(root / "h")
        for i in range(devices):
            host.add_char_device(f"/dev/bench/dev{i:04d}")
        plugin_dir = root / "dp"
        plugin_dir.mkdir()
        kubelet = MiniKubelet(plugin_dir)
        await kubelet.start()
        config = _write_config(host, "/dev/bench/*")
        proc = await _spawn(config, plugin_dir)
        try:
            await asyncio.wait_for(kubelet.wait(lambda s: len(s) == devices), 60)
            ps = psutil.Process(proc.pid)
            rss_mb = ps.memory_info().rss / 1e6
            uss_mb = ps.memory_full_info().uss / 1e6
            # idle CPU: nothing changes, the daemon should not wake up
            idle_cpu_ms = await measure_idle_cpu_ms(ps, idle_seconds)
            # hot-plug latency with `devices` devices present
            lat: list[float] = []
            for i in range(changes):
                name = f"hot{i:04d}"
                t0 = time.perf_counter()
                host.add_char_device(f"/dev/bench/{name}")
                t1 = await asyncio.wait_for(kubelet.wait(lambda s, n="bench-" + name: n in s), 10)
                lat.append(t1 - t0)
                t0 = time.perf_counter()
                host.remove(f"/dev/bench/{name}")
                t1 = await asyncio.wait_for(
                    kubelet.wait(lambda s, n="bench-" + name: n not in s), 10
                )
                lat.append(t1 - t0)
            # health: an allocated device unplugged turns Unhealthy, re-plugged Healthy again
            target = "bench-dev0000"
            req = dp.AllocateRequest(
                container_requests=[dp.ContainerAllocateRequest(devices_ids=[target])]
            )
            await kubelet.stub.Allocate(req, timeout=5)
            health: list[float] = []
            for _ in range(max(changes // 2, 1)):
                for action, want in (("remove", "Unhealthy"), ("add", "Healthy")):
                    t0 = time.perf_counter()
                    if action == "remove":
                        host.remove("/dev/bench/dev0000")
                    else:
                        host.add_char_device("/dev/bench/dev0000")
                    t1 = await asyncio.wait_for(
                        kubelet.wait(lambda s, w=want: s.get(target) == w), 10
                    )
                    health.append(t1 - t0)
            rss_after_mb = ps.memory_info().rss / 1e6
        finally:
            await stop_process(proc)
            await kubelet.stop()
        return {
            "devices": devices,
            "hotplug_samples": len(lat),
            "hotplug_latency_ms_p50": pct(lat, 0.50) * 1000,
            "hotplug_latency_ms_p99": pct(lat, 0.99) * 1000,
            "hotplug_latency_ms_max": max(lat) * 1000,
            "health_samples": len(health),
            "health_change_latency_ms_p50": pct(health, 0.50) * 1000,
            "health_change_latency_ms_p99": pct(health, 0.99) * 1000,
            "rss_mb_1000_devices": rss_mb,
            "uss_mb_1000_devices": uss_mb,
            "rss_mb_after_hotplug": rss_after_mb,
            "idle_seconds": idle_seconds,
            "idle_cpu_ms": idle_cpu_ms,
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)


async def _main(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"benchmark": "generic", "python": sys.version.split()[0]}
    out.update(await bench_startup(args.startup_runs))
    out.update(await bench_daemon(args.devices, args.changes, args.idle_seconds))
    out["targets"] = {
        "hotplug_latency_ms_p99": 100,
        "startup_to_registered_ms_median": 500,
        "rss_mb_1000_devices": 45,
        "idle_cpu_ms": 60,
    }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--idle-seconds", type=float, default=60.0)
    parser.add_argument("--devices", type=int, default=1000)
    parser.add_argument("--changes", type=int, default=100, help="create+remove pairs")
    parser.add_argument("--startup-runs", type=int, default=5)
    args = parser.parse_args()
    result = asyncio.run(_main(args))
    print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in result.items()}))


if __name__ == "__main__":
    main()

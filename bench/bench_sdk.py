"""Benchmark of the plugin SDK; prints one JSON object.

Measures: Allocate latency (sequential, grpcio sync client; 64 concurrent callers,
grpc.aio client), kubelet.sock re-creation -> new Register, exec -> Register received,
the first ListAndWatch message with 10,000 devices (time and bytes) and the RSS of the
example plugin. Plugins run as subprocesses (this file with ``--serve N DIR``, or
``examples/minimal.py``); the kubelet side is the test double in ``tests/sdk``.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "sdk"))

import grpc  # noqa: E402
import psutil  # noqa: E402
from kubelet_double import KubeletDouble  # noqa: E402

import kubedevice  # noqa: E402
from kubedevice._api import dp, dp_grpc  # noqa: E402

RES = "example.com/bench"
SOCK = "example.com-bench.sock"


def _ids(n: int, tag: str = "") -> list[str]:
    return [f"GPU-{tag}{i:08d}-0000-0000-0000-000000000000"[:40] for i in range(n)]


class BenchPlugin(kubedevice.DevicePlugin):
    resource_name = RES

    def __init__(self, n: int) -> None:
        self.n = n

    async def devices(self) -> AsyncIterator[Sequence[kubedevice.Device]]:
        yield [
            kubedevice.Device(id=i, device_specs=(kubedevice.DeviceSpec("/dev/null", "/dev/null"),))
            for i in _ids(self.n)
        ]


def _wipe_sockets(directory: Path) -> None:
    for entry in directory.iterdir():
        if entry.is_socket():
            entry.unlink()


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


async def _spawn(args: list[str]) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, *args, stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL
    )


async def _stop(proc: asyncio.subprocess.Process) -> int:
    proc.terminate()
    return await proc.wait()


def _sync_allocate(sock: Path, n_calls: int, warmup: int, ids: list[str]) -> list[float]:
    with grpc.insecure_channel(f"unix://{sock}") as channel:
        stub = dp_grpc.DevicePluginStub(channel)
        req = dp.AllocateRequest()
        req.container_requests.add(devices_ids=ids)
        for _ in range(warmup):
            stub.Allocate(req)
        out = []
        for _ in range(n_calls):
            t0 = time.perf_counter_ns()
            stub.Allocate(req)
            out.append((time.perf_counter_ns() - t0) / 1e6)
    return out


async def _concurrent_allocate(
    sock: Path, callers: int, each: int, ids: list[str]
) -> dict[str, float]:
    async with grpc.aio.insecure_channel(f"unix://{sock}") as channel:
        stub = dp_grpc.DevicePluginStub(channel)
        req = dp.AllocateRequest()
        req.container_requests.add(devices_ids=ids)
        lat: list[float] = []

        async def caller() -> None:
            for _ in range(each):
                t0 = time.perf_counter_ns()
                await stub.Allocate(req)
                lat.append((time.perf_counter_ns() - t0) / 1e6)

        await asyncio.gather(*(stub.Allocate(req) for _ in range(callers)))
        t0 = time.perf_counter()
        await asyncio.gather(*(caller() for _ in range(callers)))
        wall = time.perf_counter() - t0
    return {
        "calls": len(lat),
        "calls_per_s": round(len(lat) / wall, 1),
        "p50_ms": round(_pct(lat, 0.5), 3),
        "p99_ms": round(_pct(lat, 0.99), 3),
    }


async def bench_start_and_rss(reps: int) -> dict[str, object]:
    starts = []
    rss_mb = 0.0
    threads = 0
    for rep in range(reps):
        d = Path(tempfile.mkdtemp(prefix="kd-b-", dir="/tmp"))
        kubelet = KubeletDouble(d, dial_back=False)
        await kubelet.start()
        t0 = time.perf_counter()
        proc = await _spawn([str(ROOT / "examples" / "minimal.py"), "--device-plugin-dir", str(d)])
        await kubelet.wait_registrations(1, timeout=30)
        starts.append((time.perf_counter() - t0) * 1000)
        if rep == reps - 1:
            # Let the dial-back-free registration settle, then read the steady RSS.
            info = psutil.Process(proc.pid)
            rss_mb = info.memory_info().rss / 2**20
            threads = info.num_threads()
        rc = await _stop(proc)
        await kubelet.stop()
        shutil.rmtree(d, ignore_errors=True)
        assert rc == 0, rc
    return {
        "start_to_registered_ms": {
            "median": round(statistics.median(starts), 1),
            "min": round(min(starts), 1),
            "reps": reps,
        },
        "example_rss_mb": round(rss_mb, 1),
        "example_threads": threads,
    }


async def bench_plugin_process(n_devices: int) -> dict[str, object]:
    d = Path(tempfile.mkdtemp(prefix="kd-b-", dir="/tmp"))
    kubelet = KubeletDouble(d)
    await kubelet.start()
    proc = await _spawn([__file__, "--serve", str(n_devices), str(d)])
    try:
        await kubelet.wait_registrations(1, timeout=60)
        sock = d / SOCK
        ids = _ids(n_devices)[:2]
        seq = await asyncio.to_thread(_sync_allocate, sock, 5000, 300, ids)
        conc = await _concurrent_allocate(sock, 64, 150, ids)
        # Re-registration: kubelet.sock re-created (our socket kept), time to new Register.
        rereg = []
        for rep in range(5):
            await kubelet.stop()
            t0 = time.perf_counter()
            await kubelet.start()
            await kubelet.wait_registrations(rep + 2, timeout=30)
            rereg.append((time.perf_counter() - t0) * 1000)
        # Kubelet restart proper: sockets wiped, kubelet.sock re-created.
        restart = []
        for rep in range(5):
            await kubelet.stop()
            _wipe_sockets(d)
            t0 = time.perf_counter()
            await kubelet.start()
            await kubelet.wait_registrations(rep + 7, timeout=30)
            restart.append((time.perf_counter() - t0) * 1000)
        rss = psutil.Process(proc.pid).memory_info().rss / 2**20
    finally:
        await _stop(proc)
        await kubelet.stop()
        shutil.rmtree(d, ignore_errors=True)
    return {
        "allocate_sequential_sync_client": {
            "calls": len(seq),
            "p50_ms": round(_pct(seq, 0.5), 3),
            "p99_ms": round(_pct(seq, 0.99), 3),
        },
        "allocate_64_concurrent_aio_client": conc,
        "kubelet_sock_recreated_to_register_ms": {
            "median": round(statistics.median(rereg), 1),
            "max": round(max(rereg), 1),
        },
        "kubelet_restart_sockets_wiped_to_register_ms": {
            "median": round(statistics.median(restart), 1),
            "max": round(max(restart), 1),
        },
        "plugin_rss_mb_with_devices_after_load": round(rss, 1),
        "plugin_devices": n_devices,
    }


async def bench_big_list(n_devices: int, reps: int) -> dict[str, object]:
    """update(10k devices) -> first message parsed by a client, in one process."""
    d = Path(tempfile.mkdtemp(prefix="kd-b-", dir="/tmp"))

    class Pushed(kubedevice.DevicePlugin):
        resource_name = RES

    plugin = Pushed()
    times = []
    first_ms = []
    build_ms = []
    size = 0
    async with kubedevice.PluginServer(d) as server:
        plugin.update([])
        await server.add(plugin)
        async with grpc.aio.insecure_channel(f"unix://{server.socket_path(RES)}") as channel:
            stream = dp_grpc.DevicePluginStub(channel).ListAndWatch(dp.Empty())
            await stream.read()
            for rep in range(reps):
                c0 = time.perf_counter()
                devices = [kubedevice.Device(id=i) for i in _ids(n_devices, tag=str(rep % 10))]
                build_ms.append((time.perf_counter() - c0) * 1000)
                t0 = time.perf_counter()
                plugin.update(devices)
                msg = await stream.read()
                times.append((time.perf_counter() - t0) * 1000)
                assert len(msg.devices) == n_devices
                size = msg.ByteSize()
            stream.cancel()
            # A new stream: time to the first (already encoded) full list.
            for _ in range(reps):
                t0 = time.perf_counter()
                stream = dp_grpc.DevicePluginStub(channel).ListAndWatch(dp.Empty())
                msg = await stream.read()
                first_ms.append((time.perf_counter() - t0) * 1000)
                stream.cancel()
    shutil.rmtree(d, ignore_errors=True)
    return {
        "devices": n_devices,
        "bytes": size,
        "update_to_parsed_ms_median": round(statistics.median(times), 2),
        "building_10k_Device_objects_ms_median": round(statistics.median(build_ms), 2),
        "new_stream_first_message_ms_median": round(statistics.median(first_ms), 2),
    }


async def main() -> None:
    result: dict[str, object] = {
        "machine": f"{os.cpu_count()} vCPU",
        "python": sys.version.split()[0],
    }
    result.update(await bench_start_and_rss(5))
    result.update(await bench_plugin_process(8))
    result["listandwatch_10k"] = await bench_big_list(10_000, 10)
    print(json.dumps(result, indent=2))


def serve_plugin(n: int, directory: str) -> int:
    return kubedevice.run(BenchPlugin(n), device_plugin_dir=directory)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--serve":
        raise SystemExit(serve_plugin(int(sys.argv[2]), sys.argv[3]))
    asyncio.run(main())

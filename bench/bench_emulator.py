"""Benchmark of the kubelet emulator; prints one JSON object.

* pods admitted per second (in-process ``apply_pod``, checkpoint writes included) with a
  1-device and an 8-device resource, each on 1,024 devices served by the raw test plugin
  (``tests/kubelet/rawplugin.py``) in a subprocess;
* registration-to-capacity: from the plugin sending its first ListAndWatch message
  (CLOCK_MONOTONIC, system-wide) to ``wait_for_resource`` returning in the emulator;
* RSS of a ``kubedevice kubelet`` process with 10 plugins and 10,000 devices;
* checkpoint cost per ListAndWatch message with 20,000 devices while one device flaps
  (time spent writing ``kubelet_internal_checkpoint``, summed and divided by the messages).

Targets (2 vCPUs): >= 500 one-device pods/s, capacity within 10 ms, < 60 MB RSS,
<= 10 ms of checkpoint writing per ListAndWatch message at 20,000 devices.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from kubedevice.kubelet import Emulator, ListAndWatchEvent
from kubedevice.kubelet.control import call, control_socket_path

ROOT = Path(__file__).resolve().parent.parent
RAW = ROOT / "tests" / "kubelet" / "rawplugin.py"
KUBEDEVICE = str(Path(sys.executable).parent / "kubedevice")
ENV = {**os.environ, "GRPC_VERBOSITY": "ERROR"}


def _plugin(d: Path, resource: str, count: int, *extra: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [
            sys.executable,
            str(RAW),
            "--dir",
            str(d),
            "--resource",
            resource,
            "--count",
            str(count),
            "--name",
            resource.replace("/", "_") + ".sock",
            *extra,
        ],
        stdout=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    return proc


def _ready(proc: subprocess.Popen[str], want_sent: bool = False) -> list[float]:
    """Read stdout until READY (and, with ``want_sent``, one SENT line); return SENT times."""
    sent: list[float] = []
    ready = False
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("SENT "):
            sent.append(float(line.split()[1]))
        elif line.strip() == "READY":
            ready = True
        if ready and (sent or not want_sent):
            return sent
    raise RuntimeError("plugin exited early")


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    if proc.stdout is not None:
        proc.stdout.close()


async def _pods_per_second(d: Path, devices_per_pod: int, n_pods: int) -> dict[str, Any]:
    resource = f"example.com/x{devices_per_pod}"
    async with Emulator(d, control_socket=False) as emu:
        proc = _plugin(d, resource, 1024)
        try:
            await asyncio.to_thread(_ready, proc)
            await emu.wait_for_resource(resource, allocatable=1024, timeout=30)
            manifests = [
                {
                    "metadata": {"name": f"p{i}"},
                    "spec": {
                        "containers": [
                            {
                                "name": "c",
                                "image": "x",
                                "resources": {"limits": {resource: devices_per_pod}},
                            }
                        ]
                    },
                }
                for i in range(n_pods)
            ]
            t0 = time.perf_counter()
            for m in manifests:
                await emu.apply_pod(m)
            elapsed = time.perf_counter() - t0
            assert emu.node().resources[resource].allocated == n_pods * devices_per_pod
            cp_size = (d / "kubelet_internal_checkpoint").stat().st_size
        finally:
            _stop(proc)
    return {
        "pods": n_pods,
        "devices_per_pod": devices_per_pod,
        "seconds": round(elapsed, 3),
        "pods_per_s": round(n_pods / elapsed, 1),
        "checkpoint_bytes_at_end": cp_size,
    }


async def _registration_to_capacity(d: Path, runs: int) -> dict[str, Any]:
    lat: list[float] = []
    async with Emulator(d, control_socket=False) as emu:
        for i in range(runs):
            resource = f"example.com/r{i}"
            proc = _plugin(d, resource, 100, "--print-sent")
            try:
                status_task = asyncio.create_task(emu.wait_for_resource(resource, timeout=30))
                await status_task
                visible = time.monotonic()
                sent = await asyncio.to_thread(_ready, proc, True)
                lat.append((visible - sent[0]) * 1000)
            finally:
                _stop(proc)
    lat.sort()
    return {
        "runs": runs,
        "devices": 100,
        "p50_ms": round(statistics.median(lat), 3),
        "max_ms": round(lat[-1], 3),
    }


_LIBRARY_RUNNER = """
import asyncio, signal, sys
from kubedevice.kubelet import Emulator, ListAndWatchEvent
async def main():
    emu = Emulator(sys.argv[1])
    await emu.start()
    print("kubelet emulator serving", file=sys.stderr, flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await emu.stop()
asyncio.run(main())
"""


def _rss(d: Path, plugins: int, per_plugin: int, *, cli: bool) -> dict[str, Any]:
    cmd = (
        [KUBEDEVICE, "--log-level", "warning", "kubelet", "--device-plugin-dir", str(d)]
        if cli
        else [sys.executable, "-c", _LIBRARY_RUNNER, str(d)]
    )
    emu = subprocess.Popen(
        cmd,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    assert emu.stderr is not None
    for line in emu.stderr:
        if "kubelet emulator serving" in line:
            break
    procs = []
    try:
        rss_idle = psutil.Process(emu.pid).memory_info().rss
        for i in range(plugins):
            procs.append(_plugin(d, f"example.com/m{i}", per_plugin, "--prefix", f"dev-{i:02d}-"))
        for i, p in enumerate(procs):
            _ready(p)
            reply = call(
                control_socket_path(d),
                {
                    "op": "wait",
                    "resource": f"example.com/m{i}",
                    "allocatable": per_plugin,
                    "timeout": 30,
                },
            )
            assert reply["ok"], reply
        rss = psutil.Process(emu.pid).memory_info().rss
    finally:
        for p in procs:
            _stop(p)
        emu.send_signal(signal.SIGTERM)
        emu.wait(timeout=30)
        emu.stderr.close()
    return {
        "plugins": plugins,
        "devices": plugins * per_plugin,
        "rss_mb": round(rss / 2**20, 1),
        "rss_idle_mb": round(rss_idle / 2**20, 1),
    }


async def _checkpoint_per_message(d: Path, devices: int, messages: int) -> dict[str, Any]:
    sys.path.insert(0, str(RAW.parent))
    from rawplugin import RawPlugin, devs  # the raw test plugin, in-process

    resource = "example.com/flap"
    async with Emulator(d, control_socket=False) as emu:
        assert emu._manager is not None
        manager = emu._manager
        spent: list[float] = []
        real_write = manager.checkpoint.write
        real_flush = manager.write_checkpoint

        def timed(fn: Any) -> Any:
            def run(*a: Any, **kw: Any) -> Any:
                t0 = time.perf_counter()
                try:
                    return fn(*a, **kw)
                finally:
                    spent.append(time.perf_counter() - t0)

            return run

        # everything the manager spends on the checkpoint (rendering, hashing, writing);
        # the writer's own ``write`` is timed too when something else calls it
        manager.write_checkpoint = timed(real_flush)  # type: ignore[method-assign]
        del real_write
        plugin = RawPlugin(d, resource, devs(devices))
        await plugin.start()
        try:
            await emu.wait_for_resource(resource, allocatable=devices, timeout=60)
            spent.clear()
            seen = len(emu.events.of_type(ListAndWatchEvent))
            t0 = time.perf_counter()
            for i in range(messages):
                plugin.devices[0] = plugin.devices[0].__class__(
                    "d0", "Unhealthy" if i % 2 == 0 else "Healthy"
                )
                plugin.push()
                want = seen + i + 1

                def got(want: int = want) -> bool:
                    return len(emu.events.of_type(ListAndWatchEvent)) >= want

                await emu.wait_until(got, 60)
            elapsed = time.perf_counter() - t0
            await emu.stop()  # a pending write is flushed here
        finally:
            await plugin.stop()
    return {
        "devices": devices,
        "messages": messages,
        "checkpoint_writes": len(spent),
        "checkpoint_ms_per_message": round(sum(spent) * 1000 / messages, 2),
        "checkpoint_ms_per_write": round(sum(spent) * 1000 / max(1, len(spent)), 2),
        "wall_ms_per_message": round(elapsed * 1000 / messages, 2),
    }


_TMP_DIRS: list[Path] = []


def _tmp() -> Path:
    base = Path(tempfile.mkdtemp(prefix="kd-bench-", dir="/tmp"))
    _TMP_DIRS.append(base)
    d = base / "dp"
    d.mkdir()
    return d


async def main() -> dict[str, Any]:
    try:
        return await _measure()
    finally:
        for base in _TMP_DIRS:
            shutil.rmtree(base, ignore_errors=True)


async def _measure() -> dict[str, Any]:
    return {
        "one_device_pods": await _pods_per_second(_tmp(), 1, 1000),
        "eight_device_pods": await _pods_per_second(_tmp(), 8, 128),
        "registration_to_capacity": await _registration_to_capacity(_tmp(), 10),
        "checkpoint_20k_devices_flapping": await _checkpoint_per_message(_tmp(), 20_000, 50),
        "rss_10_plugins_10k_devices": {
            "kubedevice_kubelet_cli": _rss(_tmp(), 10, 1000, cli=True),
            "emulator_library_process": _rss(_tmp(), 10, 1000, cli=False),
        },
        "cpus": os.cpu_count(),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main())))

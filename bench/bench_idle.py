"""Idle CPU of gRPC server designs holding one ListAndWatch stream; prints one JSON object.

Every variant is a separate server process serving ``v1beta1.DevicePlugin`` on its own Unix
socket with a ListAndWatch that sends one list and then waits. This process holds one
stream open to each (grpcio sync client) and, after a settling pause, measures every
server's CPU (the sum of ``/proc/PID/task/*/schedstat``, nanoseconds, so exited threads are
missed but short runs are not rounded to 10 ms ticks) and voluntary context switches (=
wake-ups) over the same window, so all variants share the machine's conditions.

The products are measured the same way in the same window: the SDK example
(``examples/minimal.py``) and the generic plugin (``kubedevice run``), each registered with
its own kubelet emulator (``kubedevice kubelet``), which holds the stream, so the
emulator's idle cost with one stream is measured too.

Usage: ``python bench/bench_idle.py [--seconds 60] [--only NAME,...]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
from _common import (
    KUBEDEVICE,
    PY,
    ROOT,
    cpu_model,
    cpu_ns_and_wakeups,
    serve_bare,
    spawn_ready,
    start_emulator,
    terminate_all,
    wait_allocatable,
    write_generic_config,
)

# name -> (server kind, extra environment, description)
VARIANTS: dict[str, tuple[str, dict[str, str], str]] = {
    "aio-default": ("aio", {}, "grpc.aio.server() as the SDK and emulator use it"),
    "aio-poll": ("aio", {"GRPC_POLL_STRATEGY": "poll"}, "GRPC_POLL_STRATEGY=poll"),
    "aio-fork-support-off": (
        "aio",
        {"GRPC_ENABLE_FORK_SUPPORT": "0"},
        "GRPC_ENABLE_FORK_SUPPORT=0",
    ),
    "aio-options": (
        "aio-options",
        {},
        "so_reuseport=0, max_concurrent_streams=8, keepalive off, no http2 pings",
    ),
    "aio-no-ee-experiments": (
        "aio",
        {
            "GRPC_EXPERIMENTS": "-event_engine_client,-event_engine_listener,"
            "-event_engine_callback_cq"
        },
        "EventEngine experiments turned off (GRPC_EXPERIMENTS=-...)",
    ),
    "aio-pollset-alternative": (
        "aio",
        {"GRPC_EXPERIMENTS": "pollset_alternative"},
        "GRPC_EXPERIMENTS=pollset_alternative",
    ),
    "sync-threadpool": ("sync", {}, "grpc.server(ThreadPoolExecutor(4))"),
    "grpclib": ("grpclib", {}, "grpclib (pure asyncio + h2), if installed"),
}


# --------------------------------------------------------------------------- servers


def _serve(kind: str, sock: str) -> None:
    """Run one bare server variant until killed (child process)."""
    from kubedevice._api import dp, dp_grpc

    listing = dp.ListAndWatchResponse(
        devices=[dp.Device(ID=f"dev-{i}", health="Healthy") for i in range(4)]
    )
    if kind == "grpclib":
        _serve_grpclib(sock, listing)
        return
    if kind == "sync":
        stop = threading.Event()

        class SyncServicer(dp_grpc.DevicePluginServicer):  # type: ignore[misc]
            def GetDevicePluginOptions(self, request: Any, context: Any) -> Any:
                return dp.DevicePluginOptions()

            def ListAndWatch(self, request: Any, context: Any) -> Iterator[Any]:
                yield listing
                stop.wait()

        serve_bare(SyncServicer(), sock, aio=False)
        return

    import asyncio

    class AioServicer(dp_grpc.DevicePluginServicer):  # type: ignore[misc]
        async def GetDevicePluginOptions(self, request: Any, context: Any) -> Any:
            return dp.DevicePluginOptions()

        async def ListAndWatch(self, request: Any, context: Any) -> Any:
            await context.write(listing)
            await asyncio.Event().wait()

    options: list[tuple[str, Any]] = []
    if kind == "aio-options":
        options = [
            ("grpc.so_reuseport", 0),
            ("grpc.max_concurrent_streams", 8),
            ("grpc.keepalive_time_ms", 2**31 - 1),
            ("grpc.http2.max_pings_without_data", 0),
            ("grpc.keepalive_permit_without_calls", 0),
        ]
    serve_bare(AioServicer(), sock, aio=True, options=options)


def _serve_grpclib(sock: str, listing: Any) -> None:
    import asyncio

    from grpclib.const import Cardinality, Handler
    from grpclib.server import Server

    from kubedevice._api import dp

    class Plugin:
        async def options(self, stream: Any) -> None:
            await stream.recv_message()
            await stream.send_message(dp.DevicePluginOptions())

        async def watch(self, stream: Any) -> None:
            await stream.recv_message()
            await stream.send_message(listing)
            await asyncio.Event().wait()

        def __mapping__(self) -> dict[str, Handler]:
            return {
                "/v1beta1.DevicePlugin/GetDevicePluginOptions": Handler(
                    self.options, Cardinality.UNARY_UNARY, dp.Empty, dp.DevicePluginOptions
                ),
                "/v1beta1.DevicePlugin/ListAndWatch": Handler(
                    self.watch, Cardinality.UNARY_STREAM, dp.Empty, dp.ListAndWatchResponse
                ),
            }

    async def main() -> None:
        server = Server([Plugin()])
        await server.start(path=sock)
        print("READY", flush=True)
        await server.wait_closed()

    asyncio.run(main())


# --------------------------------------------------------------------------- measuring


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _hold_stream(sock: str) -> tuple[grpc.Channel, Any]:
    from kubedevice._api import dp, dp_grpc

    channel = grpc.insecure_channel(f"unix:{sock}")
    stream = dp_grpc.DevicePluginStub(channel).ListAndWatch(dp.Empty())
    first = next(stream)
    assert len(first.devices) == 4
    return channel, stream


def _generic_config(root: Path) -> Path:
    """A config for 4 fake character devices in a fake /dev tree (no hardware needed)."""
    return write_generic_config(root, "idle", (f"dev{i}" for i in range(4)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--settle", type=float, default=3.0)
    parser.add_argument("--only", default="", help="comma-separated names to run")
    parser.add_argument("--serve", nargs=2, metavar=("KIND", "SOCK"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        _serve(*args.serve)
        return
    only = {n for n in args.only.split(",") if n}
    root = Path(tempfile.mkdtemp(prefix="kdidle-", dir="/tmp"))
    procs: dict[str, subprocess.Popen[str]] = {}
    holders: list[tuple[grpc.Channel, Any]] = []
    skipped: dict[str, str] = {}
    try:
        for name, (kind, env, _) in VARIANTS.items():
            if only and name not in only:
                continue
            if kind == "grpclib":
                try:
                    import grpclib  # noqa: F401
                except ImportError:
                    skipped[name] = "grpclib not installed"
                    continue
            sock = str(root / f"{name}.sock")
            procs[name] = spawn_ready(
                [PY, __file__, "--serve", kind, sock], name, env={**os.environ, **env}
            )
            holders.append(_hold_stream(sock))
        # the products: each plugin with its own emulator (which holds the stream)
        products = {
            "sdk-example": [PY, str(ROOT / "examples/minimal.py")],
            "generic-plugin": [KUBEDEVICE, "run", "--config", str(_generic_config(root))],
        }
        for name, cmd in products.items():
            if only and name not in only and f"emulator[{name}]" not in only:
                continue
            d = root / name / "device-plugins"
            d.mkdir(parents=True)
            env = {**os.environ, "DP_DEVICE_PLUGIN_DIR": str(d)}
            procs[f"emulator[{name}]"] = start_emulator(d, env)
            plugin = subprocess.Popen(cmd, env=env, stderr=subprocess.DEVNULL, text=True)
            procs[name] = plugin
            resource = "example.com/" + ("counter" if name == "sdk-example" else "idle")
            wait_allocatable(env, resource, 4, 30)
        time.sleep(args.settle)  # let start-up work finish before the window opens
        before = {n: cpu_ns_and_wakeups(p.pid) for n, p in procs.items()}
        t0 = time.monotonic()
        time.sleep(args.seconds)  # the idle window is what is measured
        elapsed = time.monotonic() - t0
        after = {n: cpu_ns_and_wakeups(p.pid) for n, p in procs.items()}
        scale = 60.0 / elapsed
        result: dict[str, Any] = {
            "bench": "idle",
            "window_s": round(elapsed, 1),
            "unit": "per 60 s, one ListAndWatch stream open",
            "python": sys.version.split()[0],
            "grpcio": grpc.__version__,
            "cpu_model": cpu_model(),
            "target_cpu_ms_per_60s": 30,
            "results": {},
            "skipped": skipped,
        }
        for name, proc in procs.items():
            (c0, w0, _), (c1, w1, threads) = before[name], after[name]
            desc = VARIANTS[name][2] if name in VARIANTS else "product"
            result["results"][name] = {
                "cpu_ms": round((c1 - c0) / 1e6 * scale, 1),
                "wakeups": round((w1 - w0) * scale),
                "threads": threads,
                "rss_mb": round(_rss_mb(proc.pid), 1),
                "what": desc,
            }
        print(json.dumps(result, indent=2))
    finally:
        for channel, _ in holders:
            channel.close()
        terminate_all(procs.values())
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

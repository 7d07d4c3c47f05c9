"""Allocate latency: the SDK example next to bare grpcio servicers; prints one JSON object.

Same client, same kind of socket, same request and the same response bytes for every
server, so the difference is what each server does per call:

* ``sdk-example``: ``examples/minimal.py`` as a process (the SDK's Allocate path: ID checks,
  the plugin's hook, the response built from the device);
* ``bare-aio``: a ``grpc.aio`` servicer returning a prebuilt response (the floor of the
  engine the SDK uses);
* ``bare-sync``: a ``grpc.server(ThreadPoolExecutor)`` servicer returning the same response.

Two clients, each measuring the servers in rotation, ``--rounds`` times, per-round medians
reported:

* ``go``: ``dpbench``, a Go program on the upstream device-plugin v1beta1 client (the
  kubelet's own gRPC stack), as the kubelet calls Allocate: 200 warm-up calls, then
  ``--calls`` sequential calls; its p50/p90/p99. Found at ``--dpbench`` (default:
  ``$KUBEDEVICE_DPBENCH``, else ``~/.cache/kubedevice-k8s/v1.36.2/dpbench``); skipped,
  with a line on stderr, where it is missing.
* ``python``: grpcio's synchronous stub in this process: 300 warm-up calls, then
  ``--calls`` sequential calls timed with ``perf_counter_ns``.

``sdk_cost_over_bare_aio_pct`` is the SDK example's p50 over the bare ``grpc.aio``
servicer's, from the Go client (the goal is 15% at most). The SDK's own Python work per
call (everything between the request message and the response message, without gRPC) is
timed in-process as ``sdk_python_us``.

Usage: ``python bench/bench_allocate.py [--calls 3000] [--rounds 3] [--dpbench PATH]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc
from _common import PY, ROOT, cpu_model, serve_bare, spawn_ready, terminate_all

from kubedevice._api import dp, dp_grpc

DEFAULT_DPBENCH = Path.home() / ".cache/kubedevice-k8s/v1.36.2/dpbench"

REQUEST = dp.AllocateRequest(
    container_requests=[dp.ContainerAllocateRequest(devices_ids=["counter-0"])]
)


def _response() -> dp.AllocateResponse:
    """What the SDK example answers for counter-0 (checked against it before timing)."""
    resp = dp.AllocateResponse()
    c = resp.container_responses.add()
    c.envs["COUNTER"] = "0"
    c.devices.add(container_path="/dev/counter0", host_path="/dev/null", permissions="rw")
    return resp


def _serve(kind: str, sock: str) -> None:
    """A bare servicer answering Allocate with a prebuilt response (child process)."""
    answer = _response()
    if kind == "sync":

        class Sync(dp_grpc.DevicePluginServicer):  # type: ignore[misc]
            def GetDevicePluginOptions(self, request: Any, context: Any) -> Any:
                return dp.DevicePluginOptions()

            def Allocate(self, request: Any, context: Any) -> Any:
                return answer

        serve_bare(Sync(), sock, aio=False)
        return

    class Aio(dp_grpc.DevicePluginServicer):  # type: ignore[misc]
        async def GetDevicePluginOptions(self, request: Any, context: Any) -> Any:
            return dp.DevicePluginOptions()

        async def Allocate(self, request: Any, context: Any) -> Any:
            return answer

    serve_bare(Aio(), sock, aio=True)


def _time_calls(sock: str, calls: int) -> list[float]:
    with grpc.insecure_channel(f"unix:{sock}") as channel:
        stub = dp_grpc.DevicePluginStub(channel)
        first = stub.Allocate(REQUEST, timeout=10)
        assert first == _response(), first
        for _ in range(300):
            stub.Allocate(REQUEST, timeout=10)
        out = []
        for _ in range(calls):
            t0 = time.perf_counter_ns()
            stub.Allocate(REQUEST, timeout=10)
            out.append((time.perf_counter_ns() - t0) / 1000)
    return out


def _go_calls(dpbench: str, sock: str, calls: int) -> dict[str, float]:
    """One dpbench run against ``sock``: its p50/p90/p99 in µs."""
    run = subprocess.run(
        [dpbench, "-socket", sock, "-ids", "counter-0", "-n", str(calls), "-warmup", "200"],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    if run.returncode != 0:
        raise RuntimeError(f"dpbench failed on {sock}: {run.stderr.strip() or run.stdout}")
    report = json.loads(run.stdout)
    if report.get("errors"):
        raise RuntimeError(f"dpbench: {report['errors']} Allocate errors on {sock}")
    return {f"p{q}_us": report[f"p{q}_ms"] * 1000 for q in (50, 90, 99)}


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _sdk_python_us(n: int) -> float | None:
    """Median µs of the SDK's Allocate work without gRPC (request in, response out)."""
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import minimal

        from kubedevice.plugin.servicer import DeviceTable, _Servicer

        async def run() -> float:
            plugin = minimal.Counter()
            table = DeviceTable(plugin.resource_name)
            async for snapshot in plugin.devices():
                table.publish(snapshot)
                break
            svc = _Servicer(plugin, table, None)
            samples = []
            for _ in range(n):
                t0 = time.perf_counter_ns()
                resp = await svc._allocate(REQUEST)
                samples.append((time.perf_counter_ns() - t0) / 1000)
            if isinstance(resp, bytes):  # the serialized response, as sent
                resp = dp.AllocateResponse.FromString(resp)
            assert resp == _response(), resp
            return statistics.median(samples)

        return asyncio.run(run())
    except (ImportError, AttributeError, TypeError) as exc:  # internals moved: skip this figure
        print(f"sdk_python_us skipped: {exc}", file=sys.stderr)
        return None
    finally:
        sys.path.pop(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--dpbench",
        default=os.environ.get("KUBEDEVICE_DPBENCH", str(DEFAULT_DPBENCH)),
        help="the Go client (dpbench) binary",
    )
    parser.add_argument("--serve", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        _serve(*args.serve)
        return
    root = Path(tempfile.mkdtemp(prefix="kdalloc-", dir="/tmp"))
    procs: list[subprocess.Popen[str]] = []
    socks: dict[str, str] = {}
    try:
        for kind in ("aio", "sync"):
            sock = str(root / f"{kind}.sock")
            procs.append(spawn_ready([PY, __file__, "--serve", kind, sock], f"bare {kind} server"))
            socks[f"bare-{kind}"] = sock
        dp_dir = root / "dp"
        dp_dir.mkdir()
        sdk = subprocess.Popen(
            [PY, str(ROOT / "examples/minimal.py"), "--device-plugin-dir", str(dp_dir)],
            stderr=subprocess.DEVNULL,
            text=True,
        )
        procs.append(sdk)
        sdk_sock = dp_dir / "example.com-counter.sock"
        deadline = time.monotonic() + 30
        while not sdk_sock.is_socket():  # start-up only; not part of what is timed
            if time.monotonic() > deadline or sdk.poll() is not None:
                raise RuntimeError("the SDK example did not serve its socket")
            time.sleep(0.05)
        socks["sdk-example"] = str(sdk_sock)
        dpbench = args.dpbench if Path(args.dpbench).is_file() else None
        if dpbench is None:
            print(f"no Go client at {args.dpbench}: the go figures are skipped", file=sys.stderr)
        go: dict[str, list[dict[str, float]]] = {name: [] for name in socks}
        rounds: dict[str, list[tuple[float, float]]] = {name: [] for name in socks}
        for _ in range(args.rounds):
            for name, sock in socks.items():
                if dpbench is not None:
                    go[name].append(_go_calls(dpbench, sock, args.calls))
                samples = _time_calls(sock, args.calls)
                rounds[name].append((statistics.median(samples), _pct(samples, 0.99)))
        result: dict[str, Any] = {
            "bench": "allocate",
            "client_go": None if dpbench is None else f"{dpbench} (upstream v1beta1 Go client)",
            "client_python": f"grpcio {grpc.__version__} sync stub, same process, sequential",
            "calls_per_round": args.calls,
            "rounds": args.rounds,
            "python": sys.version.split()[0],
            "cpu_model": cpu_model(),
            "servers_go": {
                name: {
                    key: round(statistics.median(r[key] for r in rs), 1)
                    for key in ("p50_us", "p90_us", "p99_us")
                }
                | {"p50_us_each_round": [round(r["p50_us"], 1) for r in rs]}
                for name, rs in go.items()
                if rs
            },
            "servers": {
                name: {
                    "p50_us_median_of_rounds": round(statistics.median(r[0] for r in rs), 1),
                    "p99_us_median_of_rounds": round(statistics.median(r[1] for r in rs), 1),
                    "p50_us_each_round": [round(r[0], 1) for r in rs],
                }
                for name, rs in rounds.items()
            },
            "sdk_python_us": _sdk_python_us(2000),
        }
        if dpbench is not None:
            sdk_p50 = result["servers_go"]["sdk-example"]["p50_us"]
            bare_p50 = result["servers_go"]["bare-aio"]["p50_us"]
            result["sdk_cost_over_bare_aio_pct"] = round((sdk_p50 / bare_p50 - 1) * 100, 1)
        servers = result["servers"]
        result["sdk_over_bare_aio_us"] = round(
            servers["sdk-example"]["p50_us_median_of_rounds"]
            - servers["bare-aio"]["p50_us_median_of_rounds"],
            1,
        )
        print(json.dumps(result, indent=2))
    finally:
        terminate_all(procs)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

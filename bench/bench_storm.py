"""A kubelet restart storm against one SDK process; prints one JSON object.

One SDK process (this file with ``--serve N DIR``) serves N resources (default 200), one
device each, on the emulator (``kubedevice kubelet``, a real process). The emulator is
restarted through its control socket (as ``kubedevice kubelet restart`` does: plugins
disconnected, every socket in the directory deleted, ``kubelet.sock`` served again) every
``--interval`` seconds (default 0.1) for ``--seconds`` (default 20; 0: a single restart).
Then, from the end of the last restart: how many resources are back (their first
ListAndWatch message with the device healthy, from the emulator's event log, which uses
this process's monotonic clock) within 1 s, and how long until all are (up to 30 s). The
emulator is asked only four times a second whether all are back: its answers cost it CPU.

    python bench/bench_storm.py [--resources 200] [--seconds 20] [--interval 0.1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from _common import KUBEDEVICE, PY, cpu_model, pct, spawn_ready, start_emulator, terminate_all

import kubedevice
from kubedevice.kubelet.control import call, control_socket_path


class One(kubedevice.DevicePlugin):
    def __init__(self, i: int) -> None:
        self.resource_name = f"example.com/storm{i}"

    async def devices(self) -> AsyncIterator[Sequence[kubedevice.Device]]:
        yield [kubedevice.Device(id="d0")]
        await asyncio.Event().wait()


def _serve(n: int, directory: str) -> None:
    logging.basicConfig(level=logging.ERROR)  # a warning per resource per restart otherwise

    async def main() -> None:
        ready = asyncio.Event()
        task = asyncio.create_task(
            kubedevice.serve(*(One(i) for i in range(n)), device_plugin_dir=directory, ready=ready)
        )
        await ready.wait()
        print("READY", flush=True)
        await task

    asyncio.run(main())


def _call(control: Path, op: str) -> Any:
    reply = call(control, {"op": op})
    if not reply.get("ok"):
        raise RuntimeError(f"emulator {op}: {reply}")
    return reply.get("result")


def _back(control: Path, n: int) -> set[str]:
    node = _call(control, "node")
    return {
        name
        for name, status in (node.get("resources") or {}).items()
        if isinstance(status, dict) and status.get("allocatable") == 1
    } & {f"example.com/storm{i}" for i in range(n)}


def _back_times(control: Path, n: int, since: float) -> dict[str, float]:
    """Per resource, seconds from ``since`` to its first ListAndWatch message with a healthy
    device after the emulator last started (its event log; the same monotonic clock)."""
    events = _call(control, "events")
    starts = [e["t"] for e in events if e.get("kind") == "kubelet_started"]
    names = {f"example.com/storm{i}" for i in range(n)}
    out: dict[str, float] = {}
    for e in events:
        if e.get("kind") != "list_and_watch" or e["t"] < starts[-1]:
            continue
        if e["resource"] in names and e["healthy"] >= 1 and e["resource"] not in out:
            out[e["resource"]] = max(0.0, e["t"] - since)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--resources", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--interval", type=float, default=0.1)
    parser.add_argument("--serve", nargs=2, metavar=("N", "DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        _serve(int(args.serve[0]), args.serve[1])
        return
    n = args.resources
    tmp = Path(tempfile.mkdtemp(prefix="kd-storm-", dir="/tmp"))
    plugin_dir = tmp / "dp"
    plugin_dir.mkdir()
    env = {**os.environ, "DP_DEVICE_PLUGIN_DIR": str(plugin_dir)}
    procs: list[subprocess.Popen[str]] = []
    try:
        procs.append(start_emulator(plugin_dir, env))
        control = control_socket_path(plugin_dir)
        quiet = {**env, "GRPC_VERBOSITY": "NONE"}
        procs.append(
            spawn_ready([PY, __file__, "--serve", str(n), str(plugin_dir)], "plugins", env=quiet)
        )
        subprocess.run(  # every resource registered once before the storm
            [KUBEDEVICE, "node", "--wait-for", f"example.com/storm{n - 1}", "--timeout", "120"],
            env=env,
            check=True,
            stdout=subprocess.DEVNULL,
        )
        restarts = 0
        end = time.monotonic() + args.seconds
        while time.monotonic() < end:
            _call(control, "restart")
            restarts += 1
            time.sleep(args.interval)  # the storm's rhythm, not a wait for a result
        _call(control, "restart")
        restarts += 1
        last = time.monotonic()
        seen: set[str] = set()
        while time.monotonic() - last < 30:
            seen = _back(control, n)
            if len(seen) == n:
                break
            time.sleep(0.25)  # only to learn that all are back; the times come from events
        back_at = _back_times(control, n, last)
        all_back_s = max(back_at.values()) if len(back_at) == n else None
        back_1s = sum(1 for t in back_at.values() if t <= 1.0)
        print(
            json.dumps(
                {
                    "bench": "kubelet restart storm",
                    "resources": n,
                    "restarts": restarts,
                    "interval_s": args.interval,
                    "storm_s": args.seconds,
                    "back_within_1s": back_1s,
                    "back_within_30s": len(seen),
                    "all_back_after_s": None if all_back_s is None else round(all_back_s, 3),
                    "back_after_s": {
                        f"p{q}": round(pct(list(back_at.values()), q / 100), 3)
                        for q in (10, 50, 90, 100)
                    }
                    if back_at
                    else None,
                    "missing": sorted(
                        {f"example.com/storm{i}" for i in range(n)} - seen,
                        key=lambda s: int(s.removeprefix("example.com/storm")),
                    )[:20],
                    "machine": cpu_model(),
                    "load": [round(x, 2) for x in os.getloadavg()],
                    "python": sys.version.split()[0],
                },
                indent=2,
            )
        )
    finally:
        terminate_all(reversed(procs))
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()

"""Benchmark of topology-aware GetPreferredAllocation (kubedevice.nvidia.topology); prints JSON.

Measures ``preferred_allocation`` (the pure choice, no gRPC) on:

* the packaged fake 8-GPU box (``dgx-8gpu``): sizes 1..8, exhaustive search;
* a synthetic 16-GPU box (two NVLink halves of 8, 2 GPUs per PCIe switch, 2 degraded
  links): sizes 2..16, the bounded heuristic where the exhaustive search would be large;
* 8 GPUs x 4 time-slicing replicas (32 device IDs).

Reports p50/p99/max milliseconds per call over ``--rounds`` calls. Targets: 8 GPUs
<= 5 ms, 16 GPUs < 10 ms.
"""

from __future__ import annotations

import argparse
import itertools
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from kubedevice.nvidia.backend import Link, P2PLevel
from kubedevice.nvidia.fake import FakeNvml
from kubedevice.nvidia.topology import Topology, build_topology, preferred_allocation


def _timed(fn: Callable[[], object], rounds: int) -> dict[str, float]:
    fn()  # warm
    samples = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t) * 1000.0)
    samples.sort()
    return {
        "p50_ms": round(statistics.median(samples), 4),
        "p99_ms": round(samples[min(len(samples) - 1, int(len(samples) * 0.99))], 4),
        "max_ms": round(samples[-1], 4),
    }


def _box16() -> tuple[Topology, list[str]]:
    u = [f"GPU-{i:02d}" for i in range(16)]
    links = {}
    for i, j in itertools.combinations(range(16), 2):
        same_half = i // 8 == j // 8
        if i // 2 == j // 2:
            level = P2PLevel.SINGLE
        else:
            level = P2PLevel.NODE if same_half else P2PLevel.SYSTEM
        nv = 18 if same_half else 0
        if (i, j) in ((1, 2), (9, 12)):
            nv = 6
        links[frozenset((u[i], u[j]))] = Link(level, nv)
    return Topology(links=links, numa={x: i // 8 for i, x in enumerate(u)}), u


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=200)
    args = ap.parse_args()
    out: dict[str, Any] = {
        "bench": "nvidia_topology",
        "python": platform.python_version(),
        "machine": platform.machine(),
        "rounds": args.rounds,
    }
    fake = FakeNvml.from_file("dgx-8gpu")
    fake.init()
    gpus = fake.gpus()
    t = time.perf_counter()
    topo8 = build_topology(fake, gpus, {g.info.uuid: g.numa_node for g in fake.machine.gpus})
    out["build_topology_8_ms"] = round((time.perf_counter() - t) * 1000.0, 3)
    avail8 = [(g.uuid, g.uuid) for g in gpus]
    out["gpus8"] = {
        str(size): _timed(lambda s=size: preferred_allocation(topo8, avail8, [], s), args.rounds)
        for size in range(1, 9)
    }
    reps = [(f"{g.uuid}::{r}", g.uuid) for g in gpus for r in range(4)]
    out["gpus8_replicas4"] = {
        str(size): _timed(lambda s=size: preferred_allocation(topo8, reps, [], s), args.rounds)
        for size in (2, 4, 8, 16)
    }
    fake.close()
    topo16, u16 = _box16()
    avail16 = [(x, x) for x in u16]
    out["gpus16"] = {
        str(size): _timed(lambda s=size: preferred_allocation(topo16, avail16, [], s), args.rounds)
        for size in (2, 4, 6, 8, 12, 16)
    }
    worst8 = max(v["p99_ms"] for v in out["gpus8"].values())
    worst16 = max(v["p99_ms"] for v in out["gpus16"].values())
    out["worst_p99_ms"] = {"gpus8": worst8, "gpus16": worst16}
    out["targets_met"] = {"gpus8_le_5ms": worst8 <= 5.0, "gpus16_lt_10ms": worst16 < 10.0}
    json.dump(out, sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

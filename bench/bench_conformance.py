"""Benchmark of the conformance kit (``kubedevice.conformance``); prints one JSON object.

Runs the whole kit, in-process, against real plugin processes:

* the independent fixture plugin in its good mode (every case passes): wall time per run
* the SDK's ``examples/minimal.py`` (when present): wall time per run
* per case, the median time the good run spent on it
* the slowest broken mode that still ends on events (``--register-before-serve``)

Target: a whole run on a good plugin in a few seconds (it is dominated by the plugin's own
start-up); the kit waits on events and never sleeps.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from kubedevice.conformance import Report, run_conformance

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "conformance" / "plugins" / "fixture_plugin.py"
EXAMPLE = ROOT / "examples" / "minimal.py"


def _cmd(script: Path, *flags: str) -> list[str]:
    return [sys.executable, str(script), "--device-plugin-dir", "{dir}", *flags]


async def _runs(cmd: list[str], n: int) -> tuple[list[float], list[Report]]:
    times, reports = [], []
    for _ in range(n):
        t = time.monotonic()
        rep = await run_conformance(cmd, timeout=10.0)
        times.append(time.monotonic() - t)
        reports.append(rep)
        os.unlink(rep.log_path)
    return times, reports


def _stats(times: list[float]) -> dict[str, float]:
    return {
        "median_s": round(statistics.median(times), 3),
        "min_s": round(min(times), 3),
        "max_s": round(max(times), 3),
    }


async def _main(n: int) -> dict[str, Any]:
    out: dict[str, Any] = {"runs": n, "load_avg_1m": round(os.getloadavg()[0], 2)}
    times, reports = await _runs(_cmd(FIXTURE), n)
    out["fixture_good"] = _stats(times) | {
        "summary": reports[-1].summary(),
        "all_passed": all(r.failed == 0 and r.skipped == 0 for r in reports),
    }
    per_case: dict[str, list[float]] = {}
    for rep in reports:
        for res in rep.results:
            per_case.setdefault(res.case.id, []).append(res.duration_s)
    out["fixture_good_case_median_ms"] = {
        k: round(statistics.median(v) * 1000, 1) for k, v in per_case.items()
    }
    if EXAMPLE.exists():
        times, reports = await _runs(_cmd(EXAMPLE), n)
        out["sdk_minimal"] = _stats(times) | {
            "summary": reports[-1].summary(),
            "runs_without_must_failure": sum(r.ok() for r in reports),
        }
    times, reports = await _runs(_cmd(FIXTURE, "--register-before-serve"), max(1, n // 2))
    out["fixture_register_before_serve"] = _stats(times) | {"summary": reports[-1].summary()}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(_main(args.runs)), indent=2))


if __name__ == "__main__":
    main()

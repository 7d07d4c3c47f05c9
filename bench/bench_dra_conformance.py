"""Benchmark of the DRA conformance kit (``kubedevice conformance --dra``); prints one JSON object.

Runs the kit as the command a user runs (a real process, ``--k8s-bin``: its own etcd and
kube-apiserver, started and stopped in every run) against the independent kit driver of
``tests/conformance/plugins/kit_driver.py`` and against ``kubedevice run --dra`` on a fake
``/dev`` tree: a full run and a ``--quick`` run of each, ``--runs`` times. Per case, the
median time the full runs of the generic driver spent on it.

Targets (issue 30): a full run against one driver within 2 minutes on the 2-core machines,
a quick run under 30 s.

Run: ``python bench/bench_dra_conformance.py [--runs 3] [--k8s-bin DIR]`` (the binaries as the
tests find them without ``--k8s-bin``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


def _run(bin_dir: Path, kit: list[str], command: list[str], work: Path) -> tuple[float, Any]:
    junit = work / "run.xml"
    t = time.monotonic()
    proc = subprocess.run(
        [str(Path(sys.executable).with_name("kubedevice")), "conformance", "--dra",
         "--k8s-bin", str(bin_dir), "--log", str(work / "driver.log"), "--junit", str(junit),
         *kit, "--", *command],
        capture_output=True, text=True, check=False, timeout=600,
    )  # fmt: skip
    took = time.monotonic() - t
    summary = next((x for x in proc.stdout.splitlines() if " passed, " in x), proc.stderr[-200:])
    cases = {
        c.attrib["name"]: float(c.attrib["time"])
        for c in ET.parse(junit).getroot().iter("testcase")
    } if junit.is_file() else {}  # fmt: skip
    return took, (summary, cases)


def _stats(times: list[float]) -> dict[str, float]:
    return {"median_s": round(statistics.median(times), 2), "min_s": round(min(times), 2),
            "max_s": round(max(times), 2)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--k8s-bin", type=Path)
    args = parser.parse_args()
    from conformance.dra_drivers import generic
    from conformance.plugins import kit_driver_cmd
    from e2e.cluster import find_binaries

    bin_dir = args.k8s_bin or find_binaries(ROOT)
    if bin_dir is None:
        raise SystemExit("no Kubernetes binaries: give --k8s-bin DIR")
    out: dict[str, Any] = {"runs": args.runs, "load_avg_1m_start": round(os.getloadavg()[0], 2)}
    with tempfile.TemporaryDirectory(prefix="kd-bench-dra-") as tmp:
        work = Path(tmp)
        kit_opts, generic_cmd = generic(work)
        drivers = {"kit_driver": ([], kit_driver_cmd()), "generic": (kit_opts, generic_cmd)}
        per_case: dict[str, list[float]] = {}
        for name, (opts, command) in drivers.items():
            for mode, extra in (("full", []), ("quick", ["--quick"])):
                times, summary = [], ""
                for _ in range(args.runs):
                    took, (summary, cases) = _run(bin_dir, [*opts, *extra], command, work)
                    times.append(took)
                    if name == "generic" and mode == "full":
                        for case, seconds in cases.items():
                            per_case.setdefault(case, []).append(seconds)
                out[f"{name}_{mode}"] = _stats(times) | {"summary": summary}
        out["generic_full_case_median_s"] = {
            k: round(statistics.median(v), 2) for k, v in per_case.items()
            if statistics.median(v) >= 0.5
        }  # fmt: skip
    out["load_avg_1m_end"] = round(os.getloadavg()[0], 2)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

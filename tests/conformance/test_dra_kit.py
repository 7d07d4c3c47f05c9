"""``kubedevice conformance --dra`` as a real process, with its own real API server, against
our DRA drivers (real processes, real sockets), and what it says of a broken one.

Every run of the kit is made once for the module, a few at a time (each is its own API
server, the kit and the driver): most of a run is waiting (the quiet period, restarts),
so on a 2-core machine side by side costs little more than one.
"""

from __future__ import annotations

import os
import subprocess
import xml.etree.ElementTree as ET
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from kubedevice.conformance.dra import DRA_CASES

from .dra_drivers import (
    KUBEDEVICE,
    example,
    explain,
    generic,
    gpu,
    k8s_bin,
    rows,
    run_kit,
    summary,
)
from .plugins import kit_driver_cmd
from .plugins.kit_driver import BREAK_FLAGS, DELAY_ENV

pytestmark = pytest.mark.timeout(300)
#: Kit runs at a time.
PARALLEL = 3
#: For the tests that read the runs: whichever comes first makes them all.
RUNS_TIMEOUT = pytest.mark.timeout(600)


@dataclass(frozen=True)
class KitRun:
    """One kit run: the process's outcome, the driver's log, the run's own directory."""

    proc: subprocess.CompletedProcess[str]
    log: Path
    work: Path

    @property
    def table(self) -> dict[str, tuple[str, str]]:
        """Case id -> (RESULT, EVIDENCE)."""
        return rows(self.proc.stdout)

    def explain(self) -> str:
        """The failed cases, their evidence and the driver log's tail, for an assertion."""
        return explain(self.proc, self.log)

    def clean(self) -> dict[str, tuple[str, str]]:
        """The table of a run that must pass every case (the assertion says what failed)."""
        table = self.table
        failed = [line for line in self.proc.stdout.splitlines() if line.startswith("FAIL")]
        out = self.proc.stdout + self.proc.stderr
        clean = "Traceback" not in out and len(table) == len(DRA_CASES)
        assert self.proc.returncode == 0 and not failed and clean, self.explain()  # noqa: PT018
        return table


def _generic_strict(work: Path) -> tuple[list[str], list[str]]:
    kit, command = generic(work)
    return [*kit, "--strict", "--junit", str(work / "dra.xml")], command


def _example_quick(work: Path) -> tuple[list[str], list[str]]:
    kit, command = example()
    return [*kit, "--strict", "--quick"], command


def _gpu_strict(work: Path) -> tuple[list[str], list[str]]:
    kit, command = gpu(work)
    return [*kit, "--strict"], command


def _missing_node(work: Path) -> tuple[list[str], list[str]]:
    """The generic driver on a fake /dev without --host-root: its specs name /dev/kit0..,
    which this host lacks; a runtime would fail the container."""
    _kit, command = generic(work, devices=4)
    return ["--quick"], command


def _independent(work: Path) -> tuple[list[str], list[str]]:
    """A driver that shares no code with ours or with the kit (raw gRPC, its own HTTP), in a
    full run; its prepare knob slows it for the overlap case only."""
    return ["--strict", "--slow-env", f"{DELAY_ENV}=0.6"], kit_driver_cmd()


def _mutant(flag: str) -> Callable[[Path], tuple[list[str], list[str]]]:
    return lambda _work: (["--strict", "--quick"], kit_driver_cmd(flag))


#: Each run: its name -> (kit options, driver command) made in its own directory. The full
#: runs first (the longest).
PLANS: dict[str, Callable[[Path], tuple[list[str], list[str]]]] = {
    "generic": _generic_strict,
    "gpu": _gpu_strict,
    "independent": _independent,
    "example": _example_quick,
    "missing-node": _missing_node,
    **{flag: _mutant(flag) for flag in BREAK_FLAGS},
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, KitRun]:
    """Every run of the module, by name."""
    bin_dir = k8s_bin()

    # the directories first, here: pytest's temporary directories are not made thread-safely
    works = {name: tmp_path_factory.mktemp(name) for name in PLANS}

    def one(name: str) -> KitRun:
        kit, command = PLANS[name](works[name])
        log = works[name] / "driver.log"
        return KitRun(run_kit(bin_dir, kit, command, log), log, works[name])

    with ThreadPoolExecutor(PARALLEL) as pool:
        return dict(zip(PLANS, pool.map(one, PLANS), strict=True))


@RUNS_TIMEOUT
def test_generic_driver_passes_strict_with_junit(runs: dict[str, KitRun]) -> None:
    run = runs["generic"]
    table = run.clean()
    # every case ran but the one that needs --claim-config
    assert {k for k, (r, _) in table.items() if r == "SKIP"} == {
        "prepare-own-config",
        "deadline-overlap",
    }
    assert table["upgrade-side-by-side"][0] == "PASS"
    assert table["slices-quiet-list"][0] == "PASS"  # the audit log was read
    suite = ET.parse(run.work / "dra.xml").getroot().find("testsuite")
    assert suite is not None
    assert suite.get("tests") == str(len(DRA_CASES))
    assert suite.get("failures") == "0"
    assert "registered with the kubelet as DRA driver" in run.log.read_text()


@RUNS_TIMEOUT
def test_example_driver_passes_strict_quick(runs: dict[str, KitRun]) -> None:
    table = runs["example"].clean()
    assert table["prepare-own-config"][0] == "PASS"
    assert table["restart-same-answer"] == ("SKIP", "--quick")


@RUNS_TIMEOUT
def test_gpu_driver_passes_strict(runs: dict[str, KitRun]) -> None:
    table = runs["gpu"].clean()
    assert table["reboot-specs-back"][0] == "PASS"
    assert table["health-all-devices"][0] == "PASS"


@RUNS_TIMEOUT
def test_spec_naming_a_missing_device_node_fails_a_must_case(runs: dict[str, KitRun]) -> None:
    run = runs["missing-node"]
    assert run.proc.returncode == 1, run.explain()
    result, evidence = run.table["prepare-cdi-valid"]
    assert result == "FAIL", run.explain()
    assert "device node /dev/kit0 does not exist" in evidence
    assert "--- last lines of the driver output" in run.proc.stdout
    passed, failed, _ = summary(run.proc.stdout)
    assert failed >= 1
    assert passed > 40


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--kubeconfig", "/etc/hostname", "--k8s-bin", "/tmp"], "exclude each other"),
        (["--claim-config", "[1]"], "not a JSON object"),
        (["--env", "NOEQUALS"], "is not VAR=VALUE"),
    ],
)
def test_usage_errors_exit_2_with_one_line(args: list[str], needle: str) -> None:
    proc = subprocess.run(
        [KUBEDEVICE, "conformance", "--dra", *args, "--", "true"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert needle in proc.stderr
    assert "Traceback" not in proc.stderr


def test_no_api_server_is_one_line_exit_2(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    if "PYTHONPATH" in os.environ:
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    proc = subprocess.run(
        [KUBEDEVICE, "conformance", "--dra", "--", "true"],
        capture_output=True, text=True, timeout=60, check=False, env=env,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip().startswith("error: no kubeconfig"), proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


@RUNS_TIMEOUT
def test_independent_kit_driver_passes_strict_slowed_for_the_overlap(
    runs: dict[str, KitRun],
) -> None:
    table = runs["independent"].clean()
    result, evidence = table["deadline-overlap"]
    assert result == "PASS", evidence
    assert table["cost-prepare-latency"][1].startswith("p50 ")
    assert table["restart-same-answer"][0] == "PASS"


@RUNS_TIMEOUT
@pytest.mark.parametrize(
    ("flag", "case"),
    [("list-resync", "slices-quiet-list"), ("unprepare-unknown-error", "unprepare-unknown")],
)
def test_kit_driver_mutant_fails_its_case(runs: dict[str, KitRun], flag: str, case: str) -> None:
    run = runs[flag]
    assert run.table[case][0] == "FAIL", run.explain()
    assert run.proc.returncode == 1, run.explain()


def test_every_kit_driver_flag_is_tested() -> None:
    assert set(BREAK_FLAGS) == {"list-resync", "unprepare-unknown-error"}

"""The DRA conformance kit against a small driver and its deliberately broken variants.

``dra_mutants/driver.py`` is a small driver on ``kubedevice.dra`` and, one flag away, each of
its mutants: one bug class each, with the case that must catch it. The unbroken driver must
pass every MUST case; each mutant must fail the kit, on its own case (matched by case ID in
the kit's JUnit XML). Every run is the real ``kubedevice conformance --dra`` process
starting the real driver process, all against one real API server (each run makes its own
Node, namespace and DeviceClass), a few runs at a time.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from dra.conftest import REPO, api_server
from e2e.cluster import HOW_TO_GET, find_binaries

from .dra_mutants.driver import MUTANTS

DRIVER = Path(__file__).parent / "dra_mutants" / "driver.py"
#: The mutants whose case runs only in a full run (restarts and the reboot are not --quick).
FULL = {"reboot-no-spec"}
#: Runs at a time (each is the kit, the driver and their API calls on a 2-core machine).
PARALLEL = 3

pytestmark = pytest.mark.skipif(
    not (REPO / "src/kubedevice/conformance/dra/runner.py").is_file(),
    reason="the DRA conformance kit (issue 30) is not in this tree yet",
)


@dataclass(frozen=True)
class Run:
    """One kit run: its exit status, and each case's outcome (PASS, FAIL, SKIP) and text."""

    returncode: int
    cases: dict[str, tuple[str, str]]
    output: str

    def failed(self, level: str | None = None) -> list[str]:
        """The IDs of the failed cases (of ``level`` only, when given)."""
        return [
            case
            for case, (outcome, text) in self.cases.items()
            if outcome == "FAIL" and (level is None or text.startswith(level))
        ]

    def explain(self) -> str:
        """For an assertion: the exit status, each failed case (from the JUnit XML) with its
        evidence, and the run's last lines (the driver log's tail among them)."""
        failed = [f"FAIL {case}: {text}" for case, (o, text) in self.cases.items() if o == "FAIL"]
        return "\n".join([
            f"kit exit status {self.returncode}; {len(failed)} failed cases:", *failed,
            "--- the run's last 40 lines:", *self.output.splitlines()[-40:],
        ])  # fmt: skip


def _junit(path: Path) -> dict[str, tuple[str, str]]:
    cases: dict[str, tuple[str, str]] = {}
    if not path.is_file():
        return cases
    for case in ET.parse(path).getroot().iter("testcase"):
        failure, skipped = case.find("failure"), case.find("skipped")
        if failure is not None:
            cases[case.attrib["name"]] = ("FAIL", failure.text or "")
        elif skipped is not None:
            cases[case.attrib["name"]] = ("SKIP", skipped.get("message", ""))
        else:
            cases[case.attrib["name"]] = ("PASS", "")
    return cases


def _kit(kubeconfig: Path, junit: Path, log: Path, driver_args: Sequence[str], *,
         quick: bool) -> list[str]:  # fmt: skip
    return [
        sys.executable, "-m", "kubedevice", "conformance", "--dra", "--strict",
        "--kubeconfig", str(kubeconfig), "--timeout", "5", "--junit", str(junit),
        "--log", str(log), *(["--quick"] if quick else []),
        "--", sys.executable, str(DRIVER), *driver_args,
        "--node-name", "{node}", "--kubeconfig", "{kubeconfig}",
        "--kubelet-dir", "{kubelet_dir}", "--cdi-dir", "{cdi_dir}",
    ]  # fmt: skip


async def _run_all(kubeconfig: Path, work: Path) -> dict[str, Run]:
    gate = asyncio.Semaphore(PARALLEL)
    path = [str(REPO / "src"), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}

    async def one(name: str) -> Run:
        # each mutant under a driver name of its own: runs side by side on one API server
        # never see another run's slices as their driver's
        args = (
            ["--pod-uid", "{pod_uid}"]
            if name == "good"
            else ["--mutant", name, "--driver-name", f"{name}.example.com"]
        )
        quick = name not in FULL and name != "good"
        junit, log = work / f"{name}.xml", work / f"{name}.log"
        async with gate:
            proc = await asyncio.create_subprocess_exec(
                *_kit(kubeconfig, junit, log, args, quick=quick),
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                env=env,
            )
            out, _ = await proc.communicate()
        return Run(proc.returncode or 0, _junit(junit), out.decode(errors="replace"))

    names = ["good", *MUTANTS]
    runs = await asyncio.gather(*(one(name) for name in names))
    return dict(zip(names, runs, strict=True))


@pytest.fixture(scope="module")
def runs() -> Iterator[dict[str, Run]]:
    """Every run's result, by mutant name ("good": the unbroken driver)."""
    bin_dir = find_binaries(REPO)
    if bin_dir is None:
        if os.environ.get("CI"):
            pytest.fail(f"CI is set: {HOW_TO_GET}", pytrace=False)
        pytest.skip(HOW_TO_GET)
    work = Path(tempfile.mkdtemp(prefix="kd-mutants-", dir="/tmp"))
    try:
        with api_server(bin_dir) as kubeconfig:
            yield asyncio.run(_run_all(kubeconfig, work))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_at_least_twelve_mutants_each_meant_for_a_case() -> None:
    from kubedevice.conformance.dra.catalogue import DRA_CASES_BY_ID

    assert len(MUTANTS) >= 12
    unknown = {name: m.case for name, m in MUTANTS.items() if m.case not in DRA_CASES_BY_ID}
    assert not unknown, f"mutants meant for cases the kit does not have: {unknown}"


def test_the_docs_list_every_mutant_with_its_case() -> None:
    doc = (REPO / "docs/conformance.md").read_text()
    missing = [
        n for n, m in MUTANTS.items() if f"| `{n}` |" not in doc or f"`{m.case}` |" not in doc
    ]
    assert not missing, f"docs/conformance.md's mutation set table lacks {missing}"


@pytest.mark.timeout(600)
def test_the_unbroken_driver_passes_every_must_case(runs: dict[str, Run]) -> None:
    good = runs["good"]
    assert good.cases, good.explain()
    assert not good.failed("MUST"), good.explain()
    assert good.cases["prepare-basic"][0] == "PASS"
    assert good.cases["upgrade-side-by-side"][0] == "PASS"  # a full run, with {pod_uid}
    for name, mutant in MUTANTS.items():  # the case of every mutant can pass
        assert good.cases[mutant.case][0] == "PASS", (name, good.cases[mutant.case])


@pytest.mark.timeout(600)  # whichever test comes first makes every run (53 s on 2 cores)
@pytest.mark.parametrize("name", list(MUTANTS))
def test_each_mutant_fails_on_its_case(runs: dict[str, Run], name: str) -> None:
    run = runs[name]
    case = MUTANTS[name].case
    assert run.returncode == 1, run.explain()
    assert case in run.cases, run.explain()
    outcome, _evidence = run.cases[case]
    assert outcome == "FAIL", f"{name} ({MUTANTS[name].bug}): {case} {outcome}\n{run.explain()}"

"""The whole kit against the independent fixture plugin: good mode passes, each flag fails.

Each broken mode breaks exactly one rule, and the case that enforces it must fail: this
proves every case can fail. The runs are independent processes with their own emulator
and directory, so they run concurrently (a few at a time) in one module-scoped fixture.
"""

from __future__ import annotations

import asyncio
import shutil
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from kubedevice.conformance import Level, Outcome, Report, check_plugin, run_conformance

from .plugins import fixture_cmd

#: flag -> the case it must fail.
BROKEN: dict[str, str] = {
    "--register-before-serve": "serves-before-register",
    "--bad-version": "registration-valid",
    "--absolute-endpoint": "registration-valid",
    "--no-first-list": "first-list-within-5s",
    "--duplicate-ids": "device-list-valid",
    "--lowercase-health": "device-list-valid",
    "--lying-options": "options-honest",
    "--empty-allocate-response": "allocate-healthy",
    "--bad-device-spec": "allocate-healthy",
    "--accept-unknown-ids": "allocate-unknown-refused",
    "--accept-unhealthy-ids": "allocate-unhealthy-refused",
    "--bad-preferred": "preferred-allocation",
    "--die-on-stream-kill": "survives-stream-kill",
    "--no-stream-recovery": "recovers-after-stream-kill",
    "--no-reregister": "reregister-within-30s",
    "--slow-reregister": "reregister-within-1s",
    "--ignore-sigterm": "sigterm-clean-exit",
    "--leave-socket": "sigterm-clean-exit",
    "--raising-preferred": "preferred-allocation",
    "--orphan-child": "sigterm-clean-exit",
    "--setsid-child": "sigterm-clean-exit",
}

MULTI = ("--resource", "example.com/a", "--resource", "example.com/b")
RUNS: dict[str, Sequence[str]] = {
    "good": (),
    "multi": MULTI,
    "all-healthy-no-options": ("--unhealthy", "0", "--no-gpa", "--no-prestart"),
    **{flag: (flag,) for flag in BROKEN},
}


async def _run_all(logs: Path) -> dict[str, Report]:
    gate = asyncio.Semaphore(4)

    async def one(name: str, flags: Sequence[str]) -> Report:
        async with gate:
            # timeout caps the waits that only a broken plugin reaches; startup stays generous.
            return await run_conformance(
                fixture_cmd(*flags),
                timeout=3.0,
                startup_timeout=30.0,
                log_path=logs / f"{name.strip('-')}.log",
            )

    reports = await asyncio.gather(*(one(name, flags) for name, flags in RUNS.items()))
    return dict(zip(RUNS, reports, strict=True))


@pytest.fixture(scope="module")
def reports() -> Iterator[dict[str, Report]]:
    logs = Path(tempfile.mkdtemp(prefix="kd-conf-logs-", dir="/tmp"))
    try:
        yield asyncio.run(_run_all(logs))
    finally:
        shutil.rmtree(logs, ignore_errors=True)


def _explain(report: Report) -> str:
    return report.format_table() + "\n--- plugin log ---\n" + report.log_tail(30)


def test_good_plugin_passes_every_case(reports: dict[str, Report]) -> None:
    rep = reports["good"]
    assert (rep.failed, rep.skipped) == (0, 0), _explain(rep)
    assert rep.resources == ("example.com/fixture",)
    assert rep.ok(strict=True)
    assert rep.passed == len(rep.results) == 14


def test_every_resource_is_checked(reports: dict[str, Report]) -> None:
    rep = reports["multi"]
    assert (rep.failed, rep.skipped) == (0, 0), _explain(rep)
    assert set(rep.resources) == {"example.com/a", "example.com/b"}
    per_resource = [r for r in rep.results if r.resource == "example.com/b"]
    assert len(per_resource) == 13
    assert rep.passed == 27


def test_cases_without_input_are_skipped_not_passed(reports: dict[str, Report]) -> None:
    rep = reports["all-healthy-no-options"]
    assert rep.failed == 0, _explain(rep)
    skipped = {r.case.id for r in rep.results if r.outcome is Outcome.SKIP}
    assert skipped == {"allocate-unhealthy-refused", "preferred-allocation"}
    assert "no optional RPC advertised" in rep.get("options-honest").evidence
    # The fixture logs any call of an RPC it did not advertise; the kit must make none.
    assert "UNADVERTISED RPC CALLED" not in rep.log_path.read_text()
    assert "registered" in rep.log_path.read_text()


def test_plugin_that_exits_at_once_fails_registration(tmp_path: Path) -> None:
    cmd = [sys.executable, "-c", "import sys; print('no kubelet for me'); sys.exit(3)"]
    rep = check_plugin(cmd, timeout=5.0, log_path=tmp_path / "plugin.log")
    reg = rep.get("registration-valid")
    assert reg.outcome is Outcome.FAIL
    assert reg.evidence == "plugin process exited with code 3 before registering"
    assert not rep.ok()
    assert rep.failed == 1
    assert rep.skipped == len(rep.results) - 1
    assert rep.log_tail() == "no kubelet for me\n"


def test_plugin_that_never_registers_is_stopped_after_the_startup_timeout(
    tmp_path: Path,
) -> None:
    cmd = [sys.executable, "-c", "import signal; signal.pause()"]
    rep = check_plugin(cmd, timeout=5.0, startup_timeout=0.5, log_path=tmp_path / "plugin.log")
    assert rep.get("registration-valid").evidence.startswith("no Register call within 500 ms")
    assert rep.duration_s < 5.0


@pytest.mark.parametrize(("flag", "case_id"), BROKEN.items(), ids=list(BROKEN))
def test_broken_fixture_fails_its_case(reports: dict[str, Report], flag: str, case_id: str) -> None:
    rep = reports[flag]
    result = rep.get(case_id)
    assert result.outcome is Outcome.FAIL, _explain(rep)
    assert result.evidence  # one specific line
    if result.level is Level.MUST:
        assert not rep.ok()
    else:
        assert not rep.ok(strict=True)


def test_hook_error_named_in_the_evidence(reports: dict[str, Report]) -> None:
    result = reports["--raising-preferred"].get("preferred-allocation")
    assert "logged an error" in result.evidence
    assert "preferred_allocation hook failed" in result.evidence


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")  # exited (a zombie until its new parent reaps it)


@pytest.mark.parametrize("flag", ["--orphan-child", "--setsid-child"])
def test_orphaned_child_killed_and_reported(reports: dict[str, Report], flag: str) -> None:
    rep = reports[flag]
    result = rep.get("sigterm-clean-exit")
    lines = [x for x in rep.log_path.read_text().splitlines() if "CHILD " in x]
    assert lines, _explain(rep)
    pid = int(lines[0].rsplit(" ", 1)[1])
    assert f"left 1 process(es) it started running (pid {pid} (python" in result.evidence, (
        result.evidence
    )
    assert _gone(pid)


BUFFERED = """
import signal, sys, time
out = open(1, "w", buffering=1 << 16)  # block-buffered, as C's stdio is into a file
def stop(*_):
    out.write("got SIGTERM, exiting\\n")
    sys.exit(0)  # flushes what is buffered
signal.signal(signal.SIGTERM, stop)
out.write("started, never registering\\n")
while True:
    time.sleep(60)
"""


def test_the_log_keeps_what_a_plugin_flushes_when_the_run_ends(tmp_path: Path) -> None:
    """At the end of a run the plugin gets SIGTERM first, so buffered lines reach the log."""
    rep = check_plugin(
        [sys.executable, "-c", BUFFERED],
        timeout=5.0,
        startup_timeout=0.5,
        log_path=tmp_path / "plugin.log",
    )
    assert rep.get("registration-valid").outcome is Outcome.FAIL
    assert rep.log_tail() == "started, never registering\ngot SIGTERM, exiting\n"

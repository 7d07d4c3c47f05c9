"""The SDK's example plugin through the kit, as a user would run it (a real subprocess)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kubedevice.conformance import Outcome, check_plugin

from .plugins import SDK_REPAIRED

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "minimal.py"
KUBEDEVICE = Path(sys.executable).with_name("kubedevice")


def test_minimal_example_passes_the_kit(sock_dir: Path) -> None:
    proc = subprocess.run(
        [
            str(KUBEDEVICE),
            "conformance",
            "--log",
            str(sock_dir / "minimal.log"),
            "--timeout",
            "10",
            "--",
            sys.executable,
            str(EXAMPLE),
            "--device-plugin-dir",
            "{dir}",
        ],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
        cwd=ROOT,
    )
    # Exit 0 = no MUST failure. SHOULD cases (e.g. re-registering within 1 s) are not
    # asserted here: they depend on the SDK's timing on a loaded machine.
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "(0 MUST and" in proc.stdout
    assert "PASS    MUST    reregister-within-30s[example.com/counter]" in proc.stdout


@pytest.mark.parametrize("answer", ["unoffered", "drop-must"])
def test_a_preferred_answer_the_sdk_repaired_fails(sock_dir: Path, answer: str) -> None:
    """The SDK repairs the hook's answer into a valid one; the kit must still see it."""
    rep = check_plugin(
        [sys.executable, str(SDK_REPAIRED), "--device-plugin-dir", "{dir}", "--answer", answer],
        timeout=10.0,
        log_path=sock_dir / "repaired.log",
    )
    result = rep.get("preferred-allocation")
    assert result.outcome is Outcome.FAIL, rep.format_table()
    assert "its answer was repaired" in result.evidence
    assert "is invalid" in result.evidence
    others = {r.case.id for r in rep.failures()} - {"preferred-allocation", "reregister-within-1s"}
    assert not others, rep.format_table()


def test_plain_hooks_example_passes_the_kit(sock_dir: Path) -> None:
    """Plain def hooks, a pushed list and an Unhealthy device, through every case."""
    rep = check_plugin(
        [sys.executable, str(ROOT / "examples" / "plain_hooks.py"), "--device-plugin-dir", "{dir}"],
        timeout=10.0,
        log_path=sock_dir / "plain.log",
    )
    assert rep.ok(), rep.format_table()
    for case in ("allocate-healthy", "allocate-unhealthy-refused", "preferred-allocation"):
        assert rep.get(case).outcome is Outcome.PASS, rep.format_table()
    assert "calibrating sensor-0" in rep.log_path.read_text()  # the plain pre_start hook ran

"""``kubedevice conformance`` as a real subprocess: exit codes, summary, JUnit, --strict."""

from __future__ import annotations

import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from .plugins import fixture_cmd

KUBEDEVICE = Path(sys.executable).with_name("kubedevice")
SUMMARY = re.compile(r"^(\d+) passed, (\d+) failed, (\d+) skipped", re.MULTILINE)


def _run(*args: str, log: Path | None = None) -> subprocess.CompletedProcess[str]:
    log_args = ["--log", str(log)] if log is not None else []
    return subprocess.run(
        [str(KUBEDEVICE), "conformance", *log_args, *args],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )


def _summary(out: str) -> tuple[int, int, int]:
    m = SUMMARY.search(out)
    assert m is not None, out
    return int(m[1]), int(m[2]), int(m[3])


def test_good_plugin_exits_0_and_writes_valid_junit(sock_dir: Path) -> None:
    junit = sock_dir / "report.xml"
    proc = _run(
        "--timeout", "10", "--junit", str(junit), "--", *fixture_cmd(), log=sock_dir / "p.log"
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _summary(proc.stdout) == (14, 0, 0)
    assert proc.stdout.splitlines()[0] == f"plugin output: {sock_dir / 'p.log'}"
    assert "fixture: example.com/fixture: registered" in (sock_dir / "p.log").read_text()
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None
    cases = suite.findall("testcase")
    assert len(cases) == 14
    assert suite.get("failures") == "0"
    levels = {
        p.get("value")
        for c in cases
        for p in c.iterfind("properties/property")
        if p.get("name") == "level"
    }
    assert levels == {"MUST", "SHOULD"}


def test_must_failure_exits_1_and_shows_the_plugin_log(sock_dir: Path) -> None:
    proc = _run("--timeout", "10", "--", *fixture_cmd("--bad-device-spec"), log=sock_dir / "p.log")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert _summary(proc.stdout)[1] >= 1
    assert re.search(r"^FAIL\s+MUST\s+allocate-healthy\[", proc.stdout, re.MULTILINE)
    assert "last lines of the plugin output" in proc.stdout
    assert "fixture: example.com/fixture: registered" in proc.stdout


@pytest.mark.parametrize(("strict", "code"), [(False, 0), (True, 1)], ids=["lenient", "strict"])
def test_should_failure_fails_only_with_strict(sock_dir: Path, strict: bool, code: int) -> None:
    flags = ["--strict"] if strict else []
    cmd = fixture_cmd("--accept-unknown-ids")
    proc = _run("--timeout", "10", *flags, "--", *cmd, log=sock_dir / "p.log")
    assert proc.returncode == code, proc.stdout + proc.stderr
    assert _summary(proc.stdout) == (13, 1, 0)
    assert re.search(r"^FAIL\s+SHOULD\s+allocate-unknown-refused\[", proc.stdout, re.MULTILINE)


def test_usage_errors_exit_2(sock_dir: Path) -> None:
    proc = _run()
    assert proc.returncode == 2
    assert "no plugin COMMAND" in proc.stderr
    proc = _run("--", str(sock_dir / "no-such-plugin"), log=sock_dir / "p.log")
    assert proc.returncode == 2
    assert "cannot start plugin command" in proc.stderr


def test_misspelt_option_is_a_usage_error_not_the_command(sock_dir: Path) -> None:
    proc = _run("--timout", "5", "--", *fixture_cmd(), log=sock_dir / "p.log")
    assert proc.returncode == 2
    assert "No such option '--timout'" in proc.stderr


def test_command_options_after_the_command_need_no_separator(sock_dir: Path) -> None:
    # Everything after the first word of COMMAND belongs to the plugin, even without `--`.
    cmd = fixture_cmd("--accept-unknown-ids")
    proc = _run("--timeout", "10", *cmd, log=sock_dir / "p.log")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"^FAIL\s+SHOULD\s+allocate-unknown-refused\[", proc.stdout, re.MULTILINE)

"""``kubedevice conformance --dra`` as a real process, with its own real API server, against
our DRA drivers (real processes, real sockets), and what it says of a broken one."""

from __future__ import annotations

import os
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from kubedevice.conformance.dra import DRA_CASES

from .dra_drivers import KUBEDEVICE, example, generic, gpu, k8s_bin, rows, run_kit, summary
from .plugins import kit_driver_cmd
from .plugins.kit_driver import BREAK_FLAGS, DELAY_ENV

pytestmark = pytest.mark.timeout(300)


def _clean(proc: subprocess.CompletedProcess[str]) -> dict[str, tuple[str, str]]:
    out = proc.stdout + proc.stderr
    failed = [line for line in proc.stdout.splitlines() if line.startswith("FAIL")]
    assert proc.returncode == 0, "\n".join(failed) or out
    assert "Traceback" not in out, out
    table = rows(proc.stdout)
    assert len(table) == len(DRA_CASES), out
    assert not failed, "\n".join(failed)
    return table


def test_generic_driver_passes_strict_with_junit(tmp_path: Path) -> None:
    bin_dir = k8s_bin()
    kit, command = generic(tmp_path)
    junit = tmp_path / "dra.xml"
    proc = run_kit(bin_dir, [*kit, "--strict", "--junit", str(junit)], command,
                   tmp_path / "driver.log")  # fmt: skip
    table = _clean(proc)
    # every case ran but the one that needs --claim-config
    assert {k for k, (r, _) in table.items() if r == "SKIP"} == {
        "prepare-own-config",
        "deadline-overlap",
    }
    assert table["upgrade-side-by-side"][0] == "PASS"
    assert table["slices-quiet-list"][0] == "PASS"  # the audit log was read
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None
    assert suite.get("tests") == str(len(DRA_CASES))
    assert suite.get("failures") == "0"
    assert "registered with the kubelet as DRA driver" in (tmp_path / "driver.log").read_text()


def test_example_driver_passes_strict_quick(tmp_path: Path) -> None:
    bin_dir = k8s_bin()
    kit, command = example()
    proc = run_kit(bin_dir, [*kit, "--strict", "--quick"], command, tmp_path / "driver.log")
    table = _clean(proc)
    assert table["prepare-own-config"][0] == "PASS"
    assert table["restart-same-answer"] == ("SKIP", "--quick")


def test_gpu_driver_passes_strict(tmp_path: Path) -> None:
    bin_dir = k8s_bin()
    kit, command = gpu(tmp_path)
    proc = run_kit(bin_dir, [*kit, "--strict"], command, tmp_path / "driver.log")
    table = _clean(proc)
    assert table["reboot-specs-back"][0] == "PASS"
    assert table["health-all-devices"][0] == "PASS"


def test_spec_naming_a_missing_device_node_fails_a_must_case(tmp_path: Path) -> None:
    """The generic driver on a fake /dev without --host-root: its specs name /dev/kit0..,
    which this host lacks; a runtime would fail the container."""
    bin_dir = k8s_bin()
    _kit, command = generic(tmp_path, devices=4)
    proc = run_kit(bin_dir, ["--quick"], command, tmp_path / "driver.log")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    table = rows(proc.stdout)
    result, evidence = table["prepare-cdi-valid"]
    assert result == "FAIL"
    assert "device node /dev/kit0 does not exist" in evidence
    assert "--- last lines of the driver output" in proc.stdout
    passed, failed, _ = summary(proc.stdout)
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


def test_independent_kit_driver_passes_strict_slowed_for_the_overlap(tmp_path: Path) -> None:
    """A driver that shares no code with ours or with the kit (raw gRPC, its own HTTP), in a
    full run; its prepare knob slows it for the overlap case only."""
    kit = ["--strict", "--slow-env", f"{DELAY_ENV}=0.6"]
    table = _clean(run_kit(k8s_bin(), kit, kit_driver_cmd(), tmp_path / "d.log"))
    result, evidence = table["deadline-overlap"]
    assert result == "PASS", evidence
    assert table["cost-prepare-latency"][1].startswith("p50 ")
    assert table["restart-same-answer"][0] == "PASS"


@pytest.mark.parametrize(
    ("flag", "case"),
    [("list-resync", "slices-quiet-list"), ("unprepare-unknown-error", "unprepare-unknown")],
)
def test_kit_driver_mutant_fails_its_case(tmp_path: Path, flag: str, case: str) -> None:
    proc = run_kit(k8s_bin(), ["--strict", "--quick"], kit_driver_cmd(flag), tmp_path / "d.log")
    assert rows(proc.stdout)[case][0] == "FAIL", proc.stdout + proc.stderr
    assert proc.returncode == 1


def test_every_kit_driver_flag_is_tested() -> None:
    assert set(BREAK_FLAGS) == {"list-resync", "unprepare-unknown-error"}

"""The end-to-end tier's gate: without the Kubernetes binaries it fails when ``CI`` is set and
is skipped with one line saying how to get them elsewhere (never a silent pass)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TIER_FILE = "tests/e2e/test_register.py"  # any tier file: two tests that need the cluster
PYTEST = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", TIER_FILE]


def _env(tmp_path: Path, *, ci: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "PYTEST_ADDOPTS")}
    env["KUBEDEVICE_K8S_BIN"] = str(tmp_path / "no-binaries-here")
    if ci:
        env["CI"] = "1"
    return env


def _run(argv: list[str], env: dict[str, str]) -> tuple[int, str]:
    run = subprocess.run(
        argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    return run.returncode, run.stdout + run.stderr


def _needs_root_and_unshare() -> None:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare (the tier's own conditions)")
    probe = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "true"], capture_output=True, check=False
    )
    if probe.returncode != 0:
        pytest.skip("unshare -m does not work here")


def test_ci_without_binaries_fails_naming_what_is_missing(tmp_path: Path) -> None:
    _needs_root_and_unshare()
    rc, out = _run(PYTEST, _env(tmp_path, ci=True))
    assert rc == 1, out
    assert "2 errors" in out, out
    assert "CI is set: no Kubernetes binaries: set KUBEDEVICE_K8S_BIN" in out, out
    assert "passed" not in out, out


def test_without_ci_and_binaries_the_tier_is_skipped_with_how_to_get_them(tmp_path: Path) -> None:
    """In the private mount namespace ``scripts/e2e`` uses (so the only reason left is the
    missing binaries), each test is skipped with the line that says where to get them."""
    _needs_root_and_unshare()
    dp = "/var/lib/kubelet/device-plugins"
    script = 'mkdir -p "$1" && mount -t tmpfs -o mode=0755 tmpfs "$1" && shift && exec "$@"'
    argv = ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", dp, *PYTEST]
    rc, out = _run(argv, _env(tmp_path, ci=False))
    assert rc == 0, out
    assert "2 skipped" in out, out
    [line] = [ln for ln in out.splitlines() if ln.startswith("SKIPPED")]
    assert "no Kubernetes binaries: set KUBEDEVICE_K8S_BIN" in line, out
    assert "upstream v1.34+" in line, out


RUNTIME_FILE = "tests/e2e/test_containerd_plugins.py"  # two tests marked containerd


def _runtime_env(tmp_path: Path, *, ci: bool) -> dict[str, str]:
    """The Kubernetes binaries as found here, the container runtime missing."""
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "PYTEST_ADDOPTS")}
    env["KUBEDEVICE_RUNTIME_DIR"] = str(tmp_path / "no-runtime-here")
    if ci:
        env["CI"] = "1"
    return env


def _in_namespace(argv: list[str]) -> list[str]:
    dp = "/var/lib/kubelet/device-plugins"
    script = 'mkdir -p "$1" && mount -t tmpfs -o mode=0755 tmpfs "$1" && shift && exec "$@"'
    return ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", dp, *argv]


def _needs_binaries() -> None:
    sys.path.insert(0, str(ROOT / "tests"))
    from e2e.cluster import find_binaries

    if find_binaries(ROOT) is None:
        pytest.skip("needs the Kubernetes binaries (only the runtime is taken away here)")


def test_without_the_runtime_the_containerd_tests_are_skipped_saying_so(tmp_path: Path) -> None:
    _needs_root_and_unshare()
    _needs_binaries()
    argv = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", RUNTIME_FILE]
    rc, out = _run(_in_namespace(argv), _runtime_env(tmp_path, ci=False))
    assert rc == 0, out
    assert "2 skipped" in out, out
    lines = [ln for ln in out.splitlines() if ln.startswith("SKIPPED")]
    assert len(lines) == 1, out  # one line for both
    assert "no container runtime: set KUBEDEVICE_RUNTIME_DIR" in lines[0], out


def test_ci_without_the_runtime_fails_the_containerd_tests_saying_so(tmp_path: Path) -> None:
    _needs_root_and_unshare()
    _needs_binaries()
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", RUNTIME_FILE]
    rc, out = _run(_in_namespace(argv), _runtime_env(tmp_path, ci=True))
    assert rc == 1, out
    assert "2 errors" in out, out
    assert "CI is set: no container runtime: set KUBEDEVICE_RUNTIME_DIR" in out, out
    assert "passed" not in out, out

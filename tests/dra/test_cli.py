"""The DRA commands as real processes against a real API server: one kubeconfig order
everywhere, ``--cleanup`` without a config file, flags that mean nothing refused, the
documented ``argument_parser() -> options_from_args() -> run()`` path without tracebacks."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dra.api import RESOURCE, Api

pytestmark = pytest.mark.timeout(120)

KUBEDEVICE = str(Path(sys.executable).parent / "kubedevice")


def _env(home: Path, **extra: str) -> dict[str, str]:
    """A clean environment: no $KUBECONFIG, an empty home, not a pod (unless ``extra``)."""
    home.mkdir(exist_ok=True)
    keep = {k: os.environ[k] for k in ("PYTHONPATH",) if k in os.environ}
    return {"PATH": "/usr/bin:/bin", "HOME": str(home), **keep, **extra}


def _run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=90, env=env, check=False)


def _one_line(proc: subprocess.CompletedProcess[str], status: int, needle: str) -> None:
    assert proc.returncode == status, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert needle in lines[0], proc.stderr


def _slice(name: str, driver: str, node: str) -> dict[str, object]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "d-0"}],
        },
    }


@pytest.mark.parametrize("command", ["generic", "gpu"])
def test_cleanup_honours_kubeconfig_env_and_needs_no_config_file(
    tmp_path: Path, kubeconfig: Path, api: Api, node_name: str, command: str
) -> None:
    driver = f"{command}.cleanup.example.com"
    api.call("POST", f"{RESOURCE}/resourceslices", _slice(f"{node_name}-x", driver, node_name))
    gone = tmp_path / "deleted-with-the-release.yaml"  # the config is gone on uninstall
    argv = (
        [KUBEDEVICE, "run", "--dra", "--config", str(gone)]
        if command == "generic"
        else [KUBEDEVICE, "nvidia", "dra", "--config", str(gone)]
    )
    argv += ["--cleanup", "--driver-name", driver, "--node-name", node_name,
             "--cdi-dir", str(tmp_path / "cdi")]  # fmt: skip
    # no --kubeconfig: $KUBECONFIG names the API server (kubectl's order)
    proc = _run(argv, _env(tmp_path / "home", KUBECONFIG=str(kubeconfig)))
    assert proc.returncode == 0, proc.stderr
    assert "removed 1 ResourceSlice(s)" in proc.stdout
    assert api.slices(driver, node_name) == []


def test_serving_honours_kubeconfig_env(
    tmp_path: Path, kubeconfig: Path, api: Api, node_name: str
) -> None:
    from kubedevice.generic import FakeHost

    host = FakeHost(tmp_path / "host")
    host.add_char_device("/dev/e2e0")
    config = tmp_path / "config.yaml"
    config.write_text(
        "version: v1\nresources:\n  - name: example.com/e2e\n    groups:\n"
        "      - name: e2e\n        paths:\n          - path: /dev/e2e*\n"
    )
    kdir = Path(os.path.realpath(tmp_path)) / "k"
    (kdir / "plugins_registry").mkdir(parents=True)
    proc = subprocess.Popen(
        [KUBEDEVICE, "run", "--dra", "--config", str(config), "--dev-root", str(host.dev_root),
         "--sys-root", str(host.sys_root), "--node-name", node_name,
         "--driver-name", "env.example.com", "--kubelet-dir", str(kdir),
         "--cdi-dir", str(tmp_path / "cdi")],
        env=_env(tmp_path / "home", KUBECONFIG=str(kubeconfig)),
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        api.wait_for_slices("env.example.com", node_name, 1, timeout=60)
    finally:
        proc.terminate()
        _out, err = proc.communicate(timeout=30)
        print(err)
    assert proc.returncode == 0, err
    assert "in-cluster" not in err


def test_the_device_plugin_dir_is_refused_with_dra(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("version: v1\nresources: []\n")
    proc = _run(
        [KUBEDEVICE, "run", "--dra", "--config", str(config), "--node-name", "n",
         "--device-plugin-dir", "/tmp/dp"],
        _env(tmp_path / "home"),
    )  # fmt: skip
    _one_line(proc, 2, "--device-plugin-dir means nothing for a DRA driver")


@pytest.mark.parametrize(
    "argv",
    [["run", "--help"], ["nvidia", "dra", "--help"], ["advertise", "--help"]],
    ids=["run", "nvidia-dra", "advertise"],
)
def test_help_says_the_kubeconfig_order(tmp_path: Path, argv: list[str]) -> None:
    proc = _run([KUBEDEVICE, *argv], _env(tmp_path / "home"))
    assert proc.returncode == 0
    text = " ".join(proc.stdout.split())
    assert "$KUBECONFIG, then ~/.kube/config, then the in-cluster service account" in text


def test_advertise_dry_run_needs_no_kubeconfig(tmp_path: Path) -> None:
    proc = _run(
        [KUBEDEVICE, "advertise", "--dry-run", "node-1", "example.com/x=2"],
        _env(tmp_path / "home"),
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("PATCH https://<api-server>/api/v1/nodes/node-1/status\n")
    assert '"value": "2"' in proc.stdout


AUTHOR_SCRIPT = textwrap.dedent("""\
    import sys
    sys.path.insert(0, {examples!r})
    import kubedevice.dra as dra
    from dra_minimal import Counters

    parser = dra.argument_parser("A driver with a flag of its own.")
    parser.add_argument("--greeting", default="hello")
    args = parser.parse_args()
    raise SystemExit(dra.run(Counters(), dra.options_from_args(args)))
    """)


@pytest.mark.parametrize(
    ("args", "status", "needle"),
    [
        (["--node-name", "n", "--driver-name", "Bad_Name"], 2, "driver name 'Bad_Name'"),
        (["--node-name", "n"], 2, "no kubeconfig: give --kubeconfig or set $KUBECONFIG"),
        (["--node-name", "n", "--api-timeout", "soon"], 2, "argument --api-timeout"),
        (["--node-name", "n", "--log-level", "loud"], 2, "argument --log-level"),
    ],
    ids=["bad-name", "no-kubeconfig", "bad-timeout", "bad-log-level"],
)
def test_the_documented_author_path_is_one_line_and_exit_2(
    tmp_path: Path, args: list[str], status: int, needle: str
) -> None:
    from dra.conftest import REPO

    script = tmp_path / "driver.py"
    script.write_text(AUTHOR_SCRIPT.format(examples=str(REPO / "examples")))
    kdir = tmp_path / "k"
    proc = _run(
        [sys.executable, str(script), "--kubelet-dir", str(kdir), "--cdi-dir", str(kdir), *args],
        _env(tmp_path / "home"),
    )
    assert proc.returncode == status, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert needle in proc.stderr
    lines = proc.stderr.strip().splitlines()
    if needle.startswith("argument"):  # argparse: its usage, then one error line
        assert lines[0].startswith("usage:")
        assert sum(": error:" in line for line in lines) == 1
    else:
        assert len(lines) == 1, lines

"""``kubedevice nvidia dra`` and ``kubedevice run --dra`` as real processes: bad input is one
line and the right exit status, never a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

KUBEDEVICE = str(Path(sys.executable).parent / "kubedevice")
#: A kubeconfig naming an API server nobody serves.
UNREACHABLE = """\
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [KUBEDEVICE, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={"PATH": "/usr/bin:/bin", **(env or {})},
    )


def _one_line_error(proc: subprocess.CompletedProcess[str], status: int, needle: str) -> None:
    assert proc.returncode == status, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr
    assert needle in errors[0], proc.stderr


def test_gpu_driver_without_a_node_name(tmp_path: Path) -> None:
    proc = _run(
        "nvidia", "dra", "--nvml", "fake:pcie-4gpu", "--kubelet-dir", str(tmp_path),
        "--kubeconfig", str(tmp_path / "none"),
    )  # fmt: skip
    _one_line_error(proc, 2, "NODE_NAME")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--driver-name", "Not_A_Driver"], "driver name 'Not_A_Driver'"),
        (["--nvml", "bogus"], "nvml: 'bogus'"),
        (["--nvml", "fake:no-driver"], "DriverNotLoaded"),
        (["--evict-on", "xid="], "--evict-on 'xid='"),
        (["--metrics-address", "nope"], "HOST:PORT"),
    ],
    ids=["driver-name", "nvml-spec", "no-driver", "evict-on", "metrics-address"],
)
def test_gpu_driver_bad_options(tmp_path: Path, args: list[str], needle: str) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(UNREACHABLE)
    base = ["nvidia", "dra", "--nvml", "fake:pcie-4gpu", "--node-name", "node-1",
            "--kubelet-dir", str(tmp_path / "kubelet"), "--cdi-dir", str(tmp_path / "cdi"),
            "--kubeconfig", str(kubeconfig)]  # fmt: skip
    _one_line_error(_run(*base, *args), 2, needle)


def test_gpu_driver_bad_config_names_the_field(tmp_path: Path) -> None:
    config = tmp_path / "gpu.yaml"
    config.write_text("version: v1\nflags:\n  migStrategy: sometimes\n")
    proc = _run("nvidia", "dra", "--config", str(config), "--node-name", "n")
    _one_line_error(proc, 2, "flags.migStrategy")


def test_cleanup_without_an_api_server_exits_1(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(UNREACHABLE)
    proc = _run(
        "nvidia", "dra", "--nvml", "fake:pcie-4gpu", "--node-name", "node-1", "--cleanup",
        "--cdi-dir", str(tmp_path / "cdi"), "--kubeconfig", str(kubeconfig),
    )  # fmt: skip
    _one_line_error(proc, 1, "cleanup:")


def test_generic_driver_bad_config_names_the_field(tmp_path: Path) -> None:
    config = tmp_path / "devices.yaml"
    config.write_text("version: v1\nresources:\n  - name: example.com/x\n    groups: []\n")
    proc = _run("run", "--dra", "--config", str(config), "--node-name", "n")
    _one_line_error(proc, 2, "resources[0].groups")


def test_gpu_driver_bad_evict_on_in_its_config_names_the_field(tmp_path: Path) -> None:
    config = tmp_path / "gpu.yaml"
    config.write_text("version: v1\nhealth:\n  evictOn: [xid=7 9]\n")
    proc = _run("nvidia", "dra", "--config", str(config), "--node-name", "n")
    _one_line_error(proc, 2, "health.evictOn")


@pytest.mark.parametrize(
    ("config", "args", "needle"),
    [
        ("evictOn: [health check]\n", [], "evictOn"),
        ("", ["--evict-on", "=x"], "--evict-on '=x'"),
    ],
    ids=["config", "flag"],
)
def test_generic_driver_bad_evict_on(
    tmp_path: Path, config: str, args: list[str], needle: str
) -> None:
    path = tmp_path / "devices.yaml"
    path.write_text(
        "version: v1\nresources:\n  - name: example.com/x\n    groups:\n"
        "      - paths: [{path: /dev/x*}]\n" + config
    )
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(UNREACHABLE)
    proc = _run(
        "run", "--dra", "--config", str(path), "--node-name", "n", "--kubeconfig",
        str(kubeconfig), "--kubelet-dir", str(tmp_path / "k"), *args,
    )  # fmt: skip
    _one_line_error(proc, 2, needle)


#: Runs the command with ``pynvml`` standing for a node without NVIDIA's library (its
#: nvmlInit fails LibraryNotFound, its nvmlShutdown then fails Uninitialized, as the real
#: library's do).
_NO_LIBRARY = """\
import importlib.util, sys
spec = importlib.util.spec_from_file_location("stand_in_pynvml", sys.argv.pop(1))
mod = sys.modules["stand_in_pynvml"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
sys.modules["pynvml"] = mod.make_module([], init_error="LIBRARY_NOT_FOUND")
from kubedevice.cli.main import cli
cli(sys.argv[1:], prog_name="kubedevice")
"""


@pytest.mark.parametrize("command", ["dra", "run"])
def test_gpu_commands_without_nvidias_library_name_it(tmp_path: Path, command: str) -> None:
    """The real error, not the clean-up's (``nvmlShutdown: Uninitialized``)."""
    stand_in = Path(__file__).with_name("stand_in_pynvml.py")
    args = ["nvidia", command, "--nvml", "real", "--kubelet-dir", str(tmp_path / "k")]
    if command == "run":
        args = ["nvidia", "run", "--nvml", "real", "--device-plugin-dir", str(tmp_path / "dp")]
    else:
        args += ["--node-name", "n", "--cdi-dir", str(tmp_path / "cdi")]
    proc = subprocess.run(
        [sys.executable, "-c", _NO_LIBRARY, str(stand_in), *args],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    _one_line_error(proc, 2, "NVML LibraryNotFound: nvmlInit")
    assert "Uninitialized" not in proc.stderr

"""The ``kubedevice`` root command: every subcommand is listed and loads, lazily."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from kubedevice.cli.main import SUBCOMMANDS, cli


def test_every_listed_subcommand_resolves_to_its_command() -> None:
    for name, module in SUBCOMMANDS.items():
        commands = importlib.import_module(f"kubedevice.cli.{module}").COMMANDS
        assert name in {c.name for c in commands}, (name, module)
    result = CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0
    for name in SUBCOMMANDS:
        assert f"  {name}" in result.output


def test_unknown_subcommand_is_a_usage_error() -> None:
    result = CliRunner().invoke(cli, ["frobnicate"])
    assert result.exit_code == 2
    assert "No such command 'frobnicate'" in result.output


def test_plugin_daemon_does_not_load_the_kubelet_side() -> None:
    code = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from kubedevice.cli.main import cli\n"
        "CliRunner().invoke(cli, ['run', '--help'])\n"
        "print(sorted(m for m in sys.modules if m.startswith(('kubedevice.kubelet',"
        " 'kubedevice.conformance'))))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


def test_help_shows_the_environment_variables() -> None:
    result = CliRunner().invoke(cli, ["--help"])
    assert "KUBEDEVICE_LOG_FORMAT" in result.output
    assert "KUBEDEVICE_LOG_LEVEL" in result.output
    result = CliRunner().invoke(cli, ["run", "--help"])
    assert "DP_DEVICE_PLUGIN_DIR" in result.output
    assert "--log-format" in result.output


def test_log_format_is_accepted_after_the_subcommand(tmp_path: Path) -> None:
    """``kubedevice run --log-format json`` logs JSON, like ``kubedevice --log-format json run``."""
    import json
    import os
    import signal

    config = tmp_path / "c.yaml"
    config.write_text(
        "version: v1\nresources:\n- name: example.com/x\n  groups:\n"
        "  - paths: [{path: /dev/null}]\n"
    )
    missing = tmp_path / "kubelet-not-started-yet"
    kubedevice = str(Path(sys.executable).parent / "kubedevice")
    env = {**os.environ, "KUBEDEVICE_LOG_FORMAT": "text"}  # the explicit flag wins
    argv = [kubedevice, "run", "-c", str(config), "--device-plugin-dir", str(missing)]
    argv += ["--log-format", "json", "--log-level", "debug"]
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, env=env)
    lines: list[str] = []
    try:
        assert proc.stderr is not None
        while not any("waiting for the kubelet to create" in line for line in lines):
            line = proc.stderr.readline()
            assert line, "".join(lines)
            lines.append(line)
        proc.send_signal(signal.SIGTERM)
        _, rest = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0
    records = [json.loads(line) for line in lines + rest.splitlines(keepends=True)]
    assert {r["level"] for r in records} >= {"debug", "info"}
    assert not missing.exists()

"""The ``kubedevice`` root command: every subcommand is listed and loads, lazily."""

from __future__ import annotations

import importlib
import subprocess
import sys

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

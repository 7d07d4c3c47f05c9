"""Root of the ``kubedevice`` command: global options and the lazily loaded subcommands.

Each subcommand module is imported only when one of its commands runs, so the plugin
daemon (``kubedevice run``) never loads the emulator or the conformance kit: less start-up
time and less memory on every node.
"""

from __future__ import annotations

import importlib

import click

from kubedevice import __version__
from kubedevice.log import configure_logging

#: command name -> the ``kubedevice.cli`` module whose ``COMMANDS`` list defines it.
SUBCOMMANDS: dict[str, str] = {
    "run": "run_cmd",
    "validate": "run_cmd",
    "kubelet": "kubelet_cmd",
    "pod": "kubelet_cmd",
    "node": "kubelet_cmd",
    "conformance": "conformance_cmd",
    "demo": "demo_cmd",
    "inspect": "inspect_cmd",
    "advertise": "advertise_cmd",
}


class _LazyGroup(click.Group):
    """A click group that imports a subcommand's module on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(SUBCOMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        module = SUBCOMMANDS.get(cmd_name)
        if module is None:
            return None
        commands = importlib.import_module(f"kubedevice.cli.{module}").COMMANDS
        return next((c for c in commands if c.name == cmd_name), None)


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="kubedevice")
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    envvar="KUBEDEVICE_LOG_FORMAT",
    help="Log line format.",
)
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"]),
    default="info",
    show_default=True,
    envvar="KUBEDEVICE_LOG_LEVEL",
    help="Minimum level of log lines.",
)
def cli(log_format: str, log_level: str) -> None:
    """Kubernetes device plugins in Python: plugins, a kubelet emulator and a conformance kit."""
    configure_logging(fmt=log_format, level=log_level)


def main() -> None:
    """Console-script entry point."""
    cli()

"""Root of the ``kubedevice`` command: global options and the list of subcommands."""

from __future__ import annotations

import click

from kubedevice import __version__
from kubedevice.cli import conformance_cmd, demo_cmd, kubelet_cmd, run_cmd
from kubedevice.log import configure_logging


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
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


for _module in (run_cmd, kubelet_cmd, conformance_cmd, demo_cmd):
    for _command in _module.COMMANDS:
        cli.add_command(_command)


def main() -> None:
    """Console-script entry point."""
    cli()

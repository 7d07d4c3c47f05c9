"""Root of the ``kubedevice`` command: global options and the lazily loaded subcommands.

Each subcommand module is imported only when one of its commands runs, so the plugin
daemon (``kubedevice run``) never loads the emulator or the conformance kit: less start-up
time and less memory on every node.
"""

from __future__ import annotations

import importlib

import click

from kubedevice import __version__
from kubedevice.cli.fastexit import OWN_PROCESS
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
    "nvidia": "nvidia_cmd",
    "inspect": "inspect_cmd",
    "advertise": "advertise_cmd",
    "examples": "examples_cmd",
}


_FORMATS = click.Choice(["text", "json"])
_LEVELS = click.Choice(["debug", "info", "warning", "error"])


def _relog(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    """``--log-format``/``--log-level`` given after a subcommand: reconfigure logging."""
    if value is None:
        return
    root = ctx.find_root()
    chosen = root.meta.setdefault("kubedevice.log", dict(root.params))
    chosen[param.name or ""] = value
    configure_logging(fmt=chosen["log_format"], level=chosen["log_level"])


def _with_log_options(command: click.Command) -> click.Command:
    """Accept ``--log-format`` and ``--log-level`` after the (sub)command name too."""
    names = {p.name for p in command.params}
    for name, flag, choice in (
        ("log_format", "--log-format", _FORMATS),
        ("log_level", "--log-level", _LEVELS),
    ):
        if name not in names:
            command.params.append(
                click.Option(
                    [flag, name],
                    type=choice,
                    default=None,
                    expose_value=False,
                    callback=_relog,
                    help="As before the subcommand (either place works).",
                )
            )
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            _with_log_options(sub)
    return command


class _LazyGroup(click.Group):
    """A click group that imports a subcommand's module on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(SUBCOMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        module = SUBCOMMANDS.get(cmd_name)
        if module is None:
            return None
        commands = importlib.import_module(f"kubedevice.cli.{module}").COMMANDS
        found = next((c for c in commands if c.name == cmd_name), None)
        return None if found is None else _with_log_options(found)


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="kubedevice")
@click.option(
    "--log-format",
    type=_FORMATS,
    default="text",
    show_default=True,
    envvar="KUBEDEVICE_LOG_FORMAT",
    show_envvar=True,
    help="Log line format (also accepted after the subcommand).",
)
@click.option(
    "--log-level",
    type=_LEVELS,
    default="info",
    show_default=True,
    envvar="KUBEDEVICE_LOG_LEVEL",
    show_envvar=True,
    help="Minimum level of log lines (also accepted after the subcommand).",
)
def cli(log_format: str, log_level: str) -> None:
    """Kubernetes device plugins in Python: plugins, a kubelet emulator and a conformance kit."""
    configure_logging(fmt=log_format, level=log_level)


def main() -> None:
    """Console-script entry point (a stopped daemon ends the process at once: see fastexit)."""
    cli(obj={OWN_PROCESS: True})

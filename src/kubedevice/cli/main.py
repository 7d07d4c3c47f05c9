"""Root of the ``kubedevice`` command: global options and the lazily loaded subcommands.

Each subcommand module is imported only when one of its commands runs, so the plugin
daemon (``kubedevice run``) never loads the emulator or the conformance kit: less start-up
time and less memory on every node.
"""

from __future__ import annotations

import importlib

import click
from click.core import ParameterSource

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

#: (parameter name, flag, choices, default, env var, help) of the two log options, which
#: the root and every subcommand take alike (before or after the subcommand's name).
_LOG_OPTIONS = (
    (
        "log_format",
        "--log-format",
        _FORMATS,
        "text",
        "KUBEDEVICE_LOG_FORMAT",
        "Log line format (before or after the subcommand).",
    ),
    (
        "log_level",
        "--log-level",
        _LEVELS,
        "info",
        "KUBEDEVICE_LOG_LEVEL",
        "Minimum level of log lines (before or after the subcommand).",
    ),
)


def _relog(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    """``--log-format``/``--log-level`` given after a subcommand: reconfigure logging.

    Only a value from the command line counts here: the default and the environment
    variable were already applied by the root.
    """
    if value is None or ctx.get_parameter_source(param.name or "") != ParameterSource.COMMANDLINE:
        return
    root = ctx.find_root()
    chosen = root.meta.setdefault("kubedevice.log", dict(root.params))
    chosen[param.name or ""] = value
    configure_logging(fmt=chosen["log_format"], level=chosen["log_level"])


def _log_option(index: int, *, after: bool) -> click.Option:
    name, flag, choice, default, envvar, help_text = _LOG_OPTIONS[index]
    extra: dict[str, object] = {"expose_value": False, "callback": _relog} if after else {}
    return click.Option(
        [flag, name],
        type=choice,
        default=default,
        show_default=True,
        envvar=envvar,
        show_envvar=True,
        help=help_text,
        **extra,  # type: ignore[arg-type]
    )


def _with_log_options(command: click.Command) -> click.Command:
    """Accept ``--log-format`` and ``--log-level`` after the (sub)command name too."""
    names = {p.name for p in command.params}
    for index, spec in enumerate(_LOG_OPTIONS):
        if spec[0] not in names:
            command.params.append(_log_option(index, after=True))
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
def cli(log_format: str, log_level: str) -> None:
    """Kubernetes device plugins and DRA drivers in Python, a kubelet emulator and a
    conformance kit.

    Exit status, for every command: 0 success, 2 a usage or config error (one line on
    stderr); others are listed in each command's help.
    """
    configure_logging(fmt=log_format, level=log_level)


cli.params.extend(_log_option(i, after=False) for i in range(len(_LOG_OPTIONS)))


def main() -> None:
    """Console-script entry point (a stopped daemon ends the process at once: see fastexit)."""
    cli(obj={OWN_PROCESS: True})

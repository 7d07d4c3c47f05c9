"""``kubedevice conformance -- COMMAND``: run the conformance kit on a plugin command.

Parses options, calls :func:`kubedevice.conformance.check_plugin`, prints the table and
summary, writes JUnit XML on request, and maps the outcome to the exit code (0 ok, 1 a
MUST failure, or any failure with ``--strict``; 2 usage error).
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

import click

from kubedevice.conformance import Level, check_plugin, write_junit
from kubedevice.errors import ConfigError

__all__ = ["COMMANDS", "conformance"]


@click.command(
    # Option parsing stops at the first word of COMMAND, so the plugin's own flags need no
    # `--`; a misspelt option of ours before it is still an error, not a command.
    context_settings={"allow_interspersed_args": False},
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0.1),
    default=30.0,
    show_default=True,
    help="Upper bound in seconds on every wait (the contract's limits apply when smaller).",
)
@click.option("--strict", is_flag=True, help="SHOULD failures fail the run too.")
@click.option(
    "--junit",
    "junit_path",
    type=click.Path(dir_okay=False, writable=True, path_type=Path),
    show_default="none",
    help="Write JUnit XML (one testcase per case) to this file.",
)
@click.option(
    "--log",
    "log_path",
    type=click.Path(dir_okay=False, writable=True, path_type=Path),
    show_default="a new file in /tmp",
    help="Where the plugin's stdout and stderr go.",
)
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def conformance(
    timeout: float,
    strict: bool,
    junit_path: Path | None,
    log_path: Path | None,
    command: tuple[str, ...],
) -> None:
    """Check the device plugin started by COMMAND against the kubelet contract.

    COMMAND runs with the device plugin directory in $DP_DEVICE_PLUGIN_DIR, and in place
    of {dir} in its arguments. Put it after `--`.
    """
    if not command:
        raise click.UsageError("no plugin COMMAND given (usage: kubedevice conformance -- CMD)")
    if log_path is None:
        fd, name = tempfile.mkstemp(prefix="kd-conformance-", suffix=".log", dir="/tmp")
        os.close(fd)
        log_path = Path(name)
    click.echo(f"plugin output: {log_path}")
    # The emulator's lifecycle lines would drown the table; keep its warnings and errors.
    emulator_log = logging.getLogger("kubedevice.kubelet")
    if emulator_log.getEffectiveLevel() == logging.INFO:
        emulator_log.setLevel(logging.WARNING)
    try:
        report = check_plugin(command, timeout=timeout, log_path=log_path)
    except ConfigError as exc:
        click.echo(f"error: {exc}", err=True)
        raise SystemExit(2) from exc
    click.echo(report.format_table())
    musts = len(report.failures(Level.MUST))
    shoulds = len(report.failures(Level.SHOULD))
    click.echo(
        f"{report.summary()} in {report.duration_s:.2f} s "
        f"({musts} MUST and {shoulds} SHOULD failures)"
    )
    if junit_path is not None:
        write_junit(report, junit_path)
        click.echo(f"JUnit XML: {junit_path}")
    ok = report.ok(strict=strict)
    if report.failed:
        tail = report.log_tail(20)
        click.echo(f"--- last lines of the plugin output ({log_path}) ---")
        click.echo(tail.rstrip("\n") if tail else "(empty)")
    if not ok:
        raise SystemExit(1)


COMMANDS: list[click.Command] = [conformance]

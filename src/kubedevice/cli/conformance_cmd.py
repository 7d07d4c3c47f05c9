"""``kubedevice conformance [--dra] -- COMMAND``: run a conformance kit on a plugin or driver.

Parses options, calls :func:`kubedevice.conformance.check_plugin` (or, with ``--dra``,
:func:`kubedevice.conformance.dra.check_driver`), prints the table and
summary, writes JUnit XML on request, and maps the outcome to the exit code (0 ok, 1 a
MUST failure, or any failure with ``--strict``; 2 usage error).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

import click

from kubedevice.conformance import Level, check_plugin, write_junit
from kubedevice.conformance.dra import DraOptions, check_driver
from kubedevice.conformance.dra.context import DRA_TIMEOUT_S
from kubedevice.errors import ConfigError
from kubedevice.kubeconfig import KUBECONFIG_DEFAULT, KUBECONFIG_HELP

__all__ = ["COMMANDS", "conformance"]


@click.command(
    # Option parsing stops at the first word of COMMAND, so the plugin's own flags need no
    # `--`; a misspelt option of ours before it is still an error, not a command.
    context_settings={"allow_interspersed_args": False},
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0.1),
    default=None,
    show_default="30 (--dra: 60)",
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
@click.option(
    "--dra",
    is_flag=True,
    help="Check a DRA driver instead (the options below apply only with --dra).",
)
@click.option(
    "--kubeconfig",
    type=click.Path(dir_okay=False, path_type=Path),
    show_default=KUBECONFIG_DEFAULT,
    help=KUBECONFIG_HELP,
)
@click.option(
    "--k8s-bin",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    show_default="none: the API server of --kubeconfig",
    help="(--dra) A directory with etcd and kube-apiserver: the kit starts its own API "
    "server (with an audit log) instead of using --kubeconfig.",
)
@click.option(
    "--expect-driver",
    "driver_name",
    show_default="any",
    help="(--dra) The driver name GetInfo must answer.",
)
@click.option("--quick", is_flag=True, help="(--dra) Skip the restarts; shorter quiet period.")
@click.option(
    "--claim-config",
    metavar="JSON",
    show_default="none: that case is skipped",
    help="(--dra) Opaque parameters of the driver, given to one claim's request.",
)
@click.option(
    "--env",
    "env",
    multiple=True,
    metavar="VAR=VALUE",
    help="(--dra) Set in the driver's environment (repeat).",
)
@click.option(
    "--slow-env",
    multiple=True,
    metavar="VAR=VALUE",
    show_default="none: deadline-overlap is skipped",
    help="(--dra) The driver's own way to slow its prepare, set for the overlap case only "
    "(repeat).",
)
@click.option(
    "--host-root",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=Path("/"),
    show_default=True,
    help="(--dra) Where the host's files are: CDI device nodes are looked up under it "
    "(a fake tree's root for a driver run on a fake /dev).",
)
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def conformance(
    timeout: float | None,
    strict: bool,
    junit_path: Path | None,
    log_path: Path | None,
    dra: bool,
    command: tuple[str, ...],
    **dra_options: Any,
) -> None:
    """Check the device plugin (or, with --dra, the DRA driver) started by COMMAND.

    COMMAND runs with the device plugin directory in $DP_DEVICE_PLUGIN_DIR, and in place
    of {dir} in its arguments. Put it after `--`.

    With --dra, COMMAND is a DRA driver in any language. The kit gives it a kubelet dir of
    its own and a real API server (--kubeconfig, or its own with --k8s-bin), makes the
    Node, a DeviceClass and ResourceClaims, writes their allocations from the devices the
    driver publishes, and plays the kubelet: registration, NodePrepareResources and
    NodeUnprepareResources (v1, v1beta1), the health stream, restarts and a reboot. These
    words in COMMAND's arguments are replaced: {node}, {kubeconfig}, {kubelet_dir},
    {registry_dir}, {plugins_dir}, {cdi_dir}, {pod_uid}; $NODE_NAME and $KUBECONFIG are
    set. Example:

    \b
      kubedevice conformance --dra --k8s-bin "$BIN" -- \\
        my-driver --node-name {node} --kubeconfig {kubeconfig} \\
        --kubelet-dir {kubelet_dir} --cdi-dir {cdi_dir}

    Exit status: 0 when no MUST case failed (no case at all with --strict), 1 otherwise,
    2 for a usage or setup error.
    """
    if not command:
        raise click.UsageError("no plugin COMMAND given (usage: kubedevice conformance -- CMD)")
    if log_path is None:
        fd, name = tempfile.mkstemp(prefix="kd-conformance-", suffix=".log", dir="/tmp")
        os.close(fd)
        log_path = Path(name)
    click.echo(f"{'driver' if dra else 'plugin'} output: {log_path}")
    try:
        if dra:
            opts = _dra_options(command, log_path, timeout or DRA_TIMEOUT_S, **dra_options)
            report = check_driver(opts)
        else:
            # The emulator's lifecycle lines would drown the table; keep its warnings and errors.
            emulator_log = logging.getLogger("kubedevice.kubelet")
            if emulator_log.getEffectiveLevel() == logging.INFO:
                emulator_log.setLevel(logging.WARNING)
            report = check_plugin(command, timeout=timeout or 30.0, log_path=log_path)
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
        click.echo(f"--- last lines of the {'driver' if dra else 'plugin'} output ({log_path}) ---")
        click.echo(tail.rstrip("\n") if tail else "(empty)")
    if not ok:
        raise SystemExit(1)


def _dra_options(
    command: tuple[str, ...],
    log_path: Path,
    timeout: float,
    kubeconfig: Path | None,
    k8s_bin: Path | None,
    driver_name: str | None,
    quick: bool,
    claim_config: str | None,
    env: tuple[str, ...],
    host_root: Path,
    slow_env: tuple[str, ...],
) -> DraOptions:
    if kubeconfig is not None and k8s_bin is not None:
        raise click.UsageError("--kubeconfig and --k8s-bin exclude each other")
    config = None
    if claim_config is not None:
        try:
            config = json.loads(claim_config)
        except ValueError as exc:
            raise click.BadParameter(f"not JSON: {exc}", param_hint="--claim-config") from exc
        if not isinstance(config, dict):
            raise click.BadParameter("not a JSON object", param_hint="--claim-config")
    pairs, slow = _pairs(env, "--env"), _pairs(slow_env, "--slow-env")
    return DraOptions(
        command=command,
        log_path=log_path,
        kubeconfig=kubeconfig,
        k8s_bin=k8s_bin,
        driver_name=driver_name,
        timeout=timeout,
        quick=quick,
        claim_config=config,
        env=pairs,
        slow_env=slow,
        host_root=host_root,
    )


def _pairs(items: tuple[str, ...], option: str) -> tuple[tuple[str, str], ...]:
    pairs = []
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise click.BadParameter(f"{item!r} is not VAR=VALUE", param_hint=option)
        pairs.append((name, value))
    return tuple(pairs)


COMMANDS: list[click.Command] = [conformance]

"""The options every DRA driver command takes, and running a driver from the CLI.

Used by ``kubedevice nvidia dra`` and ``kubedevice run --dra``. No logic: the options
become :class:`~kubedevice.dra.DriverOptions` and :mod:`kubedevice.dra` does the work; a
bad option or environment exits 2 with one line, a failed ``--cleanup`` exits 1.

SIGHUP reloads the driver's config all or nothing: the new file is read and checked while
the driver keeps serving; a bad one is one error line and nothing changes; a good one
stops the driver cleanly (sockets removed, checkpoint and slices kept) and starts the
same command again in the same process (``exec``), which publishes the new devices.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import click

from kubedevice.cli.fastexit import end_process_after_stop, owns_process
from kubedevice.errors import ConfigError, KubeDeviceError
from kubedevice.kubeconfig import KUBECONFIG_DEFAULT, KUBECONFIG_HELP
from kubedevice.signals import stop_on_signals

if TYPE_CHECKING:
    from kubedevice.dra import Device, Driver, DriverOptions

__all__ = [
    "PRINT_DEVICE_CLASSES",
    "cleanup_only_driver",
    "dra_options",
    "driver_options",
    "print_classes",
    "refuse_with_dra",
    "run_driver",
]

log = logging.getLogger("kubedevice.cli.dra")

F = TypeVar("F", bound=Callable[..., Any])


def _fail(message: str, status: int = 2) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    raise SystemExit(status) from None


#: ``--print-device-classes``: print the driver's DeviceClasses for extended resources, exit.
PRINT_DEVICE_CLASSES = click.option(
    "--print-device-classes",
    "print_device_classes",
    is_flag=True,
    help="Print, as YAML, a DeviceClass for each extended resource the device plugin would "
    "advertise with this --config (spec.extendedResourceName set, selecting this driver's "
    "devices) and exit; nothing is started and no cluster is needed.",
)


def print_classes(classes: list[dict[str, Any]]) -> None:
    """Print ``classes`` as YAML documents (``kubectl apply -f -`` takes them)."""
    from kubedevice.dra.api.classes import dump_classes

    click.echo(dump_classes(classes), nl=False)


def refuse_with_dra(*names: str) -> None:
    """Exit 2 with one line if a device-plugin-only flag (by parameter name) was given on
    the command line with ``--dra``."""
    ctx = click.get_current_context()
    for name in names:
        if ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE:
            flag = "--" + name.replace("_", "-")
            _fail(f"{flag} means nothing for a DRA driver (--dra); leave it out")


def dra_options(default_driver_name: str, *, cdi_default: str) -> Callable[[F], F]:
    """Add the DRA driver options to a click command (``driver_name`` ... ``cleanup``);
    ``cdi_default`` says where CDI specs go without ``--cdi-dir``.
    """

    def decorate(fn: F) -> F:
        options = [
            click.option(
                "--driver-name",
                default=default_driver_name,
                show_default=True,
                help="The DRA driver's name (a DNS subdomain): ResourceSlices, DeviceClass "
                "selectors and CEL attribute domains use it.",
            ),
            click.option(
                "--node-name",
                envvar="NODE_NAME",
                show_envvar=True,
                default=None,
                show_default="none",
                help="This node's name (also the pool's); a DRA driver cannot start without "
                "it. In a pod, set NODE_NAME from the downward API.",
            ),
            click.option(
                "--pod-uid",
                envvar="POD_UID",
                show_envvar=True,
                default=None,
                show_default="none: fixed socket names, one instance per node",
                help="This instance's pod UID: its sockets are named by it, so that a "
                "DaemonSet can roll with maxSurge (two instances side by side). In a pod, "
                "set POD_UID from the downward API (metadata.uid).",
            ),
            click.option(
                "--kubelet-dir",
                default="/var/lib/kubelet",
                show_default=True,
                type=click.Path(file_okay=False, path_type=Path),
                help="The kubelet's --root-dir (its plugins_registry/ and plugins/).",
            ),
            click.option(
                "--cdi-dir",
                default=None,
                show_default=cdi_default,
                type=click.Path(file_okay=False, path_type=Path),
                help="Where the CDI specs are written.",
            ),
            click.option(
                "--kubeconfig",
                default=None,
                show_default=KUBECONFIG_DEFAULT,
                type=click.Path(dir_okay=False, path_type=Path),
                help=KUBECONFIG_HELP,
            ),
            click.option(
                "--api-timeout",
                default=30.0,
                show_default=True,
                type=click.FloatRange(0.5, 300),
                help="Seconds one API call may take in all, retries included (keep it under "
                "the kubelet's 45 s for a claim).",
            ),
            click.option(
                "--stop-grace",
                envvar="KUBEDEVICE_STOP_GRACE",
                show_envvar=True,
                default=25.0,
                show_default=True,
                type=click.FloatRange(0, 3600),
                help="On SIGTERM, how long the prepare and unprepare calls in flight (the "
                "driver's hooks) may still run before the driver exits; keep it a little "
                "under the pod's terminationGracePeriodSeconds. An idle driver exits at once.",
            ),
            click.option(
                "--no-health", is_flag=True, help="Do not serve the kubelet's health stream."
            ),
            click.option(
                "--evict-on",
                multiple=True,
                metavar="FAULT",
                help="Taint devices with this fault NoExecute, so that the controller-manager "
                "evicts the pods using them (xid, xid=79, gpu-lost, health-check, unhealthy, "
                "all; repeat or comma-separate). Other faults: NoSchedule.",
            ),
            click.option(
                "--cleanup",
                is_flag=True,
                help="Remove this driver's ResourceSlices on this node and its CDI specs, "
                "then exit (on uninstall).",
            ),
        ]
        for option in reversed(options):
            fn = option(fn)
        return fn

    return decorate


def driver_options(
    driver_name: str,
    node_name: str | None,
    kubelet_dir: Path,
    cdi_dir: Path,
    kubeconfig: Path | None,
    no_health: bool,
    evict_on: tuple[str, ...] = (),
    metrics_address: str | None = None,
    api_timeout: float = 30.0,
    pod_uid: str | None = None,
    stop_grace: float | None = None,
) -> DriverOptions:
    """The :class:`~kubedevice.dra.DriverOptions` of the parsed options."""
    from kubedevice.dra import DriverOptions

    return DriverOptions(
        driver_name=driver_name,
        node_name=node_name,
        kubelet_dir=kubelet_dir.absolute(),
        cdi_dir=cdi_dir.absolute(),
        kubeconfig=kubeconfig,
        health=not no_health,
        evict_on=tuple(evict_on),
        metrics_address=metrics_address,
        api_timeout=api_timeout,
        pod_uid=pod_uid,
        stop_grace=stop_grace,
    )


def cleanup_only_driver(driver_name: str) -> Driver:
    """A driver with a name and no devices, for ``--cleanup`` (which needs no config)."""
    from kubedevice.dra import Driver

    class _Named(Driver):
        async def devices(self) -> AsyncIterator[Sequence[Device]]:  # never served
            yield ()

    named = _Named()
    named.driver_name = driver_name  # type: ignore[misc]
    return named


def run_driver(
    driver: Driver,
    options: DriverOptions,
    *,
    cleanup: bool,
    reload: Callable[[], object] | None = None,
) -> None:
    """Serve ``driver`` until SIGTERM/SIGINT (status 0), or with ``cleanup`` remove its
    slices and CDI specs and exit.

    ``reload`` reads and checks the config file again (raising
    :class:`~kubedevice.errors.ConfigError` when it is bad): SIGHUP calls it, and on success
    the driver stops cleanly and the command starts again in the same process.
    """
    from kubedevice import dra

    if cleanup:
        try:
            removed = asyncio.run(dra.cleanup(driver, options))
        except ConfigError as exc:
            _fail(str(exc))
        except KubeDeviceError as exc:
            _fail(f"cleanup: {exc}", 1)
        click.echo(f"removed {removed} ResourceSlice(s) and CDI spec(s)")
        return

    async def _main() -> bool:
        stop = asyncio.Event()
        restart = False

        def on_hangup() -> None:
            nonlocal restart
            if reload is None:
                log.warning("SIGHUP: this driver has no config file to reload")
                return
            try:
                reload()
            except KubeDeviceError as exc:
                log.error("SIGHUP: the config is not reloaded (the running one stays): %s", exc)
                return
            log.info("SIGHUP: the new config is valid; restarting the driver to apply it")
            restart = True
            stop.set()

        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGHUP, on_hangup)
        try:
            with stop_on_signals(stop):
                await dra.serve(driver, options, stop=stop)
        finally:
            loop.remove_signal_handler(signal.SIGHUP)
        return restart

    try:
        restart = asyncio.run(_main())
    except KubeDeviceError as exc:
        _fail(str(exc))
    if restart and owns_process():
        _exec_again()
    end_process_after_stop(0)


def _exec_again() -> NoReturn:
    """Start this very command again in this process (same PID, same arguments)."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os.execv(sys.executable, sys.orig_argv)

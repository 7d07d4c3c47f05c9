"""Ways to run a DRA driver: ``serve()`` (coroutine), ``run()`` (blocking), ``main()`` (CLI).

``argument_parser()`` gives ``main``'s flags to authors who add options of their own;
``options_from_args()`` turns parsed flags into :class:`DriverOptions`. ``cleanup()`` removes
a driver's ResourceSlices on this node and its CDI specs (``--cleanup``, on uninstall).
Library code never exits the process itself.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from kubedevice.dra.driver import Driver
from kubedevice.dra.node.settings import Settings
from kubedevice.errors import ConfigError, KubeDeviceError
from kubedevice.kubeconfig import KUBECONFIG_DEFAULT, KUBECONFIG_HELP
from kubedevice.log import (
    ENV_LOG_FORMAT,
    ENV_LOG_LEVEL,
    add_log_arguments,
    configure_logging_from_args,
)
from kubedevice.signals import stop_on_signals

__all__ = [
    "DEFAULT_API_TIMEOUT_S",
    "DEFAULT_CDI_DIR",
    "DEFAULT_KUBELET_DIR",
    "ENV_NODE_NAME",
    "ENV_POD_UID",
    "ENV_STOP_GRACE",
    "DriverOptions",
    "argument_parser",
    "cleanup",
    "main",
    "options_from_args",
    "run",
    "serve",
]

log = logging.getLogger(__name__)

#: The kubelet's root directory; its ``plugins_registry/`` and ``plugins/`` are used.
DEFAULT_KUBELET_DIR: Final = Path("/var/lib/kubelet")
#: Where CDI specs for the container runtime are written (CDI's dynamic spec directory).
DEFAULT_CDI_DIR: Final = Path("/var/run/cdi")
#: The environment variable ``--node-name`` defaults to (set it from the downward API).
ENV_NODE_NAME: Final = "NODE_NAME"
#: The environment variable ``--pod-uid`` defaults to (set it from the downward API).
ENV_POD_UID: Final = "POD_UID"
#: The total time of one API call, retries included (``--api-timeout``).
DEFAULT_API_TIMEOUT_S: Final = 30.0
#: The environment variable ``--stop-grace`` defaults to (set it a little under the pod's
#: ``terminationGracePeriodSeconds``).
ENV_STOP_GRACE: Final = "KUBEDEVICE_STOP_GRACE"
#: On SIGTERM, how long the calls in flight may still run (``--stop-grace``): under the
#: pod's default ``terminationGracePeriodSeconds`` of 30.
DEFAULT_STOP_GRACE_S: Final = 25.0
#: The largest ``--stop-grace``.
MAX_STOP_GRACE_S: Final = 3600.0


@dataclass(frozen=True, slots=True)
class DriverOptions:
    """Where and as what a driver runs.

    Args:
        driver_name: The driver's name; ``None`` takes :attr:`Driver.driver_name`.
        node_name: This node's name (the pool's name too); ``None`` takes ``$NODE_NAME``.
        kubelet_dir: The kubelet's root dir (``plugins_registry/``, ``plugins/<driver>/``).
        cdi_dir: Where the claims' CDI specs are written.
        kubeconfig: A kubeconfig file; ``None``: ``$KUBECONFIG``, else ``~/.kube/config``,
            else the in-cluster service account.
        publish: Publish ResourceSlices (off: the driver only serves the kubelet).
        health: Serve the ``v1alpha1.DRAResourceHealth`` stream.
        evict_on: Faults whose device taint is ``NoExecute`` (``xid``, ``xid=79``,
            ``gpu-lost``, ``health-check``, ``unhealthy``, ``all``); the rest are
            ``NoSchedule``. See :mod:`kubedevice.dra.model.taints`.
        metrics_address: ``HOST:PORT`` to serve ``/metrics`` (Prometheus), ``/healthz``
            and ``/readyz`` on; ``None`` serves none.
        claim_status: Write ``status.devices`` (Ready, Healthy, data) of the claims it
            prepared (:mod:`kubedevice.dra.api.status`).
        api_timeout: Seconds one API call may take in all, retries included (under the
            kubelet's 45 s for a claim, so a claim that cannot be read fails clearly first).
        pod_uid: This instance's pod UID; ``None`` takes ``$POD_UID``, empty: none. With
            one, the sockets are ``dra-<uid>.sock`` and ``<driver>-<uid>-reg.sock``, so a
            DaemonSet can roll with ``maxSurge`` (two instances side by side, see
            :mod:`kubedevice.dra.state.lock`); without, the fixed names and one instance per node.
        stop_grace: On stop (SIGTERM), how long the prepare and unprepare calls in flight
            (their hooks) may still run, in seconds; ``None`` takes ``$KUBEDEVICE_STOP_GRACE``,
            else 25. Keep it under the pod's ``terminationGracePeriodSeconds``. An idle
            driver stops at once whatever it is.
    """

    driver_name: str | None = None
    node_name: str | None = None
    kubelet_dir: Path = DEFAULT_KUBELET_DIR
    cdi_dir: Path = DEFAULT_CDI_DIR
    kubeconfig: Path | None = None
    publish: bool = True
    health: bool = True
    evict_on: tuple[str, ...] = ()
    metrics_address: str | None = None
    claim_status: bool = True
    api_timeout: float = DEFAULT_API_TIMEOUT_S
    pod_uid: str | None = None
    stop_grace: float | None = None

    def resolved(self, driver: Driver) -> Settings:
        """These options with the driver name and node name filled in and checked.

        Raises:
            ConfigError: No driver name or node name, or one the API would refuse.
        """
        from kubedevice.dra.model.names import check_driver_name, check_node_name, check_pod_uid

        driver_name = self.driver_name or driver.driver_name
        node_name = self.node_name or os.environ.get(ENV_NODE_NAME, "")
        if not driver_name:
            raise ConfigError("no driver name: set Driver.driver_name or --driver-name")
        if not node_name:
            raise ConfigError(f"no node name: pass --node-name or set ${ENV_NODE_NAME}")
        check_driver_name(driver_name)
        check_node_name(node_name)
        pod_uid = self.pod_uid if self.pod_uid is not None else os.environ.get(ENV_POD_UID, "")
        if pod_uid:
            check_pod_uid(pod_uid)
        if not 0 < self.api_timeout <= 300:
            raise ConfigError(f"API timeout {self.api_timeout} s: give 0 to 300 seconds")
        stop_grace = self.stop_grace
        if stop_grace is None:
            stop_grace = _env_seconds(ENV_STOP_GRACE, DEFAULT_STOP_GRACE_S)
        if not 0 <= stop_grace <= MAX_STOP_GRACE_S:
            raise ConfigError(f"stop grace {stop_grace} s: give 0 to {MAX_STOP_GRACE_S:g} seconds")
        from kubedevice.dra.model.taints import parse_evict_on

        evict_on = parse_evict_on(self.evict_on)
        if self.metrics_address is not None:
            from kubedevice.plugin.metrics import parse_metrics_address

            parse_metrics_address(self.metrics_address)
        return Settings(
            driver_name=driver_name,
            node_name=node_name,
            kubelet_dir=Path(self.kubelet_dir),
            cdi_dir=Path(self.cdi_dir),
            kubeconfig=Path(self.kubeconfig) if self.kubeconfig else None,
            publish=self.publish,
            health=self.health,
            evict_on=evict_on,
            metrics_address=self.metrics_address,
            claim_status=self.claim_status,
            api_timeout=float(self.api_timeout),
            pod_uid=pod_uid,
            stop_grace=float(stop_grace),
        )


def _env_seconds(name: str, default: float) -> float:
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        return float(text)
    except ValueError:
        raise ConfigError(f"${name}={text[:40]!r} is not a number of seconds") from None


async def serve(
    driver: Driver,
    options: DriverOptions | None = None,
    *,
    stop: asyncio.Event | None = None,
    ready: asyncio.Event | None = None,
) -> None:
    """Serve ``driver`` until ``stop`` is set (forever if ``None``), then stop cleanly.

    Serves the DRA services on ``<kubelet dir>/plugins/<driver>/dra.sock``, registers on
    ``<kubelet dir>/plugins_registry/<driver>-reg.sock`` (again whenever the kubelet
    restarts or the socket is removed), publishes the ResourceSlices of this node's pool
    and keeps them in step with :meth:`Driver.devices`.

    Args:
        driver: The driver.
        options: Where and as what it runs (defaults: :class:`DriverOptions`).
        stop: Set it to stop serving.
        ready: Set once the DRA socket serves and the registration socket is up.

    Raises:
        ConfigError: A bad option (driver name, node name, kubeconfig).
        KubeDeviceError: The sockets could not be served.
    """
    from kubedevice.dra.node.server import DriverServer

    resolved = (options or DriverOptions()).resolved(driver)
    stop = stop or asyncio.Event()
    server = DriverServer(driver, resolved)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        # a stop during start-up (a driver whose first device list never comes) ends it too
        starting = asyncio.ensure_future(server.start())
        await asyncio.wait({starting, stopped}, return_when=asyncio.FIRST_COMPLETED)
        if not starting.done():
            log.info("stopped while starting")
            starting.cancel()
            await asyncio.wait({starting})
            return
        starting.result()
        if ready is not None:
            ready.set()
        failed = asyncio.ensure_future(server.wait_failed())
        try:
            await asyncio.wait({stopped, failed}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            failed.cancel()
        log.info("stopping")
        if failed.done() and not failed.cancelled():
            error = failed.result()
            if error is not None:
                raise error
    finally:
        stopped.cancel()
        await server.stop()


def run(driver: Driver, options: DriverOptions | None = None) -> int:
    """Serve ``driver`` until SIGTERM or SIGINT, then stop cleanly. Blocks.

    A bad option or environment (a name, the kubeconfig, another instance running) is
    logged as one line, never a traceback: ``raise SystemExit(dra.run(...))`` exits 2.

    Returns:
        0 after a clean stop, 2 when the driver could not start or failed.
    """

    async def _main() -> None:
        stop = asyncio.Event()
        with stop_on_signals(stop):
            await serve(driver, options, stop=stop)

    try:
        asyncio.run(_main())
    except KubeDeviceError as exc:
        log.error("%s", exc)
        return 2
    return 0


async def cleanup(driver: Driver, options: DriverOptions | None = None) -> int:
    """Remove the driver's ResourceSlices on this node and the CDI specs it wrote.

    Returns:
        How many slices and spec files were removed.

    Raises:
        ConfigError: A bad option.
        KubeApiError: The API server refused or could not be reached.
    """
    from kubedevice.dra.api.kube import KubeClient
    from kubedevice.dra.api.slices import delete_slices
    from kubedevice.dra.state.cdi import CdiWriter

    resolved = (options or DriverOptions()).resolved(driver)
    removed = CdiWriter(resolved.cdi_dir, resolved.driver_name).remove_all()
    client = await asyncio.to_thread(
        KubeClient.connect, resolved.kubeconfig, deadline_s=resolved.api_timeout
    )
    try:
        removed += await delete_slices(client, resolved.driver_name, resolved.node_name)
    finally:
        client.close()
    return removed


def argument_parser(description: str | None = None) -> argparse.ArgumentParser:
    """The command-line parser :func:`main` uses, for authors to add their own options.

    Flags: ``--driver-name``, ``--node-name`` (default ``$NODE_NAME``), ``--pod-uid``
    (default ``$POD_UID``), ``--kubelet-dir``,
    ``--cdi-dir``, ``--kubeconfig`` (default ``$KUBECONFIG``, ``~/.kube/config``, in-cluster),
    ``--api-timeout``, ``--stop-grace`` (default ``$KUBEDEVICE_STOP_GRACE``), ``--no-health``,
    ``--evict-on``, ``--metrics-address``, ``--cleanup``, ``--log-level``, ``--log-format``.
    """
    parser = argparse.ArgumentParser(
        description=description or "Run a Kubernetes DRA driver (kubelet plugin).",
        epilog=f"Environment: {ENV_NODE_NAME}, {ENV_POD_UID}, {ENV_STOP_GRACE}, {ENV_LOG_LEVEL} "
        f"and {ENV_LOG_FORMAT} give the defaults of --node-name, --pod-uid, --stop-grace, "
        "--log-level and --log-format.",
    )
    # the help texts read as the `kubedevice` command's (tests/test_cli_help.py)
    parser.add_argument(
        "--driver-name",
        default=None,
        metavar="TEXT",
        help="The DRA driver's name (a DNS subdomain): ResourceSlices, DeviceClass selectors "
        "and CEL attribute domains use it.  [default: (the driver class's driver_name)]",
    )
    parser.add_argument(
        "--node-name",
        default=None,
        metavar="TEXT",
        help="This node's name (also the pool's); a DRA driver cannot start without it. In a "
        f"pod, set {ENV_NODE_NAME} from the downward API.  "
        f"[env var: {ENV_NODE_NAME}; default: (none)]",
    )
    parser.add_argument(
        "--pod-uid",
        default=None,
        metavar="TEXT",
        help="This instance's pod UID: its sockets are named by it, so that a DaemonSet can "
        f"roll with maxSurge (two instances side by side). In a pod, set {ENV_POD_UID} from "
        "the downward API (metadata.uid).  "
        f"[env var: {ENV_POD_UID}; default: (none: fixed socket names, one instance per node)]",
    )
    parser.add_argument(
        "--kubelet-dir",
        type=Path,
        default=DEFAULT_KUBELET_DIR,
        metavar="DIRECTORY",
        help="The kubelet's --root-dir (its plugins_registry/ and plugins/).  "
        f"[default: {DEFAULT_KUBELET_DIR}]",
    )
    parser.add_argument(
        "--cdi-dir",
        type=Path,
        default=DEFAULT_CDI_DIR,
        metavar="DIRECTORY",
        help=f"Where the CDI specs are written.  [default: {DEFAULT_CDI_DIR}]",
    )
    parser.add_argument(
        "--kubeconfig",
        type=Path,
        default=None,
        metavar="FILE",
        help=f"{KUBECONFIG_HELP}  [default: ({KUBECONFIG_DEFAULT})]",
    )
    parser.add_argument(
        "--api-timeout",
        type=_seconds,
        default=DEFAULT_API_TIMEOUT_S,
        metavar="FLOAT RANGE",
        help="Seconds one API call may take in all, retries included (keep it under the "
        f"kubelet's 45 s for a claim).  [default: {DEFAULT_API_TIMEOUT_S:g}; 0.5<=x<=300]",
    )
    parser.add_argument(
        "--stop-grace",
        type=_grace,
        default=None,
        metavar="FLOAT RANGE",
        help="On SIGTERM, how long the prepare and unprepare calls in flight (the driver's "
        "hooks) may still run before the driver exits; keep it a little under the pod's "
        "terminationGracePeriodSeconds. An idle driver exits at once.  "
        f"[env var: {ENV_STOP_GRACE}; default: {DEFAULT_STOP_GRACE_S:g}; "
        f"0<=x<={MAX_STOP_GRACE_S:g}]",
    )
    parser.add_argument(
        "--no-health", action="store_true", help="Do not serve the kubelet's health stream."
    )
    parser.add_argument(
        "--evict-on",
        action="append",
        default=[],
        metavar="FAULT",
        help="Taint devices with this fault NoExecute, so that the controller-manager evicts "
        "the pods using them (xid, xid=79, gpu-lost, health-check, unhealthy, all; repeat or "
        "comma-separate). Other faults: NoSchedule.",
    )
    parser.add_argument(
        "--metrics-address",
        default=None,
        metavar="HOST:PORT",
        help="Serve Prometheus /metrics on this address (a DRA driver: /healthz and /readyz "
        "too).  [default: (off)]",
    )
    parser.add_argument(
        "--cleanup",
        action="store_true",
        help="Remove this driver's ResourceSlices on this node and its CDI specs, then exit "
        "(on uninstall).",
    )
    add_log_arguments(parser)
    return parser


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0.5 <= value <= 300:
        raise argparse.ArgumentTypeError(f"{text} s: give 0.5 to 300 seconds")
    return value


def _grace(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 <= value <= MAX_STOP_GRACE_S:
        raise argparse.ArgumentTypeError(f"{text} s: give 0 to {MAX_STOP_GRACE_S:g} seconds")
    return value


def options_from_args(args: argparse.Namespace) -> DriverOptions:
    """The :class:`DriverOptions` of flags parsed by :func:`argument_parser`'s parser.

    Also applies ``--log-level``/``--log-format`` (so :func:`run` logs as asked); a bad
    value of those is one line on stderr and ``SystemExit(2)``, as argparse does for a bad
    flag.
    """
    if hasattr(args, "log_level") and not configure_logging_from_args(args):
        raise SystemExit(2)
    return DriverOptions(
        driver_name=args.driver_name,
        node_name=args.node_name,
        pod_uid=getattr(args, "pod_uid", None),
        kubelet_dir=args.kubelet_dir,
        cdi_dir=args.cdi_dir,
        kubeconfig=args.kubeconfig,
        health=not args.no_health,
        evict_on=tuple(getattr(args, "evict_on", None) or ()),
        metrics_address=getattr(args, "metrics_address", None),
        api_timeout=getattr(args, "api_timeout", DEFAULT_API_TIMEOUT_S),
        stop_grace=getattr(args, "stop_grace", None),
    )


def main(
    driver: Driver,
    argv: Sequence[str] | None = None,
    args: argparse.Namespace | None = None,
) -> int:
    """Parse the standard flags, configure logging and :func:`run` (or :func:`cleanup`).

    Returns:
        The exit status: 0 after a clean stop, 2 for a bad flag or environment, 1 when
        ``--cleanup`` could not finish.
    """
    if args is None:
        args = argument_parser().parse_args(argv)
    try:
        options = options_from_args(args)
    except SystemExit as exc:
        return int(exc.code or 0)
    if args.cleanup:
        try:
            removed = asyncio.run(cleanup(driver, options))
        except ConfigError as exc:
            log.error("%s", exc)
            return 2
        except KubeDeviceError as exc:
            log.error("cleanup: %s", exc)
            return 1
        log.info("cleanup: removed %d ResourceSlices and CDI specs", removed)
        return 0
    return run(driver, options)

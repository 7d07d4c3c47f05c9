"""Ways to run plugins: ``serve()`` (coroutine), ``run()`` (blocking), ``main()`` (CLI).

``argument_parser()`` gives ``main``'s flags to authors who add options of their own.

``run`` and ``main`` turn SIGTERM/SIGINT into a clean stop (streams end, sockets removed)
and return 0; library code never exits the process itself.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from kubedevice._api import ENV_DEVICE_PLUGIN_DIR
from kubedevice.errors import KubeDeviceError
from kubedevice.log import (
    ENV_LOG_FORMAT,
    ENV_LOG_LEVEL,
    add_log_arguments,
    configure_logging_from_args,
)
from kubedevice.plugin.base import DevicePlugin
from kubedevice.plugin.server import PluginServer
from kubedevice.signals import stop_on_signals

if TYPE_CHECKING:
    # Loaded by argument_parser() only: the daemons parse their flags with click, and
    # argparse is 0.3 MB of every process that imports the SDK.
    import argparse

__all__ = [
    "ENV_LOG_FORMAT",
    "ENV_LOG_LEVEL",
    "add_log_arguments",
    "argument_parser",
    "configure_logging_from_args",
    "main",
    "run",
    "serve",
]

log = logging.getLogger(__name__)


async def serve(
    *plugins: DevicePlugin,
    device_plugin_dir: str | os.PathLike[str] | None = None,
    stop: asyncio.Event | None = None,
    metrics_address: str | None = None,
    ready: asyncio.Event | None = None,
    **server_options: Any,
) -> None:
    """Serve ``plugins`` until ``stop`` is set (forever if ``None``), then stop cleanly.

    Args:
        *plugins: The plugins; each gets its own socket.
        device_plugin_dir: The device plugin directory (see :func:`resolve_device_plugin_dir`).
        stop: Set it to stop serving.
        metrics_address: ``host:port`` to expose Prometheus metrics on; ``None`` for none.
        ready: Set once every plugin is serving (registration continues in the background;
            with no device plugin directory yet, once they wait for it).
        **server_options: Further :class:`PluginServer` keyword arguments.

    Raises:
        InvalidResourceNameError: A plugin's resource name would be rejected by the kubelet.
        KubeDeviceError: A plugin could not be served, or its first device list was
            refused (see :meth:`PluginServer.wait_failed`).
    """
    for plugin in plugins:
        plugin.validated_resource_name()
    stop = stop or asyncio.Event()
    async with PluginServer(
        device_plugin_dir, metrics_address=metrics_address, **server_options
    ) as server:
        for plugin in plugins:
            await server.add(plugin)
        if ready is not None:
            ready.set()
        stopping = asyncio.ensure_future(stop.wait())
        failing = asyncio.ensure_future(server.wait_failed())
        try:
            await asyncio.wait((stopping, failing), return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
            failing.cancel()
            await asyncio.wait((stopping, failing))
            log.info("stopping")
        if not failing.cancelled():
            raise failing.result()


def run(
    *plugins: DevicePlugin,
    device_plugin_dir: str | os.PathLike[str] | None = None,
    metrics_address: str | None = None,
    **server_options: Any,
) -> int:
    """Serve ``plugins`` until SIGTERM or SIGINT, then stop cleanly. Blocks.

    Args:
        *plugins: The plugins; each gets its own socket.
        device_plugin_dir: The device plugin directory.
        metrics_address: ``host:port`` to expose Prometheus metrics on; ``None`` for none.
        **server_options: Further :class:`PluginServer` keyword arguments.

    Returns:
        0 after a clean stop.
    """

    async def _main() -> None:
        stop = asyncio.Event()
        with stop_on_signals(stop):
            await serve(
                *plugins,
                device_plugin_dir=device_plugin_dir,
                stop=stop,
                metrics_address=metrics_address,
                **server_options,
            )

    asyncio.run(_main())
    return 0


def argument_parser(description: str | None = None) -> argparse.ArgumentParser:
    """The command-line parser :func:`main` uses, for authors to add their own options.

    Flags: ``--device-plugin-dir`` (default ``$DP_DEVICE_PLUGIN_DIR``, else the
    kubelet's), ``--metrics-address``, ``--log-level`` (default ``$KUBEDEVICE_LOG_LEVEL``,
    else ``info``) and ``--log-format`` (default ``$KUBEDEVICE_LOG_FORMAT``, else
    ``text``). Add options, parse, build the plugins and pass the result on::

        parser = kubedevice.argument_parser("My device plugin.")
        parser.add_argument("--count", type=int, default=4)
        args = parser.parse_args()
        raise SystemExit(kubedevice.main(MyPlugin(args.count), args=args))

    Args:
        description: Shown by ``--help``.

    Returns:
        A new parser.
    """
    import argparse

    parser = argparse.ArgumentParser(
        description=description or "Run a Kubernetes device plugin.",
        epilog=f"Environment: {ENV_DEVICE_PLUGIN_DIR}, {ENV_LOG_LEVEL} and {ENV_LOG_FORMAT} "
        "give the defaults of --device-plugin-dir, --log-level and --log-format.",
    )
    # the help texts read as the `kubedevice` command's (tests/test_cli_help.py)
    parser.add_argument(
        "--device-plugin-dir",
        default=None,
        metavar="DIRECTORY",
        help="The kubelet's device-plugin directory (kubelet.sock and the plugins' sockets).  "
        f"[env var: {ENV_DEVICE_PLUGIN_DIR}; default: /var/lib/kubelet/device-plugins/]",
    )
    parser.add_argument(
        "--metrics-address",
        default=None,
        metavar="HOST:PORT",
        help="Serve Prometheus /metrics on this address.  [default: (off)]",
    )
    add_log_arguments(parser)
    return parser


def main(
    *plugins: DevicePlugin,
    argv: Sequence[str] | None = None,
    args: argparse.Namespace | None = None,
) -> int:
    """Parse the standard flags, configure logging for the process and :func:`run` ``plugins``.

    Logging is set up for every logger of the process (the plugin's own included), on
    stderr, at ``--log-level`` in ``--log-format``. To add options of your own, use
    :func:`argument_parser` and pass the parsed ``args``.

    Args:
        *plugins: The plugins to serve.
        argv: The arguments (``sys.argv[1:]`` when ``None``); ignored with ``args``.
        args: Arguments already parsed by a parser from :func:`argument_parser`.

    Returns:
        The exit status: 0 after a clean stop, 2 when the flags, the environment or a
        plugin is unusable.
    """
    if args is None:
        args = argument_parser().parse_args(argv)
    if not configure_logging_from_args(args):
        return 2
    try:
        return run(
            *plugins, device_plugin_dir=args.device_plugin_dir, metrics_address=args.metrics_address
        )
    except KubeDeviceError as exc:
        log.error("%s", exc)
        return 2

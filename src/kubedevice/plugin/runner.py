"""Ways to run plugins: ``serve()`` (coroutine), ``run()`` (blocking), ``main()`` (CLI).

``run`` and ``main`` turn SIGTERM/SIGINT into a clean stop (streams end, sockets removed)
and return 0; library code never exits the process itself.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
from collections.abc import Sequence
from typing import Any

from kubedevice._api import ENV_DEVICE_PLUGIN_DIR
from kubedevice.errors import KubeDeviceError
from kubedevice.plugin.base import DevicePlugin
from kubedevice.plugin.server import PluginServer
from kubedevice.signals import stop_on_signals

__all__ = ["main", "run", "serve"]

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
        ready: Set once every plugin is serving (registration continues in the background).
        **server_options: Further :class:`PluginServer` keyword arguments.

    Raises:
        InvalidResourceNameError: A plugin's resource name would be rejected by the kubelet.
        KubeDeviceError: A plugin could not be served.
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
        try:
            await stop.wait()
        finally:
            log.info("stopping")


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


def main(*plugins: DevicePlugin, argv: Sequence[str] | None = None) -> int:
    """Parse the standard flags, configure logging and :func:`run` ``plugins``.

    Flags: ``--device-plugin-dir`` (default ``$DP_DEVICE_PLUGIN_DIR`` or the kubelet's),
    ``--metrics-address``, ``--log-level``, ``--log-format``.

    Args:
        *plugins: The plugins to serve.
        argv: The arguments (``sys.argv[1:]`` when ``None``).

    Returns:
        The exit status: 0 after a clean stop, 2 when a plugin cannot be served.
    """
    parser = argparse.ArgumentParser(description="Run a Kubernetes device plugin.")
    parser.add_argument(
        "--device-plugin-dir",
        default=None,
        help=f"kubelet device plugin directory (default: ${ENV_DEVICE_PLUGIN_DIR} or "
        "/var/lib/kubelet/device-plugins)",
    )
    parser.add_argument("--metrics-address", default=None, help="host:port for Prometheus metrics")
    parser.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"]
    )
    parser.add_argument("--log-format", default="text", choices=["text", "json"])
    args = parser.parse_args(argv)
    from kubedevice.log import configure_logging

    configure_logging(fmt=args.log_format, level=args.log_level)
    try:
        return run(
            *plugins, device_plugin_dir=args.device_plugin_dir, metrics_address=args.metrics_address
        )
    except KubeDeviceError as exc:
        log.error("%s", exc)
        return 2

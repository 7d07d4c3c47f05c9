"""``kubedevice inspect``: print what a node's device plugins, checkpoint and PodResources say.

No logic here: options are parsed, :mod:`kubedevice.inspect` does the work. Exit status 0
when nothing is wrong, 1 when problems are flagged, 2 when an input could not be read (the
rest is still shown).
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import click

from kubedevice.cli.options import (
    OUTPUT_HELP,
    POD_RESOURCES_BESIDE,
    device_plugin_dir_option,
    pod_resources_socket_option,
)

__all__ = ["COMMANDS"]

_STREAM_WARNING = (
    "warning: --list-and-watch opens a second ListAndWatch stream on every plugin. Plugins "
    "built on the upstream Go stub (NVIDIA's among them) feed all their streams from one "
    "update channel and never end a stream whose client left: after this run the kubelet "
    "can miss health updates from them (about every other one) until the plugin restarts."
)


@click.command("inspect")
@device_plugin_dir_option()
@pod_resources_socket_option(POD_RESOURCES_BESIDE)
@click.option(
    "-o",
    "--output",
    type=click.Choice(["table", "json"]),
    default="table",
    show_default=True,
    help=OUTPUT_HELP,
)
@click.option(
    "--timeout",
    type=click.FloatRange(0.1, 60),
    default=2.0,
    show_default=True,
    help="Seconds each socket (and each PodResources call) gets to answer.",
)
@click.option(
    "--list-and-watch",
    "list_and_watch",
    is_flag=True,
    help="Also open a ListAndWatch stream on each plugin for its own device list (health "
    "as the plugin sees it, NUMA); see the warning it prints before using it.",
)
def inspect_command(
    device_plugin_dir: str,
    pod_resources_socket: str | None,
    output: str,
    timeout: float,
    list_and_watch: bool,
) -> None:
    """Inspect a node's device plugins (read-only; works on the emulator and a real kubelet).

    Reads the kubelet's own view: kubelet_internal_checkpoint (its checksum verified; the
    healthy devices at the kubelet's last write, and the allocations) and PodResources List
    and GetAllocatableResources (healthy devices, NUMA, which pod holds what). Each plugin
    socket is only dialled to tell a live plugin from a stale socket file (connect,
    GetDevicePluginOptions). Flags sockets that do not answer, stale socket files,
    resources without healthy devices, a checksum mismatch, and devices the checkpoint
    holds for pods PodResources no longer lists.

    Exit status: 0 nothing wrong, 1 problems flagged, 2 an input could not be read.
    """
    from kubedevice.inspect import inspect_node, safe, to_json, to_text

    if list_and_watch:
        click.echo(_STREAM_WARNING, err=True)

    # Absolute: gRPC's unix:// target does not take a relative path.
    dp_dir = Path(os.path.abspath(device_plugin_dir))
    if pod_resources_socket is None:
        pr_socket = Path(os.path.normpath(dp_dir / ".." / "pod-resources" / "kubelet.sock"))
    else:
        pr_socket = Path(os.path.abspath(pod_resources_socket))
    report = asyncio.run(
        inspect_node(dp_dir, pr_socket, timeout=timeout, stream_plugins=list_and_watch)
    )
    if output == "json":
        click.echo(json.dumps(to_json(report), indent=2))
    else:
        click.echo(to_text(report))
    for error in report.input_errors:
        click.echo(f"error: {safe(error)}", err=True)
    if report.input_errors:
        raise SystemExit(2)
    if report.findings:
        raise SystemExit(1)


COMMANDS: list[click.Command] = [inspect_command]

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

from kubedevice._api import DEFAULT_DEVICE_PLUGIN_DIR, ENV_DEVICE_PLUGIN_DIR

__all__ = ["COMMANDS"]

_DEFAULT_POD_RESOURCES = "/var/lib/kubelet/pod-resources/kubelet.sock"


@click.command("inspect")
@click.option(
    "--device-plugin-dir",
    envvar=ENV_DEVICE_PLUGIN_DIR,
    default=None,
    help=f"Kubelet device plugin directory [default: {DEFAULT_DEVICE_PLUGIN_DIR}].",
)
@click.option(
    "--pod-resources-socket",
    default=None,
    help="PodResources socket [default: DIR/../pod-resources/kubelet.sock, i.e. "
    f"{_DEFAULT_POD_RESOURCES}].",
)
@click.option(
    "-o",
    "--output",
    type=click.Choice(["table", "json"]),
    default="table",
    show_default=True,
    help="A report with tables, or one JSON document.",
)
@click.option(
    "--timeout",
    type=click.FloatRange(0.1, 60),
    default=2.0,
    show_default=True,
    help="Seconds each socket gets to answer.",
)
def inspect_command(
    device_plugin_dir: str | None, pod_resources_socket: str | None, output: str, timeout: float
) -> None:
    """Inspect a node's device plugins (read-only; works on the emulator and a real kubelet).

    Dials every plugin socket (options, first ListAndWatch list: devices, health, NUMA), reads
    kubelet_internal_checkpoint and verifies its checksum, and maps devices to pods with
    PodResources List and GetAllocatableResources. Flags sockets that do not answer, stale
    socket files, Unhealthy devices, a checksum mismatch, and devices the checkpoint holds for
    pods PodResources no longer lists.

    Exit status: 0 nothing wrong, 1 problems flagged, 2 an input could not be read.
    """
    from kubedevice.inspect import inspect_node, to_json, to_text

    # Absolute: gRPC's unix:// target does not take a relative path.
    dp_dir = Path(os.path.abspath(device_plugin_dir or DEFAULT_DEVICE_PLUGIN_DIR))
    if pod_resources_socket is None:
        pr_socket = Path(os.path.normpath(dp_dir / ".." / "pod-resources" / "kubelet.sock"))
    else:
        pr_socket = Path(os.path.abspath(pod_resources_socket))
    report = asyncio.run(inspect_node(dp_dir, pr_socket, timeout=timeout))
    if output == "json":
        click.echo(json.dumps(to_json(report), indent=2))
    else:
        click.echo(to_text(report))
    for error in report.input_errors:
        click.echo(f"error: {error}", err=True)
    if report.input_errors:
        raise SystemExit(2)
    if report.findings:
        raise SystemExit(1)


COMMANDS: list[click.Command] = [inspect_command]

"""`kubedevice kubelet` (run the emulator; `restart`), `kubedevice pod ...`, `kubedevice node`.

Thin click layer: ``kubelet`` runs ``kubedevice.kubelet.Emulator`` in the foreground; the
other commands talk to a running emulator over its control socket (derived from the
device-plugin dir). Exit codes: 0 ok, 1 error (emulator unreachable, pod not found...),
2 invalid manifest or usage, 3 pod rejected at admission.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import click

from kubedevice.cli.options import (
    OUTPUT_HELP,
    POD_RESOURCES_BESIDE,
    device_plugin_dir_option,
    pod_resources_socket_option,
)
from kubedevice.errors import ManifestError
from kubedevice.kubelet import Emulator
from kubedevice.kubelet.admission import POLICIES, SCOPES
from kubedevice.kubelet.control import MAX_REQUEST_BYTES, call, control_socket_path
from kubedevice.kubelet.pods import decode_manifest, load_manifests, parse_pod
from kubedevice.kubelet.render import node_text, pods_table, runtime_text
from kubedevice.kubelet.sockets import process_start_ns
from kubedevice.signals import stop_on_signals

__all__ = ["COMMANDS"]

EXIT_ERROR = 1
EXIT_MANIFEST = 2
EXIT_REJECTED = 3

_dir_option = device_plugin_dir_option(Path)
_output_option = click.option(
    "-o",
    "--output",
    type=click.Choice(["table", "json"]),
    default="table",
    show_default=True,
    help=OUTPUT_HELP,
)


class _Failed(Exception):
    """A request the emulator refused (or could not be sent): exit code and message."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _send(
    device_plugin_dir: Path, req: dict[str, Any], timeout: float = 60.0, wait: float = 0.0
) -> Any:
    """One control request; ``_Failed`` with the CLI's exit code on any error."""
    path = control_socket_path(device_plugin_dir)
    try:
        reply = call(
            path,
            req,
            timeout,
            wait_for_server=wait,
            on_wait=lambda: click.echo(f"waiting for the emulator at {path} ...", err=True),
            on_progress=lambda note: click.echo(note, err=True),
        )
    except (OSError, ValueError) as exc:
        raise _Failed(EXIT_ERROR, f"cannot reach the emulator at {path}: {exc}") from exc
    if not reply.get("ok"):
        err = reply.get("error") or {}
        if err.get("type") == "AdmissionError":
            msg = f"pod rejected: {err.get('reason')}: {err.get('message')}"
            raise _Failed(EXIT_REJECTED, msg)
        code = EXIT_MANIFEST if err.get("type") == "ManifestError" else EXIT_ERROR
        raise _Failed(code, str(err.get("message")))
    return reply.get("result")


def _request(
    device_plugin_dir: Path, req: dict[str, Any], timeout: float = 60.0, wait: float = 0.0
) -> Any:
    try:
        return _send(device_plugin_dir, req, timeout, wait)
    except _Failed as f:
        click.echo(f"error: {f.message}", err=True)
        sys.exit(f.code)


# ---------------------------------------------------------------------------- kubelet


@click.group("kubelet", invoke_without_command=True)
@_dir_option
@click.option(
    "--grace-period",
    type=float,
    default=300.0,
    show_default=True,
    help="Seconds a disconnected resource is kept before removal.",
)
@click.option(
    "--per-socket-clients",
    is_flag=True,
    help="Key plugin clients by (resource, socket) (kubernetes PR #135437) "
    "instead of by resource name (released kubelets, kubernetes#121994).",
)
@click.option(
    "--topology-manager-policy",
    type=click.Choice(POLICIES),
    default="none",
    show_default=True,
    help="The kubelet's topology manager policy (NUMA alignment of devices).",
)
@click.option(
    "--topology-manager-scope",
    type=click.Choice(SCOPES),
    default="container",
    show_default=True,
    help="Align each container on its own, or the whole pod.",
)
@pod_resources_socket_option(POD_RESOURCES_BESIDE, Path)
@click.pass_context
def kubelet(
    ctx: click.Context,
    device_plugin_dir: Path,
    grace_period: float,
    per_socket_clients: bool,
    topology_manager_policy: str,
    topology_manager_scope: str,
    pod_resources_socket: Path | None,
) -> None:
    """Run the kubelet device-manager emulator in the foreground."""
    if ctx.invoked_subcommand is not None:
        return
    emu = Emulator(
        device_plugin_dir,
        grace_period_s=grace_period,
        per_socket_clients=per_socket_clients,
        pod_resources_socket=pod_resources_socket,
        started_ns=_started_ns(),
        topology_manager_policy=topology_manager_policy,
        topology_manager_scope=topology_manager_scope,
    )

    async def run() -> None:
        stop = asyncio.Event()
        with stop_on_signals(stop):
            await emu.start()
            for problem in emu.checkpoint_errors:
                click.echo(f"warning: checkpoint: {problem}", err=True)
            click.echo(
                f"kubelet emulator serving {emu.kubelet_socket} "
                f"(control {emu.control_socket}, pod-resources {emu.pod_resources_socket})",
                err=True,
            )
            try:
                await stop.wait()
            finally:
                await emu.stop()

    try:
        asyncio.run(run())
    except OSError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_ERROR)


def _started_ns() -> int | None:
    """This process's start, less a margin: a file's ctime may lag the clock by a tick
    (4 ms), so a socket a plugin made just after we started must still count as newer."""
    start = process_start_ns()
    return None if start is None else start - 20_000_000


@kubelet.command("restart")
@_dir_option
def kubelet_restart(device_plugin_dir: Path) -> None:
    """Simulate a kubelet restart on the running emulator."""
    _request(device_plugin_dir, {"op": "restart"})
    click.echo("kubelet restarted")


# ---------------------------------------------------------------------------- pod


@click.group("pod")
def pod() -> None:
    """Apply, delete and inspect pods on a running emulator."""


@pod.command("apply")
@_dir_option
@click.option("-f", "--filename", required=True, help="Manifest file (YAML or JSON; - = stdin).")
@_output_option
def pod_apply(device_plugin_dir: Path, filename: str, output: str) -> None:
    """Validate and admit the pods of a manifest (multi-document allowed)."""
    try:
        raw = sys.stdin.buffer.read() if filename == "-" else Path(filename).read_bytes()
        docs = load_manifests(decode_manifest(raw))
        seen: dict[tuple[str, str], int] = {}
        for i, d in enumerate(docs, 1):  # validate every object first: nothing is admitted
            spec = parse_pod(d)  # from a bad file
            key = (spec.namespace, spec.name)
            if key in seen:
                raise ManifestError(
                    f'pod "{spec.namespace}/{spec.name}" appears twice in the manifest '
                    f"(objects {seen[key]} and {i}); nothing was applied"
                )
            seen[key] = i
            if len(json.dumps({"op": "apply", "manifest": d})) >= MAX_REQUEST_BYTES:
                raise ManifestError(f"manifest too large (limit {MAX_REQUEST_BYTES >> 20} MiB)")
    except OSError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_MANIFEST)
    except ManifestError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_MANIFEST)
    results: list[Any] = []
    failure: _Failed | None = None
    for d in docs:
        try:
            results.append(_send(device_plugin_dir, {"op": "apply", "manifest": d}))
        except _Failed as f:
            failure = f
            break
    if output == "json":
        if len(docs) != 1:
            click.echo(json.dumps(results, indent=2))
        elif results:
            click.echo(json.dumps(results[0], indent=2))
    elif results:
        for r in results:
            click.echo(f"pod/{r['name']} admitted")
        click.echo(pods_table(results))
    if failure is not None:
        click.echo(f"error: {failure.message}", err=True)
        sys.exit(failure.code)


@pod.command("delete")
@_dir_option
@click.argument("name")
@click.option(
    "-n", "--namespace", default="default", show_default=True, help="The pod's namespace."
)
def pod_delete(device_plugin_dir: Path, name: str, namespace: str) -> None:
    """Delete a pod and free its devices."""
    _request(device_plugin_dir, {"op": "delete", "name": name, "namespace": namespace})
    click.echo(f'pod "{name}" deleted')


@pod.command("get")
@_dir_option
@click.argument("name")
@click.option(
    "-n", "--namespace", default="default", show_default=True, help="The pod's namespace."
)
@_output_option
def pod_get(device_plugin_dir: Path, name: str, namespace: str, output: str) -> None:
    """Show what each container of a pod got (devices and runtime view)."""
    p = _request(device_plugin_dir, {"op": "get", "name": name, "namespace": namespace})
    click.echo(json.dumps(p, indent=2) if output == "json" else runtime_text(p))


@pod.command("list")
@_dir_option
@click.option(
    "-n", "--namespace", default=None, show_default="all", help="Only this namespace's pods."
)
@_output_option
def pod_list(device_plugin_dir: Path, namespace: str | None, output: str) -> None:
    """List admitted pods and their devices."""
    pods = _request(device_plugin_dir, {"op": "list", "namespace": namespace})
    click.echo(json.dumps(pods, indent=2) if output == "json" else pods_table(pods))


# ---------------------------------------------------------------------------- node


@click.command("node")
@_dir_option
@_output_option
@click.option(
    "--wait-for",
    "wait_for",
    default=None,
    show_default="no wait",
    metavar="RESOURCE",
    help="First wait (for the emulator to start, then) until RESOURCE is listed.",
)
@click.option(
    "--allocatable",
    type=int,
    default=None,
    show_default="any",
    help="With --wait-for: wait until RESOURCE has this many allocatable devices.",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0.1),
    default=10.0,
    show_default=True,
    help="Seconds --wait-for waits at most.",
)
def node(
    device_plugin_dir: Path,
    output: str,
    wait_for: str | None,
    allocatable: int | None,
    timeout: float,
) -> None:
    """Capacity, allocatable and per-device health (like kubectl describe node)."""
    if wait_for is not None:
        req = {"op": "wait", "resource": wait_for, "allocatable": allocatable, "timeout": timeout}
        # also waits for an emulator that is still starting (`kubedevice kubelet &` just before)
        _request(device_plugin_dir, req, timeout=max(60.0, timeout + 10.0), wait=timeout)
    n = _request(device_plugin_dir, {"op": "node"})
    if output == "json":
        click.echo(json.dumps(n, indent=2))
        return
    click.echo(node_text(n))


COMMANDS: list[click.Command] = [kubelet, pod, node]

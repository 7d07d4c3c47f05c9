"""``kubedevice advertise``: set or remove extended resources in a node's status capacity.

No logic here: :mod:`kubedevice.advertise` builds and sends the patch. Bad arguments and
every API error are one line on stderr and exit status 2.
"""

from __future__ import annotations

import click

from kubedevice.errors import KubeDeviceError
from kubedevice.kubeconfig import KUBECONFIG_DEFAULT, KUBECONFIG_HELP

__all__ = ["COMMANDS"]


@click.command("advertise")
@click.argument("node")
@click.argument("resources", nargs=-1, metavar="[RESOURCE=COUNT]...")
@click.option(
    "--remove",
    "remove",
    multiple=True,
    metavar="RESOURCE",
    help="Remove RESOURCE from the node's capacity (repeatable).",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Print the request (URL, every header, body); send nothing, load no credentials "
    "(no kubeconfig needed: the server is then shown as <api-server>).",
)
@click.option(
    "--kubeconfig",
    default=None,
    show_default=KUBECONFIG_DEFAULT,
    type=click.Path(dir_okay=False),
    help=KUBECONFIG_HELP,
)
@click.option(
    "--context",
    default=None,
    show_default="the kubeconfig's current context",
    help="The kubeconfig context to use.",
)
@click.option(
    "--timeout",
    type=click.FloatRange(0.1, 300),
    default=30.0,
    show_default=True,
    help="Seconds for the whole request: connect, send, and the complete answer.",
)
def advertise_command(
    node: str,
    resources: tuple[str, ...],
    remove: tuple[str, ...],
    dry_run: bool,
    kubeconfig: str | None,
    context: str | None,
    timeout: float,
) -> None:
    """Advertise extended resources on NODE without a device plugin.

    Sends PATCH /api/v1/nodes/NODE/status (application/json-patch+json) with an "add" of
    /status/capacity/<resource> per RESOURCE=COUNT and a "remove" per --remove, using the
    credentials of the kubeconfig (or the pod's service account). A running kubelet copies
    capacity to allocatable at its next status update; without one, allocatable is not
    changed. Example: kubedevice advertise node-1 example.com/dongle=4
    """
    from kubedevice.advertise import build_patch, load_connection, read_target, send

    try:
        request = build_patch(node, resources, remove)
        if dry_run:
            # plain file reads: no credential plugin runs, nothing is written or sent
            target = read_target(kubeconfig, context, dry_run=True)
            if target.source == "no kubeconfig":
                click.echo(
                    "note: no kubeconfig (none given, $KUBECONFIG unset, no ~/.kube/config, "
                    "not a pod): the API server is shown as <api-server>",
                    err=True,
                )
            click.echo(request.render(target.server, target.authorization))
            return
        capacity = send(load_connection(kubeconfig, context), request, timeout)
    except KubeDeviceError as exc:
        click.echo(f"error: {exc}", err=True)
        raise SystemExit(2) from None
    for op, name in zip(request.operations, request.resources, strict=True):
        now = capacity.get(name)
        state = f"capacity {now}" if now is not None else "not in capacity"
        click.echo(f"{node}: {op['op']} {name}: {state}")


COMMANDS: list[click.Command] = [advertise_command]

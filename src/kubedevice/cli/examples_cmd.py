"""``kubedevice examples``: print the files a user needs that are not Python.

The plain DaemonSet manifests and the DRA driver template (``deploy/*.yaml``) and the
generic plugin's example configs (``examples/*.yaml``) ship inside the package
(``kubedevice/examples/``), so an installation from a wheel has them too:
``kubedevice examples kubedevice.yaml | kubectl apply -f -``.
tests/deploy/test_examples_shipped.py keeps each copy equal to its source in the repository.
"""

from __future__ import annotations

from importlib.resources import files

import click

__all__ = ["COMMANDS", "shipped"]


def shipped() -> dict[str, str]:
    """Name -> text of every shipped example, sorted by name."""
    root = files("kubedevice") / "examples"
    return {
        entry.name: entry.read_text(encoding="utf-8")
        for entry in sorted(root.iterdir(), key=lambda e: e.name)
        if entry.name.endswith(".yaml")
    }


def _summary(text: str) -> str:
    for line in text.splitlines():
        if line.startswith("#"):
            return line.lstrip("# ").strip()
    return ""


@click.command("examples")
@click.argument("name", required=False)
def examples_command(name: str | None) -> None:
    """List the shipped example files, or print NAME.

    kubedevice.yaml and kubedevice-nvidia.yaml are the plain manifests (what the Helm chart
    renders with its defaults), kubedevice-dra-driver.yaml a DaemonSet template for your own
    DRA driver; the others are configs for the generic /dev plugin.
    Example: kubedevice examples fuse.yaml > my-devices.yaml
    """
    found = shipped()
    if name is None:
        width = max(len(n) for n in found)
        for key, text in found.items():
            click.echo(f"{key:<{width}}  {_summary(text)}")
        return
    if name not in found:
        click.echo(f"error: no example named {name!r}; one of: {', '.join(found)}", err=True)
        raise SystemExit(2)
    click.echo(found[name], nl=False)


COMMANDS: list[click.Command] = [examples_command]

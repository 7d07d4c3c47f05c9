"""Every option the rendered DaemonSets pass exists on the command they run."""

from __future__ import annotations

import click
import pytest

from deploy.render import container, daemonset, render
from kubedevice.cli.main import SUBCOMMANDS, cli


def _command(path: list[str]) -> click.Command:
    ctx = click.Context(cli)
    cmd: click.Command = cli
    for name in path:
        assert isinstance(cmd, click.Group), f"{name}: {cmd.name} has no subcommands"
        sub = cmd.get_command(ctx, name)
        assert sub is not None, f"no command {name!r}"
        cmd = sub
    return cmd


@pytest.mark.parametrize(
    ("component", "depth"), [("generic", 1), ("nvidia", 2)], ids=["generic", "nvidia"]
)
def test_rendered_options_exist(component: str, depth: int) -> None:
    docs = render(values={"nvidia.enabled": "true"})
    args = container(daemonset(docs, component))["args"]
    assert args[0] in SUBCOMMANDS, f"`kubedevice {args[0]}` does not exist"
    cmd = _command(args[:depth])
    known = {opt for p in cmd.params for opt in p.opts if opt.startswith("--")}
    passed = [a for a in args[depth:] if a.startswith("--")]
    assert passed, args
    assert sorted(set(passed) - known) == [], f"kubedevice {' '.join(args[:depth])}: {known}"

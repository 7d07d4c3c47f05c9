"""PluginSwap: a PluginServer's plugins changed all or nothing (what both daemons reload with)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from sdk_helpers import StaticPlugin

import kubedevice
from kubedevice.errors import ConfigError
from kubedevice.plugin.swap import PluginSwap

DEVS = [kubedevice.Device("d0")]


def _plugin(resource: str, socket_name: str | None = None) -> StaticPlugin:
    plugin = StaticPlugin(DEVS, resource)
    plugin.socket_name = socket_name
    return plugin


def _sockets(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if stat.S_ISSOCK(p.lstat().st_mode))


async def _serving(server: kubedevice.PluginServer, *names: str) -> list[StaticPlugin]:
    plugins = [_plugin(n) for n in names]
    for p in plugins:
        await server.add(p)
    return plugins


@pytest.mark.parametrize(
    ("new", "says"),
    [
        (_plugin("example.com/c", "example.com-a.sock"), "already used by example.com/a"),
        (_plugin("example.com/a"), "would be served twice"),
        (_plugin("example.com/c", "c" * 120 + ".sock"), "longer than 107 bytes"),
        (_plugin("example.com/c", "../c.sock"), "must be a bare file name"),
        (_plugin("kubernetes.io/c"), "kubernetes.io"),
    ],
    ids=["socket-clash", "twice", "too-long", "not-bare", "bad-resource"],
)
async def test_check_refuses_before_touching_anything(
    server: kubedevice.PluginServer, sock_dir: Path, new: StaticPlugin, says: str
) -> None:
    _, b = await _serving(server, "example.com/a", "example.com/b")
    before = _sockets(sock_dir)
    swap = PluginSwap(server, add=[new], remove=[b])
    with pytest.raises(ConfigError, match=says):
        await swap.apply()
    assert server.resource_names == ("example.com/a", "example.com/b")
    assert _sockets(sock_dir) == before


async def test_a_bind_failure_is_undone_and_a_freed_socket_served_again(
    server: kubedevice.PluginServer, sock_dir: Path
) -> None:
    _, b = await _serving(server, "example.com/a", "example.com/b")
    (sock_dir / "example.com-d.sock").write_text("not a socket")  # the second bind fails
    takes_b = _plugin("example.com/c", "example.com-b.sock")  # needs b's socket freed first
    swap = PluginSwap(server, add=[takes_b, _plugin("example.com/d")], remove=[b])
    with pytest.raises(ConfigError, match=r"exists and is not a socket; .*nothing was changed"):
        await swap.apply()
    assert sorted(server.resource_names) == ["example.com/a", "example.com/b"]
    assert _sockets(sock_dir) == ["example.com-a.sock", "example.com-b.sock"]


async def test_apply_then_finish_or_undo(server: kubedevice.PluginServer, sock_dir: Path) -> None:
    a, b = await _serving(server, "example.com/a", "example.com/b")
    c = _plugin("example.com/c", "example.com-b.sock")
    swap = PluginSwap(server, add=[c], remove=[a, b])
    await swap.apply()  # b was freed for c; a still serves until finish()
    assert sorted(server.resource_names) == ["example.com/a", "example.com/c"]
    await swap.undo()  # a later step failed: back to a and b
    assert sorted(server.resource_names) == ["example.com/a", "example.com/b"]
    swap = PluginSwap(server, add=[_plugin("example.com/c", "example.com-b.sock")], remove=[a, b])
    await swap.apply()
    await swap.finish()
    assert server.resource_names == ("example.com/c",)
    assert _sockets(sock_dir) == ["example.com-b.sock"]

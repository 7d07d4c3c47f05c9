"""kubedevice.plugin.unixsock: a gRPC server's socket put in place with mode 0600, safely."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import grpc
import pytest

from kubedevice.errors import PluginServerError
from kubedevice.plugin import unixsock


def _leftovers(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir() if p.name.startswith(".kd-"))


async def test_socket_appears_with_mode_0600_and_no_temporary_name(sock_dir: Path) -> None:
    path = sock_dir / "a.sock"
    server = grpc.aio.server()
    bound = unixsock.bind_in_place(server, path, unixsock.temp_path(path), replace=False)
    try:
        st = path.lstat()
        assert stat.S_ISSOCK(st.st_mode)
        assert stat.S_IMODE(st.st_mode) == 0o600
        assert unixsock.socket_identity(path) == bound
        assert _leftovers(sock_dir) == []
        await server.start()
        with socket.socket(socket.AF_UNIX) as c:
            c.connect(str(path))  # it is our listening socket
    finally:
        await server.stop(None)


async def test_a_file_that_appeared_at_the_path_is_never_replaced(sock_dir: Path) -> None:
    path = sock_dir / "a.sock"
    for replace in (False, True):
        path.write_text("someone else's")
        server = grpc.aio.server()
        with pytest.raises(PluginServerError, match="appeared while we were binding"):
            unixsock.bind_in_place(server, path, unixsock.temp_path(path), replace=replace)
        await server.stop(None)
        assert path.read_text() == "someone else's"
        assert _leftovers(sock_dir) == []
        path.unlink()


async def test_a_stale_socket_is_replaced_only_when_asked(sock_dir: Path) -> None:
    path = sock_dir / "a.sock"
    with socket.socket(socket.AF_UNIX) as stale:
        stale.bind(str(path))
    old = unixsock.socket_identity(path)
    assert old is not None
    server = grpc.aio.server()
    with pytest.raises(PluginServerError, match="appeared while we were binding"):
        unixsock.bind_in_place(server, path, unixsock.temp_path(path), replace=False)
    await server.stop(None)
    assert unixsock.socket_identity(path) == old
    server = grpc.aio.server()
    bound = unixsock.bind_in_place(server, path, unixsock.temp_path(path), replace=True)
    await server.stop(None)
    assert bound != old
    assert unixsock.socket_identity(path) == bound


async def test_our_socket_removed_before_the_link_is_reported_as_wiped(
    sock_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = sock_dir / "a.sock"
    real_chmod = os.chmod

    def wipe_then_chmod(p: str | Path, mode: int) -> None:
        Path(p).unlink()  # the kubelet emptying its directory as it restarts
        real_chmod(p, mode)

    monkeypatch.setattr(unixsock.os, "chmod", wipe_then_chmod)
    server = grpc.aio.server()
    with pytest.raises(unixsock.SocketWiped, match="removed while we were binding"):
        unixsock.bind_in_place(server, path, unixsock.temp_path(path), replace=False)
    await server.stop(None)
    assert not path.exists()


def test_too_long_a_path_is_refused_with_the_hint(tmp_path: Path) -> None:
    long = tmp_path / ("x" * 120)
    with pytest.raises(PluginServerError, match=r"longer than 107 bytes; use less"):
        unixsock.check_path_length(Path("/ok.sock"), long, hint="use less")
    unixsock.check_path_length(Path("/ok.sock"), hint="unused")


def test_identity_is_none_for_anything_but_a_socket(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_text("")
    (tmp_path / "link").symlink_to(f)
    assert unixsock.socket_identity(f) is None
    assert unixsock.socket_identity(tmp_path / "link") is None
    assert unixsock.socket_identity(tmp_path / "missing") is None
    assert unixsock.temp_path(f) != unixsock.temp_path(f)

"""Every dial is bounded: a stream that never sends, a PodResources socket that never answers."""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path
from typing import Any

from kubedevice.inspect import inspect_node
from kubedevice.kubelet import Emulator
from node_inspect.helpers import FOO

from rawplugin import RawPlugin, devs  # isort: skip (on sys.path through helpers)


class SilentStream(RawPlugin):
    """Answers GetDevicePluginOptions, then never sends a ListAndWatch message."""

    async def ListAndWatch(self, request: Any, context: Any) -> Any:
        await asyncio.Event().wait()
        yield  # pragma: no cover


async def test_list_and_watch_that_never_sends(emu: Emulator, dp_dir: Path) -> None:
    ok = RawPlugin(dp_dir, FOO, devs(2, prefix="ok-"))
    silent = SilentStream(dp_dir, "example.com/silent", name="silent.sock")
    await ok.start()
    await silent.serve()  # not registered: the emulator would wait on it too
    try:
        await emu.wait_for_resource(FOO, allocatable=2)
        start = time.monotonic()
        report = await inspect_node(
            dp_dir, emu.pod_resources_socket, timeout=0.5, stream_plugins=True
        )
        assert time.monotonic() - start < 2.0
        by_socket = {p.socket: p for p in report.plugins}
        assert by_socket["silent.sock"].state == "no-answer"
        assert "ListAndWatch got no answer within 0.5 s" in by_socket["silent.sock"].detail
        assert by_socket["silent.sock"].pre_start_required is False  # options were read
        assert by_socket["example.com_foo.sock"].state == "ok"
        assert by_socket["example.com_foo.sock"].resource == FOO
    finally:
        await silent.stop()
        await ok.stop()


async def test_pod_resources_socket_that_never_answers(dp_dir: Path, sock_dir: Path) -> None:
    pr = sock_dir / "pr.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(pr))
    s.listen(8)
    try:
        start = time.monotonic()
        report = await inspect_node(dp_dir, pr, timeout=0.5)
        assert time.monotonic() - start < 2.5
    finally:
        s.close()
    assert len(report.input_errors) == 1
    assert report.input_errors[0].startswith("PodResources List: no answer within")
    assert report.pod_resources is not None
    assert report.pod_resources.assigned == []


async def test_a_full_accept_backlog_is_reported_as_not_answering(sock_dir: Path) -> None:
    """A socket whose accept backlog is full is reported as not answering, at once."""
    from kubedevice.inspect.probe import probe_socket

    path = sock_dir / "full.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(0)  # never accepts
    waiting: list[socket.socket] = []
    try:
        for _ in range(8):  # fill the backlog: the next connect would block
            c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            c.setblocking(False)
            try:
                c.connect(str(path))
            except BlockingIOError:
                c.close()
                break
            waiting.append(c)
        result = await probe_socket(path, timeout=2.0)
        assert (result.state, result.detail) == (
            "no-answer",
            "its accept backlog is full: it does not accept connections",
        )
    finally:
        for c in waiting:
            c.close()
        server.close()

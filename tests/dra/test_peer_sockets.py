"""Sockets of other instances appearing in the plugin dir by the thousand (stale sockets of
killed instances, or planted ones): each event looks at its own socket once, never at every
socket seen so far, and the claim calls are answered meanwhile."""

from __future__ import annotations

import asyncio
import socket
import time
import uuid
from pathlib import Path

import pytest

import kubedevice.dra.node.server as server_module
from dra import clients
from dra.api import Api
from dra.conftest import create_claim, result
from dra.fakes import DRIVER, FakeDriver, gpus, server

pytestmark = pytest.mark.timeout(120)

UID_A = "0a0a0a0a-1111-4222-8333-555555555555"
SOCKETS = 1000


async def test_a_thousand_peer_sockets_cost_a_look_each(
    kdir: Path, kubeconfig: Path, node_name: str, api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    looks = 0
    is_socket = server_module._is_socket

    def counted(path: Path) -> bool:
        nonlocal looks
        looks += 1
        return is_socket(path)

    monkeypatch.setattr(server_module, "_is_socket", counted)
    claim = create_claim(
        api, "default", f"peers-{node_name}", results=[result("gpu", DRIVER, node_name, "gpu-0")]
    )
    ref = ("default", f"peers-{node_name}", claim["metadata"]["uid"])
    async with server(FakeDriver(gpus(1)), kdir, kubeconfig, node_name, pod_uid=UID_A) as srv:
        await srv.wait_published()
        made = []
        try:
            for i in range(SOCKETS):  # bound, not listening: what a killed instance leaves
                sock = socket.socket(socket.AF_UNIX)
                made.append(sock)
                sock.bind(str(srv.settings.plugin_dir / f"dra-{uuid.uuid4()}.sock"))
                if i % 10 == 0:
                    await asyncio.sleep(0)  # the events are handled as they come
            until = time.monotonic() + 60
            while len(srv._newer) < SOCKETS and time.monotonic() < until:
                await asyncio.sleep(0.05)  # the last events, still on their way
            assert len(srv._newer) == SOCKETS
            print(f"\n{SOCKETS} peer sockets: {looks} looks at a socket")
            assert looks < 3 * SOCKETS  # before: about SOCKETS**2 / 2 (500,000)
            answer = (await clients.prepare(srv.settings.dra_socket, [ref], timeout=10)).claims
            assert answer[ref[2]].error == ""
            assert srv.publisher is not None
            assert not srv.publisher.deferring  # none of them answers as this driver
        finally:
            for sock in made:
                sock.close()

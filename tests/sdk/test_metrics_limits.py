"""The device plugins' metrics port under 1,100 idle connections (real TCP)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from pathlib import Path

import pytest

import kubedevice
from kubedevice.ports import free_port

pytestmark = pytest.mark.timeout(60)


def _get(port: int) -> tuple[bytes, float]:
    start = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        conn.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    return answer, time.perf_counter() - start


async def test_idle_connections_are_bounded_and_closed(sock_dir: Path) -> None:
    port = free_port()
    async with kubedevice.PluginServer(sock_dir, metrics_address=f"127.0.0.1:{port}"):
        threads = threading.active_count()
        idle: list[socket.socket] = []
        try:
            for _ in range(1100):  # connections that never send a byte
                conn = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                conn.setblocking(False)
                conn.connect_ex(("127.0.0.1", port))
                idle.append(conn)
            answer, seconds = await asyncio.to_thread(_get, port)
            added = threading.active_count() - threads
            last = idle[-1]  # closed by the server within its 5 s for the request
            last.setblocking(True)
            last.settimeout(15)
            with contextlib.suppress(ConnectionError):
                assert await asyncio.to_thread(last.recv, 1) == b""
        finally:
            for conn in idle:
                conn.close()
    assert answer.startswith(b"HTTP/1.1 200 ")
    assert b"kubedevice_plugin" in answer or b"# HELP" in answer or answer.endswith(b"\r\n\r\n")
    assert seconds < 1.0
    assert added <= 2, f"{added} threads for the connections"

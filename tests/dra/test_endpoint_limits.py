"""The driver's /metrics, /healthz and /readyz port under 1,100 idle connections: a real
driver process (with the common soft limit of 1,024 descriptors), real TCP connections."""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dra import clients
from dra.api import Api
from dra.conftest import create_claim, result
from dra.fakes import DRIVER, wait_for_path
from kubedevice.ports import free_port

pytestmark = pytest.mark.timeout(120)

TESTS = Path(__file__).resolve().parents[1]
IDLE = 1100
#: The driver's descriptors while 1,100 connections wait: its own (sockets, inotify, the
#: API client's connections, gRPC) plus at most the endpoint's limit (64).
FD_BOUND = 200


def _nofile_1024() -> None:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(1024, hard), hard))


@pytest.fixture
def driver(kdir: Path, kubeconfig: Path, node_name: str) -> Iterator[tuple[int, Path, int]]:
    """The driver process: its metrics port, its log and its pid."""
    state = kdir / "state"
    state.mkdir()
    (state / "go").touch()  # its prepare hook goes straight on
    port = free_port()
    log = kdir / "driver.log"
    argv = [
        sys.executable, "-m", "dra.proc_driver", "--state", str(state),
        "--node-name", node_name, "--kubeconfig", str(kubeconfig), "--kubelet-dir", str(kdir),
        "--cdi-dir", str(kdir / "cdi"), "--no-health", "--metrics-address", f"127.0.0.1:{port}",
    ]  # fmt: skip
    with log.open("w") as out:
        process = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, cwd=TESTS, preexec_fn=_nofile_1024
        )
    try:
        yield port, log, process.pid
    finally:
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _get(port: int, path: str, timeout: float) -> tuple[int, float]:
    """``GET path``: the status and the seconds it took."""
    start = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as conn:
        conn.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    return int(answer.split(b" ", 2)[1]), time.perf_counter() - start


async def test_idle_connections_are_bounded_and_the_driver_answers_fast(
    driver: tuple[int, Path, int], kdir: Path, api: Api, node_name: str
) -> None:
    port, log, pid = driver
    await wait_for_path(kdir / "plugins_registry" / f"{DRIVER}-reg.sock", timeout=30)
    claim = create_claim(
        api, "default", f"flood-{node_name}", results=[result("gpu", DRIVER, node_name, "gpu-0")]
    )
    ref = ("default", claim["metadata"]["name"], claim["metadata"]["uid"])
    dra_sock = kdir / "plugins" / DRIVER / "dra.sock"
    assert (await asyncio.to_thread(_get, port, "/healthz", 5))[0] == 200
    before_fds = _fds(pid)
    before_lines = len(log.read_text().splitlines())

    idle: list[socket.socket] = []
    try:
        for _ in range(IDLE):  # connections that never send a byte
            conn = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            conn.setblocking(False)
            conn.connect_ex(("127.0.0.1", port))
            idle.append(conn)
        healthz = await asyncio.to_thread(_get, port, "/healthz", 10)
        start = time.perf_counter()
        answer = await asyncio.wait_for(clients.prepare(dra_sock, [ref]), 30)
        prepare_s = time.perf_counter() - start
        during_fds = _fds(pid)
        # an idle connection is closed by the driver within its 5 s for the request
        last = idle[-1]
        last.setblocking(True)
        last.settimeout(15)
        with contextlib.suppress(ConnectionError):
            assert last.recv(1) == b""
    finally:
        for conn in idle:
            conn.close()
    lines = log.read_text().splitlines()[before_lines:]
    print(
        f"fds {before_fds} -> {during_fds}; /healthz {healthz[1] * 1000:.1f} ms; "
        f"prepare {prepare_s * 1000:.1f} ms; {len(lines)} log lines"
    )
    assert answer.claims[ref[2]].error == ""
    assert healthz[0] == 200
    assert healthz[1] < 1.0  # the kubelet's default probe timeout
    assert prepare_s < 1.0
    assert during_fds < FD_BOUND, f"{during_fds} descriptors open"
    assert len([line for line in lines if "ERROR" in line]) == 0, lines[:5]
    assert len(lines) <= 5, lines[:10]  # nothing per connection

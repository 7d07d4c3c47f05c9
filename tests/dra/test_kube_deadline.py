"""API calls against a slow API server (a real HTTP server that stalls or trickles):
one total deadline per call, local work never waits behind API calls, a prompt stop."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from dra import clients
from dra.conftest import REPO
from dra.fakes import DRIVER, FakeDriver, gpus, server
from dra.slowapi import slow_api
from kubedevice.dra.api.kube import API_WORKERS, DEFAULT_DEADLINE_S, KubeClient
from kubedevice.errors import KubeApiError

pytestmark = pytest.mark.timeout(90)

CLAIMS = "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims"
#: What tests/dra measure for the report (``pytest -s`` prints it as JSON lines).
FIGURES: dict[str, float] = {}


def _figure(name: str, value: float) -> None:
    FIGURES[name] = value
    print(json.dumps({name: round(value, 4)}))


def test_the_default_deadline_is_under_the_kubelets() -> None:
    assert DEFAULT_DEADLINE_S <= 30 < 45  # the kubelet gives NodePrepareResources 45 s


@pytest.mark.parametrize("how", ["stall", "trickle", "trickle-head"])
async def test_a_call_ends_at_its_deadline(tmp_path: Path, how: str) -> None:
    with slow_api() as api:
        api.on(CLAIMS, how, 0.3 if how != "stall" else 60)
        client = KubeClient.connect(api.kubeconfig(tmp_path / "kc"), deadline_s=1.5)
        try:
            t0 = time.monotonic()
            with pytest.raises(KubeApiError, match=r"no complete answer within 1\.5 s"):
                await asyncio.wait_for(client.get_claim("ns", "c"), 20)
            took = time.monotonic() - t0
        finally:
            client.close()
    _figure(f"deadline_1.5s_{how}_s", took)
    assert 1.4 <= took < 2.5
    assert len(api.requests) == 1  # a request that was sent is never sent again


async def test_close_ends_the_calls_in_flight_at_once(tmp_path: Path) -> None:
    with slow_api() as api:
        api.on(CLAIMS, "stall", 60)
        client = KubeClient.connect(api.kubeconfig(tmp_path / "kc"), deadline_s=30)
        calls = [asyncio.ensure_future(client.get_claim("ns", f"c{i}")) for i in range(3)]
        await asyncio.to_thread(api.wait_requests, lambda r: len(r) == 3)
        t0 = time.monotonic()
        client.close()
        results = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 5)
        took = time.monotonic() - t0
    assert all(isinstance(r, KubeApiError) for r in results), results
    assert took < 0.5


async def test_a_server_not_listening_is_tried_again_within_the_deadline(tmp_path: Path) -> None:
    with slow_api() as api:
        path = api.kubeconfig(tmp_path / "kc")
    # the server is gone: connections are refused
    client = KubeClient.connect(path, deadline_s=3)
    try:
        t0 = time.monotonic()
        with pytest.raises(KubeApiError, match="Connection refused"):
            await client.get_node("n")
        assert time.monotonic() - t0 < 3
    finally:
        client.close()


def _claim(uid: str, node: str) -> dict[str, Any]:
    return {
        "metadata": {"name": "fast", "namespace": "ns", "uid": uid},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "gpu", "driver": DRIVER, "pool": node, "device": "gpu-0"}
                    ]
                }
            }
        },
    }


async def test_unprepare_does_not_wait_behind_prepares_stuck_on_the_api_server(
    tmp_path: Path, kdir: Path
) -> None:
    node = "slow-node"
    with slow_api() as api:
        api.on(f"{CLAIMS}/fast", "json", _claim("uid-fast", node))
        api.on(f"{CLAIMS}/slow", "stall", 20)
        kube = KubeClient.connect(api.kubeconfig(tmp_path / "kc"))
        srv = server(FakeDriver(gpus(2)), kdir, tmp_path / "kc", node, publish=False)
        srv._kube = kube
        try:
            async with srv:
                sock = srv.settings.dra_socket
                answer = await clients.prepare(sock, [("ns", "fast", "uid-fast")])
                assert answer.claims["uid-fast"].error == ""
                # eight prepares, each waiting on a claim read that does not answer
                stuck = [
                    asyncio.ensure_future(clients.prepare(sock, [("ns", f"slow{i}", f"u{i}")]))
                    for i in range(8)
                ]
                await asyncio.to_thread(
                    api.wait_requests, lambda r: sum("/slow" in p for _m, p in r) == 8
                )
                t0 = time.monotonic()
                answer = await clients.unprepare(sock, [("ns", "fast", "uid-fast")])
                took = time.monotonic() - t0
                assert answer.claims["uid-fast"].error == ""
                api.release()
                await asyncio.wait_for(asyncio.gather(*stuck, return_exceptions=True), 30)
        finally:
            kube.close()
    _figure("unprepare_while_8_prepares_wait_ms", took * 1000)
    assert took < 0.5


def test_sigterm_exits_promptly_with_api_calls_in_flight(tmp_path: Path, kdir: Path) -> None:
    with slow_api() as api:
        api.on("/", "stall", 25)  # every call stalls: the slices' list, the Node
        proc = subprocess.Popen(
            [sys.executable, str(REPO / "examples" / "dra_minimal.py"), "--node-name", "n1",
             "--kubeconfig", str(api.kubeconfig(tmp_path / "kc")), "--kubelet-dir", str(kdir),
             "--cdi-dir", str(kdir / "cdi")],
            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
        try:
            api.wait_requests(lambda r: any("resourceslices" in p for _m, p in r), 30)
            t0 = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(40)
            took = time.monotonic() - t0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            assert proc.stderr is not None
            proc.stderr.close()
    _figure("sigterm_exit_with_a_call_in_flight_s", took)
    assert code == 0
    assert took < 2


async def test_a_tls_handshake_that_never_ends_is_given_up_at_the_deadline(tmp_path: Path) -> None:
    import socket
    import threading

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    accepted: list[socket.socket] = []
    threading.Thread(target=lambda: accepted.append(listener.accept()[0]), daemon=True).start()
    port = listener.getsockname()[1]
    path = tmp_path / "kc"
    path.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters: [{{name: c, cluster: {{server: 'https://127.0.0.1:{port}', "
        "insecure-skip-tls-verify: true}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\ncurrent-context: c\n"
    )
    client = KubeClient.connect(path, deadline_s=1.5)
    try:
        t0 = time.monotonic()
        with pytest.raises(KubeApiError, match=r"no complete answer within 1\.5 s"):
            await asyncio.wait_for(client.get_node("n"), 20)
        took = time.monotonic() - t0
    finally:
        client.close()
        listener.close()
        for conn in accepted:
            conn.close()
    assert 1.4 <= took < 2.5


async def test_time_waiting_for_a_free_thread_counts_against_the_deadline(tmp_path: Path) -> None:
    with slow_api() as api:
        api.on(CLAIMS, "stall", 60)
        client = KubeClient.connect(api.kubeconfig(tmp_path / "kc"), deadline_s=1.5)
        try:
            t0 = time.monotonic()
            # one more call than the client has threads: the last one waits for a thread
            calls = [client.get_claim("ns", f"c{i}") for i in range(API_WORKERS + 1)]
            results = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 20)
            took = time.monotonic() - t0
        finally:
            client.close()
    assert all(isinstance(r, KubeApiError) for r in results), results
    assert took < 2.5  # not 1.5 s more for the one that waited

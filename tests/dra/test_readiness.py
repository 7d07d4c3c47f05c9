"""/readyz follows the API server: a driver whose token is refused (403) or whose API server
cannot be reached is not ready (liveness unchanged), and is ready again once its calls work.
A real API server; a real TCP forwarder stands for the network between them."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml
from e2e.cluster import write_kubeconfig

from dra import clients
from dra.api import Api
from dra.fakes import DRIVER, FakeDriver, gpus, server
from dra.test_metrics import _fetch
from kubedevice.dra.node.server import DriverServer
from kubedevice.plugin.registration import Backoff
from kubedevice.ports import free_port

pytestmark = pytest.mark.timeout(90)


def _cluster(kubeconfig: Path) -> tuple[str, Path, str]:
    """The server, CA file and token of ``kubeconfig``."""
    config = yaml.safe_load(kubeconfig.read_text())
    cluster = config["clusters"][0]["cluster"]
    return (
        cluster["server"],
        Path(cluster["certificate-authority"]),
        config["users"][0]["user"]["token"],
    )


async def _until(port: int, status: int, contains: str = "", timeout: float = 30) -> str:
    """Ask /readyz until it answers ``status`` with ``contains`` in the reason."""
    async with asyncio.timeout(timeout):
        while True:
            got, why = await _fetch(port, "/readyz")
            if got == status and contains in why:
                return why
            await asyncio.sleep(0.05)


async def _serving(srv: DriverServer, kdir: Path) -> int:
    """Registered with the kubelet (as its plugin watcher does); the metrics port."""
    assert srv.endpoint is not None
    assert srv.publisher is not None
    srv.publisher.backoff = Backoff(initial=0.1, maximum=0.3)  # retried quickly
    await clients.register(kdir / "plugins_registry" / f"{DRIVER}-reg.sock")
    return srv.endpoint.port


async def test_a_refused_token_is_not_ready_until_it_is_allowed(
    kdir: Path, kubeconfig: Path, node_name: str, api: Api
) -> None:
    account = f"dra-{uuid.uuid4().hex[:8]}"
    api.call("POST", "/api/v1/namespaces/default/serviceaccounts", {"metadata": {"name": account}})
    token = api.call(
        "POST",
        f"/api/v1/namespaces/default/serviceaccounts/{account}/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}},
    )["status"]["token"]
    address, ca, _admin = _cluster(kubeconfig)
    refused = write_kubeconfig(kdir / "refused.kubeconfig", address, ca, account, token)
    role = {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"}
    binding = {
        "metadata": {"name": account},
        "roleRef": role,
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": "default"}],
    }
    try:
        async with server(
            FakeDriver(gpus(2)), kdir, refused, node_name, metrics_address="127.0.0.1:0"
        ) as srv:
            port = await _serving(srv, kdir)
            why = await _until(port, 503, "403")
            assert why.startswith("API server calls failing: ")
            assert f"system:serviceaccount:default:{account}" in why
            assert await _fetch(port, "/healthz") == (200, "ok\n")  # liveness unchanged
            api.call("POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", binding)
            await asyncio.wait_for(srv.wait_published(), 30)
            assert await _until(port, 200) == "ok\n"
    finally:
        with contextlib.suppress(Exception):
            api.call("DELETE", f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{account}")


@contextlib.asynccontextmanager
async def _forwarder(port: int, target: tuple[str, int]) -> AsyncIterator[None]:
    """127.0.0.1:``port`` forwarded to ``target`` while open; every connection cut at exit."""
    open_writers: list[asyncio.StreamWriter] = []

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*target)
        open_writers.extend((writer, up_writer))
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    listener = await asyncio.start_server(handle, "127.0.0.1", port)
    try:
        yield
    finally:
        listener.close()
        for writer in open_writers:
            writer.transport.abort()
        await listener.wait_closed()


async def test_an_unreachable_api_server_is_not_ready_until_it_is_reached(
    kdir: Path, kubeconfig: Path, node_name: str
) -> None:
    address, ca, token = _cluster(kubeconfig)
    host, api_port = address.removeprefix("https://").rsplit(":", 1)
    port = free_port()  # nothing listens there yet
    far = write_kubeconfig(kdir / "far.kubeconfig", f"https://127.0.0.1:{port}", ca, "admin", token)
    async with server(
        FakeDriver(gpus(2)), kdir, far, node_name, metrics_address="127.0.0.1:0"
    ) as srv:
        metrics = await _serving(srv, kdir)
        why = await _until(metrics, 503, "API server calls failing")
        assert "NewConnectionError" in why or "refused" in why, why
        assert await _fetch(metrics, "/healthz") == (200, "ok\n")
        async with _forwarder(port, (host, int(api_port))):
            await asyncio.wait_for(srv.wait_published(), 30)
            assert await _until(metrics, 200) == "ok\n"
        # the network goes again: the watch breaks, the list after it fails
        await _until(metrics, 503, "API server calls failing")

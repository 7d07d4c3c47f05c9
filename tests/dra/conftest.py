"""DRA kit fixtures: a real kube-apiserver (etcd + apiserver only), a Node, short dirs.

The control plane comes from /work/shared/k8s/up.sh on free ports of its own, once per
session (``$KUBEDEVICE_TEST_KUBECONFIG`` reuses a running one instead). Without the
Kubernetes binaries the tests that need the API server are skipped with the reason.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dra.api import Api, ApiError

K8S = Path(os.environ.get("KUBEDEVICE_K8S_DIR", "/work/shared/k8s"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def kubeconfig() -> Iterator[Path]:
    """The admin kubeconfig of a real API server (DRA resource.k8s.io/v1 on)."""
    given = os.environ.get("KUBEDEVICE_TEST_KUBECONFIG")
    if given:
        yield Path(given)
        return
    if not (K8S / "up.sh").exists():
        pytest.skip(f"no Kubernetes binaries ({K8S}/up.sh)")
    state = Path(tempfile.mkdtemp(prefix="kd-dra-api-"))
    env = {
        **os.environ,
        "WITH_SCHED": "0",
        "WITH_KCM": "0",
        "LOG_V": "0",
        "API_PORT": str(_free_port()),
        "ETCD_PORT": str(_free_port()),
        "ETCD_PEER_PORT": str(_free_port()),
        "SCHED_PORT": str(_free_port()),
        "KCM_PORT": str(_free_port()),
    }
    try:
        up = subprocess.run(
            [str(K8S / "up.sh"), str(state)], env=env, capture_output=True, text=True, timeout=240
        )
        if up.returncode != 0:
            pytest.fail(f"up.sh failed: {up.stdout[-2000:]} {up.stderr[-2000:]}")
        yield state / "kubeconfig"
    finally:
        subprocess.run(
            [str(K8S / "down.sh"), str(state), "--wipe"], capture_output=True, timeout=120
        )
        shutil.rmtree(state, ignore_errors=True)


@pytest.fixture(scope="session")
def api(kubeconfig: Path) -> Api:
    return Api(kubeconfig)


@pytest.fixture
def node_name(api: Api) -> Iterator[str]:
    """A fresh Node object (no kubelet) for the test; deleted afterwards."""
    name = f"node-{uuid.uuid4().hex[:8]}"
    api.call("POST", "/api/v1/nodes", {"metadata": {"name": name}})
    try:
        yield name
    finally:
        with contextlib.suppress(ApiError):
            api.call("DELETE", f"/api/v1/nodes/{name}")


@pytest.fixture
def kdir() -> Iterator[Path]:
    """A short temp dir standing for the kubelet's root (sockets stay under 107 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="kd-", dir="/tmp"))
    (path / "plugins_registry").mkdir()
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def create_claim(
    api: Api,
    namespace: str,
    name: str,
    *,
    requests: list[str] = ("gpu",),  # type: ignore[assignment]
    results: list[dict[str, Any]] | None = None,
    config: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Create a ResourceClaim and, with ``results``, write its allocation into its status."""
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "devices": {
                "requests": [
                    {"name": r, "exactly": {"deviceClassName": "example", "count": 1}}
                    for r in requests
                ]
            }
        },
    }
    base = f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims"
    claim = api.call("POST", base, body)
    if results is not None:
        claim["status"] = {"allocation": {"devices": {"results": results, "config": config or []}}}
        claim = api.call("PUT", f"{base}/{name}/status", claim)
    return claim


def result(request: str, driver: str, pool: str, device: str) -> dict[str, Any]:
    return {"request": request, "driver": driver, "pool": pool, "device": device}

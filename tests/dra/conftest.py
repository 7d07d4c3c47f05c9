"""DRA kit fixtures: a real kube-apiserver (etcd + apiserver only), a Node, short dirs.

The binaries are found as the end-to-end tier finds them (``$KUBEDEVICE_K8S_BIN``, else
``../shared/k8s/unpack.sh`` beside the checkout; tests/e2e/README.md), and etcd and the API
server start once per session on free ports (``$KUBEDEVICE_TEST_KUBECONFIG`` reuses a
running one instead). Without the binaries these tests are skipped with the reason (with
``CI`` set they fail).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import ssl
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e.cluster import (
    HOW_TO_GET,
    Process,
    _http_ok,
    _poll,
    etcd_args,
    find_binaries,
    free_port,
    make_pki,
    write_kubeconfig,
)

from dra.api import Api, ApiError

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def kubeconfig() -> Iterator[Path]:
    """The admin kubeconfig of a real API server (DRA resource.k8s.io/v1 on)."""
    given = os.environ.get("KUBEDEVICE_TEST_KUBECONFIG")
    if given:
        yield Path(given)
        return
    bin_dir = find_binaries(REPO)
    if bin_dir is None:
        if os.environ.get("CI"):
            pytest.fail(f"CI is set: {HOW_TO_GET}", pytrace=False)
        pytest.skip(HOW_TO_GET)
    with api_server(bin_dir) as path:
        yield path


@contextlib.contextmanager
def api_server(bin_dir: Path, *extra_args: str) -> Iterator[Path]:
    """etcd and a kube-apiserver (no scheduler, no kubelet) on free ports; the admin kubeconfig.

    ``extra_args`` go to kube-apiserver (``--feature-gates=...``). Also used by
    ``bench/bench_dra.py``.
    """
    work = Path(tempfile.mkdtemp(prefix="kd-dra-api-"))
    procs: list[Process] = []
    try:
        pki = work / "pki"
        token = make_pki(pki, {"admin": "system:masters"})["admin"]
        etcd_port, etcd_peer, api_port = free_port(), free_port(), free_port()
        server = f"https://127.0.0.1:{api_port}"
        etcd = Process(
            "etcd",
            [str(bin_dir / "etcd"), *etcd_args(work / "etcd", etcd_port, etcd_peer)],
            work / "etcd.log",
            work / "cwd" / "etcd",
        )
        procs.append(etcd)
        etcd.start()
        api = Process(
            "kube-apiserver",
            [
                str(bin_dir / "kube-apiserver"),
                "--advertise-address=127.0.0.1", "--bind-address=127.0.0.1",
                f"--secure-port={api_port}", f"--etcd-servers=http://127.0.0.1:{etcd_port}",
                f"--tls-cert-file={pki / 'apiserver.crt'}",
                f"--tls-private-key-file={pki / 'apiserver.key'}",
                f"--client-ca-file={pki / 'ca.crt'}", f"--token-auth-file={pki / 'tokens.csv'}",
                "--authorization-mode=RBAC", "--disable-admission-plugins=ServiceAccount",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                "--service-cluster-ip-range=10.96.0.0/16",
                "--endpoint-reconciler-type=none", "--profiling=false", "--v=0",
                *extra_args,
            ],
            work / "kube-apiserver.log",
            work / "cwd" / "kube-apiserver",
        )  # fmt: skip
        procs.append(api)
        api.start()
        ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        _poll(
            "kube-apiserver /readyz", lambda: _http_ok(f"{server}/readyz", ctx, token), 120, procs
        )
        yield write_kubeconfig(work / "admin.kubeconfig", server, pki / "ca.crt", "admin", token)
    finally:
        for proc in reversed(procs):
            proc.stop()
        shutil.rmtree(work, ignore_errors=True)


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
    reserved_for: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Create a ResourceClaim and, with ``results``, write its allocation into its status
    (and ``reserved_for``, its ``status.reservedFor``: the pods using it)."""
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
        if reserved_for:
            claim["status"]["reservedFor"] = reserved_for
        claim = api.call("PUT", f"{base}/{name}/status", claim)
    return claim


def result(request: str, driver: str, pool: str, device: str) -> dict[str, Any]:
    return {"request": request, "driver": driver, "pool": pool, "device": device}

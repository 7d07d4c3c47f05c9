"""The DRA kit's own credentials (no ``kubernetes`` package on the common paths), against a
real API server: a token, a rotated token file, client certificate data held in memory, and
a credential plugin that still goes to the official client."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubedevice.dra.api.credentials import ClientEndpoint, read_credentials
from kubedevice.dra.api.kube import KubeClient
from kubedevice.errors import ConfigError, KubeApiError

pytestmark = pytest.mark.timeout(60)


def _admin(kubeconfig: Path) -> tuple[str, Path, str]:
    """(server, CA file, token) of the fixture's admin kubeconfig."""
    doc = yaml.safe_load(kubeconfig.read_text())
    cluster = doc["clusters"][0]["cluster"]
    return (
        cluster["server"],
        Path(cluster["certificate-authority"]),
        doc["users"][0]["user"]["token"],
    )


def _kubeconfig(path: Path, cluster: dict[str, Any], user: dict[str, Any]) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": cluster}],
                "users": [{"name": "u", "user": user}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    return path


async def _nodes_ok(client: KubeClient) -> None:
    try:
        answer = await client._async("GET", "/api/v1/nodes")
        assert answer["kind"] == "NodeList"
    finally:
        client.close()


def test_a_token_kubeconfig_needs_no_official_client(kubeconfig: Path) -> None:
    code = (
        "import asyncio, sys\n"
        "from pathlib import Path\n"
        "from kubedevice.dra.api.kube import KubeClient\n"
        "c = KubeClient.connect(Path(sys.argv[1]))\n"
        "n = asyncio.run(c._async('GET', '/api/v1/nodes'))\n"
        "c.close()\n"
        "print(n['kind'], 'kubernetes' in sys.modules, 'urllib3' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(kubeconfig)], capture_output=True, text=True, check=True
    ).stdout
    assert out.split() == ["NodeList", "False", "False"]  # http.client: no urllib3 either


async def test_client_certificate_data_is_used_from_memory(
    kubeconfig: Path, tmp_path: Path
) -> None:
    server, ca, _ = _admin(kubeconfig)
    pki = ca.parent

    def data(name: str) -> str:
        return base64.b64encode((pki / name).read_bytes()).decode()

    path = _kubeconfig(
        tmp_path / "kc",
        {"server": server, "certificate-authority-data": data("ca.crt")},
        {
            "client-certificate-data": data("apiserver-kubelet-client.crt"),
            "client-key-data": data("apiserver-kubelet-client.key"),
        },
    )
    credentials = read_credentials(path)
    assert credentials is not None
    assert credentials.cert_file is not None
    assert credentials.cert_file.startswith("/proc/self/fd/")  # a memfd, not a file on disk
    credentials.close()
    assert list(tmp_path.iterdir()) == [path]
    await _nodes_ok(KubeClient.connect(path))


async def test_a_token_file_is_read_again_when_it_changes(kubeconfig: Path, tmp_path: Path) -> None:
    server, ca, token = _admin(kubeconfig)
    (tmp_path / "ca.crt").write_bytes(ca.read_bytes())
    (tmp_path / "token").write_text("not-the-token\n")
    path = _kubeconfig(  # relative paths: relative to the kubeconfig's directory
        tmp_path / "kc",
        {"server": server, "certificate-authority": "ca.crt"},
        {"tokenFile": "token"},
    )
    client = KubeClient.connect(path)
    try:
        with pytest.raises(KubeApiError) as failed:
            await client._async("GET", "/api/v1/nodes")
        assert failed.value.status == 401
        (tmp_path / "token").write_text(token + "\n")  # rotated, as the kubelet does
        answer = await client._async("GET", "/api/v1/nodes")
        assert answer["kind"] == "NodeList"
    finally:
        client.close()


async def test_a_credential_plugin_goes_to_the_official_client(
    kubeconfig: Path, tmp_path: Path
) -> None:
    server, ca, token = _admin(kubeconfig)
    credential = json.dumps(
        {
            "apiVersion": "client.authentication.k8s.io/v1",
            "kind": "ExecCredential",
            "status": {"token": token},
        }
    )
    path = _kubeconfig(
        tmp_path / "kc",
        {"server": server, "certificate-authority": str(ca)},
        {
            "exec": {
                "apiVersion": "client.authentication.k8s.io/v1",
                "command": "echo",
                "args": [credential],
                "interactiveMode": "Never",
            }
        },
    )
    assert read_credentials(path) is None
    client = KubeClient.connect(path)
    assert isinstance(client._endpoint, ClientEndpoint)
    await _nodes_ok(client)


def test_a_credential_plugin_without_the_client_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As after ``pip install kubedevice``: the one line says which extra to install."""
    path = _kubeconfig(
        tmp_path / "kc",
        {"server": "https://127.0.0.1:1"},
        {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": "true"}},
    )
    monkeypatch.setitem(sys.modules, "kubernetes", None)  # import kubernetes -> ImportError
    with pytest.raises(ConfigError) as e:
        KubeClient.connect(path)
    assert str(e.value) == (
        "this kubeconfig needs the Kubernetes client: pip install 'kubedevice[kube-client]'"
    )
    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    extras = tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]
    assert extras["kube-client"] == ["kubernetes>=37,<38"]


def test_bad_kubeconfigs_say_what_is_wrong(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    missing = _kubeconfig(
        tmp_path / "kc",
        {"server": "https://127.0.0.1:1", "certificate-authority": "nope.crt"},
        {"token": "t"},
    )
    with pytest.raises(ConfigError, match=r"certificate-authority .*nope\.crt cannot be read"):
        read_credentials(missing)
    (tmp_path / "bad").write_text("- a list\n")
    with pytest.raises(ConfigError, match="is a list, not a mapping"):
        read_credentials(tmp_path / "bad")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(ConfigError, match="not in a pod"):
        read_credentials(None)


async def test_the_service_account_of_a_pod(
    kubeconfig: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from urllib.parse import urlsplit

    from kubedevice.dra.api import credentials as credentials_module
    from kubedevice.dra.api.credentials import OwnEndpoint

    server, ca, token = _admin(kubeconfig)
    (tmp_path / "ca.crt").write_bytes(ca.read_bytes())
    (tmp_path / "token").write_text(token)
    url = urlsplit(server)
    monkeypatch.setattr(credentials_module, "IN_CLUSTER_DIR", tmp_path)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", str(url.hostname))
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(url.port))
    credentials = read_credentials(None)
    assert credentials is not None
    assert credentials.server == server
    await _nodes_ok(KubeClient(OwnEndpoint(credentials)))
    (tmp_path / "ca.crt").unlink()
    with pytest.raises(ConfigError, match=r"the service account.s CA .* does not exist"):
        read_credentials(None)


async def test_the_certificate_is_checked_against_tls_server_name(
    kubeconfig: Path, tmp_path: Path
) -> None:
    """The server's certificate names 127.0.0.1, localhost and kubernetes (not example.com):
    with ``tls-server-name`` it is checked against that name, not the URL's host."""
    server, ca, token = _admin(kubeconfig)
    cluster = {"server": server, "certificate-authority": str(ca)}
    named = {**cluster, "tls-server-name": "kubernetes"}
    await _nodes_ok(KubeClient.connect(_kubeconfig(tmp_path / "a", named, {"token": token})))
    wrong = {**cluster, "tls-server-name": "example.com"}
    client = KubeClient.connect(_kubeconfig(tmp_path / "b", wrong, {"token": token}))
    try:
        with pytest.raises(KubeApiError, match=r"example\.com"):
            await client._async("GET", "/api/v1/nodes")
    finally:
        client.close()
    insecure = {"server": server, "insecure-skip-tls-verify": True, "tls-server-name": "x.y"}
    await _nodes_ok(KubeClient.connect(_kubeconfig(tmp_path / "c", insecure, {"token": token})))

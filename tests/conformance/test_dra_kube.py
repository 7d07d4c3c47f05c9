"""The DRA kit's own API client on the kubeconfigs kind and kubeadm write: a client
certificate and key and the CA inline (``*-data``), against the kit's own real API server."""

from __future__ import annotations

import asyncio
import base64
import subprocess
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubedevice.conformance.dra.apiserver import LocalApiServer
from kubedevice.conformance.dra.kube import RESOURCE, ApiError, KubeClient
from kubedevice.conformance.dra.slices import SliceView
from kubedevice.errors import ConfigError

from .dra_drivers import KUBEDEVICE, explain, k8s_bin
from .plugins import kit_driver_cmd

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalApiServer]:
    """The kit's own API server, one for the module (each test leaves it as it found it)."""
    api = LocalApiServer(k8s_bin(), tmp_path_factory.mktemp("api"))
    api.start()
    try:
        yield api
    finally:
        api.stop()


def _openssl(cwd: Path, *args: str) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def test_client_certificate_kubeconfig_with_inline_data(
    server: LocalApiServer, tmp_path: Path
) -> None:
    pki = server.work / "pki"
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl(pki, "req", *ec, "-keyout", "kind.key", "-out", "kind.csr",
             "-subj", "/O=system:masters/CN=kind-admin")  # fmt: skip
    _openssl(pki, "x509", "-req", "-in", "kind.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", "kind.crt", "-days", "1")  # fmt: skip
    token_config = yaml.safe_load(server.kit_kubeconfig.read_text())
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "kind", "cluster": {
            "server": token_config["clusters"][0]["cluster"]["server"],
            "certificate-authority-data": _b64(pki / "ca.crt")}}],
        "users": [{"name": "kind-admin", "user": {
            "client-certificate-data": _b64(pki / "kind.crt"),
            "client-key-data": _b64(pki / "kind.key")}}],
        "contexts": [{"name": "kind", "context": {"cluster": "kind", "user": "kind-admin"}}],
        "current-context": "kind",
    }  # fmt: skip
    path = tmp_path / "kind.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    kube = KubeClient(path)
    try:
        assert kube.call("GET", "/api/v1/namespaces/default")["metadata"]["name"] == "default"
        assert kube.get_or_none("/api/v1/nodes/no-such-node") is None
        with pytest.raises(ApiError) as err:
            kube.call("POST", "/api/v1/nodes", {"metadata": {"name": "Bad_Name"}})
        assert err.value.status == 422
    finally:
        kube.close()


def test_an_exec_user_is_one_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "exec.kubeconfig"
    path.write_text(yaml.safe_dump({
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"exec": {"command": "aws"}}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }))  # fmt: skip
    with pytest.raises(ConfigError, match="exec and auth-provider users are not supported"):
        KubeClient(path)


def test_a_run_on_a_kubeconfig_leaves_no_node_class_claim_or_slice(
    server: LocalApiServer, tmp_path: Path
) -> None:
    """--kubeconfig (a cluster the kit does not own): what the run made is gone afterwards,
    the driver's slices for the kit's Node included."""
    kube = KubeClient(server.kit_kubeconfig)
    try:
        proc = subprocess.run(
            [KUBEDEVICE, "conformance", "--dra", "--quick", "--kubeconfig",
             str(server.kit_kubeconfig), "--log", str(tmp_path / "d.log"), "--",
             *kit_driver_cmd()],
            capture_output=True, text=True, timeout=150, check=False,
        )  # fmt: skip
        assert proc.returncode == 0, explain(proc, tmp_path / "d.log")
        assert "SKIP    SHOULD  slices-quiet-list          needs the kit's own API server" in (
            proc.stdout
        )
        nodes = [n["metadata"]["name"] for n in kube.call("GET", "/api/v1/nodes")["items"]]
        assert not [n for n in nodes if n.startswith("kd-conformance-")]
        assert kube.call("GET", f"{RESOURCE}/resourceslices")["items"] == []
        assert kube.call("GET", f"{RESOURCE}/deviceclasses")["items"] == []
        assert kube.call("GET", f"{RESOURCE}/resourceclaims")["items"] == []
    finally:
        kube.close()


def test_the_slice_view_outlives_a_silence_longer_than_the_client_timeout(
    server: LocalApiServer,
) -> None:
    """The kit's slice watch may be silent for long (the quiet period, restarts, all slower
    on a busy machine); a change after that is still seen. Before: the watch's connection
    kept the client's 30 s read timeout, the view stopped at the first longer silence and
    a later wipe looked like slices that never went away."""
    kube = KubeClient(server.kit_kubeconfig, timeout=1.0)
    body = {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": "after-silence"},
        "spec": {"driver": "silence.example.com", "nodeName": "n1",
                 "pool": {"name": "p", "generation": 1, "resourceSliceCount": 1},
                 "devices": [{"name": "d0"}]},
    }  # fmt: skip

    async def scenario() -> tuple[bool, bool, str]:
        changed = asyncio.Event()
        view = SliceView(kube, changed.set)
        await view.start()
        try:
            # three times the client's timeout with no event at all
            quiet = not await _within(changed.wait(), 3.0)
            await asyncio.to_thread(kube.call, "POST", f"{RESOURCE}/resourceslices", body)
            seen = await _within(changed.wait(), 30.0)
            return quiet, seen and "after-silence" in view.slices, view.error
        finally:
            await view.stop()

    try:
        quiet, seen, error = asyncio.run(scenario())
    finally:
        kube.delete(f"{RESOURCE}/resourceslices/after-silence")
        kube.close()
    assert quiet
    assert seen, f"the view missed a slice made after 3 s of silence (its error: {error!r})"
    assert error == ""


async def _within(waiting: Coroutine[Any, Any, object], limit: float) -> bool:
    try:
        await asyncio.wait_for(waiting, limit)
    except TimeoutError:
        return False
    return True

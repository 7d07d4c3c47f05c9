"""A DRA driver's /metrics, /healthz and /readyz, over real sockets and a real API server."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from dra import clients
from dra.api import Api
from dra.conftest import create_claim, result
from dra.fakes import DRIVER, FakeDriver, gpus, server
from kubedevice.errors import ClaimError, ConfigError, KubeDeviceError

pytestmark = pytest.mark.timeout(60)


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


async def _fetch(port: int, path: str) -> tuple[int, str]:
    return await asyncio.to_thread(_get, port, path)


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def test_probes_follow_registration_and_metrics_count_claims_by_result(
    kdir: Path, kubeconfig: Path, node_name: str, api: Api
) -> None:
    namespace = "default"
    driver = FakeDriver(gpus(3, unhealthy=[2]))
    good = create_claim(
        api, namespace, f"ok-{node_name}", results=[result("gpu", DRIVER, node_name, "gpu-0")]
    )
    bad = create_claim(
        api, namespace, f"bad-{node_name}", results=[result("gpu", DRIVER, node_name, "gpu-1")]
    )
    driver.fail[bad["metadata"]["name"]] = ClaimError("no")
    refs = [(namespace, c["metadata"]["name"], c["metadata"]["uid"]) for c in (good, bad)]
    async with server(driver, kdir, kubeconfig, node_name, metrics_address="127.0.0.1:0") as srv:
        port = srv.endpoint.port
        assert await _fetch(port, "/healthz") == (200, "ok\n")
        status, why = await _fetch(port, "/readyz")  # the kubelet has not registered it yet
        assert (status, why) == (503, "not registered with the kubelet\n")
        await clients.register(kdir / "plugins_registry" / f"{DRIVER}-reg.sock")
        await asyncio.wait_for(srv.wait_published(), 30)  # registered and published: ready
        assert await _fetch(port, "/readyz") == (200, "ok\n")

        answer = await clients.prepare(kdir / "plugins" / DRIVER / "dra.sock", refs)
        assert [bool(answer.claims[r[2]].error) for r in refs] == [False, True]
        status, text = await _fetch(port, "/metrics")
        assert status == 200
        m = _samples(text)
        assert (
            m[("kubedevice_dra_requests_total", (("operation", "prepare"), ("result", "ok")))] == 1
        )
        assert (
            m[("kubedevice_dra_requests_total", (("operation", "prepare"), ("result", "error")))]
            == 1
        )
        assert (
            m[("kubedevice_dra_errors_total", (("kind", "claim"), ("operation", "prepare")))] == 1
        )
        assert m[("kubedevice_dra_request_seconds_count", (("operation", "prepare"),))] == 1
        assert m[("kubedevice_dra_requests_in_flight", (("operation", "prepare"),))] == 0
        assert m[("kubedevice_dra_prepared_claims", ())] == 1
        assert m[("kubedevice_dra_prepared_devices", ())] == 1
        assert m[("kubedevice_dra_devices", (("health", "Healthy"),))] == 2
        assert m[("kubedevice_dra_devices", (("health", "Unhealthy"),))] == 1
        assert m[("kubedevice_dra_slice_writes_total", ())] >= 1
        assert m[("kubedevice_dra_registrations_total", ())] == 1

        await clients.unprepare(kdir / "plugins" / DRIVER / "dra.sock", refs[:1])
        m = _samples((await _fetch(port, "/metrics"))[1])
        assert (
            m[("kubedevice_dra_requests_total", (("operation", "unprepare"), ("result", "ok")))]
            == 1
        )
        assert m[("kubedevice_dra_prepared_devices", ())] == 0

        # the device list fails (a job of the server died): not live, not ready
        driver.snapshots.put_nowait(None)  # type: ignore[arg-type]
        await asyncio.wait_for(srv.wait_failed(), 10)
        status, why = await _fetch(port, "/healthz")
        assert status == 503
        assert why.startswith("failed: ")
        assert (await _fetch(port, "/readyz"))[0] == 503
        assert (await _fetch(port, "/nothing"))[0] == 404


async def test_a_bad_or_taken_metrics_address_is_a_clear_error(
    kdir: Path, kubeconfig: Path, node_name: str
) -> None:
    with pytest.raises(ConfigError, match="HOST:PORT"):
        server(FakeDriver(gpus(1)), kdir, kubeconfig, node_name, metrics_address="nope")
    async with server(
        FakeDriver(gpus(1)), kdir, kubeconfig, node_name, metrics_address="127.0.0.1:0"
    ) as first:
        taken = f"127.0.0.1:{first.endpoint.port}"
        other = server(
            FakeDriver(gpus(1)), kdir / "b", kubeconfig, node_name, metrics_address=taken
        )
        with pytest.raises(KubeDeviceError, match=r"cannot serve metrics on 127\.0\.0\.1:"):
            await other.start()
        await other.stop()

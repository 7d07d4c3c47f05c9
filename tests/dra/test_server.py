"""DriverServer over real sockets with a real API server: registration, prepare, unprepare."""

from __future__ import annotations

import asyncio
import json
import os
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

import kubedevice.dra as dra
from dra import clients
from dra.api import Api
from dra.conftest import create_claim, result
from dra.fakes import DRIVER, FakeDriver, gpus, server, wait_for_path
from kubedevice.dra.api.claims import MAX_RESULTS
from kubedevice.dra.api.kube import KubeClient
from kubedevice.dra.node.server import DriverServer
from kubedevice.dra.node.service import MAX_CLAIMS_PER_CALL
from kubedevice.errors import KubeDeviceError

pytestmark = pytest.mark.timeout(60)


async def test_registration_info_versions_and_socket_modes(
    kdir: Path, kubeconfig: Path, node_name: str
) -> None:
    async with server(FakeDriver(gpus(2)), kdir, kubeconfig, node_name) as srv:
        reg_sock = kdir / "plugins_registry" / f"{DRIVER}-reg.sock"
        dra_sock = kdir / "plugins" / DRIVER / "dra.sock"
        info = await clients.get_info(reg_sock)
        assert info.type == "DRAPlugin"
        assert info.name == DRIVER
        assert info.endpoint == str(dra_sock)
        assert list(info.supported_versions) == [
            "v1.DRAPlugin",
            "v1beta1.DRAPlugin",
            "v1alpha1.DRAResourceHealth",
        ]
        for sock in (reg_sock, dra_sock):
            mode = sock.lstat().st_mode
            assert stat.S_ISSOCK(mode)
            assert stat.S_IMODE(mode) == 0o600, oct(mode)
        await clients.notify(reg_sock, False, "driver name clash")
        assert srv.registration.last_error == "driver name clash"
        await clients.notify(reg_sock, True)
        assert srv.registration.registrations == 1
    assert not reg_sock.exists()
    assert not dra_sock.exists()


async def test_no_health_service_when_turned_off(
    kdir: Path, kubeconfig: Path, node_name: str
) -> None:
    async with server(FakeDriver(gpus(1)), kdir, kubeconfig, node_name, health=False):
        info = await clients.get_info(kdir / "plugins_registry" / f"{DRIVER}-reg.sock")
        assert list(info.supported_versions) == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]


async def test_sockets_come_back_when_removed(kdir: Path, kubeconfig: Path, node_name: str) -> None:
    async with server(FakeDriver(gpus(1)), kdir, kubeconfig, node_name):
        reg_sock = kdir / "plugins_registry" / f"{DRIVER}-reg.sock"
        dra_sock = kdir / "plugins" / DRIVER / "dra.sock"
        for sock in (reg_sock, dra_sock):
            sock.unlink()
            await wait_for_path(sock)
        info = await clients.get_info(reg_sock)
        assert info.name == DRIVER
        answer = await clients.unprepare(dra_sock, [("ns", "c", "uid-unknown")])
        assert answer.claims["uid-unknown"].error == ""


@pytest.fixture
def namespace() -> str:
    return "default"


async def test_prepare_writes_cdi_spec_answers_ids_and_is_idempotent(
    kdir: Path, kubeconfig: Path, node_name: str, api: Api, namespace: str
) -> None:
    driver = FakeDriver(gpus(4))
    claim = create_claim(
        api,
        namespace,
        f"c-{node_name}",
        requests=["gpu"],
        results=[
            result("gpu", DRIVER, node_name, "gpu-1"),
            result("gpu", DRIVER, node_name, "gpu-3"),
            result("gpu", "other.example.com", node_name, "x-0"),
            result("gpu", DRIVER, "another-node", "gpu-0"),
        ],
    )
    uid = claim["metadata"]["uid"]
    ref = (namespace, claim["metadata"]["name"], uid)
    async with server(driver, kdir, kubeconfig, node_name):
        dra_sock = kdir / "plugins" / DRIVER / "dra.sock"
        answer = await clients.prepare(dra_sock, [ref])
        entry = answer.claims[uid]
        assert entry.error == ""
        kind = f"k8s.{DRIVER}/claim"
        assert [
            (list(d.request_names), d.pool_name, d.device_name, list(d.cdi_device_ids))
            for d in entry.devices
        ] == [
            (["gpu"], node_name, "gpu-1", [f"{kind}={uid}-gpu-1"]),
            (["gpu"], node_name, "gpu-3", [f"{kind}={uid}-gpu-3"]),
        ]
        spec_file = kdir / "cdi" / f"k8s.{DRIVER}-claim_{uid}.json"
        spec = json.loads(spec_file.read_text())
        assert spec["kind"] == kind
        assert [d["name"] for d in spec["devices"]] == [f"{uid}-gpu-1", f"{uid}-gpu-3"]
        assert spec["devices"][0]["containerEdits"] == {
            "env": ["FAKE_GPU=1"],
            "deviceNodes": [
                {"path": "/dev/fakegpu1", "hostPath": "/dev/null", "permissions": "rw"}
            ],
        }
        # the same claim again (a second pod sharing it): the same answer, prepared once
        again = await clients.prepare(dra_sock, [ref])
        assert again == answer
        beta = await clients.prepare(dra_sock, [ref], version="v1beta1")
        assert beta.SerializeToString(deterministic=True) == answer.SerializeToString(
            deterministic=True
        )
        assert len(driver.prepared) == 1
        assert [d.name for d in driver.prepared[0].devices] == ["gpu-1", "gpu-3"]
        # unprepare: hook, spec removed; twice is fine
        for _ in range(2):
            gone = await clients.unprepare(dra_sock, [ref])
            assert gone.claims[uid].error == ""
        assert not spec_file.exists()
        assert len(driver.unprepared) == 1
        assert driver.unprepared[0].devices == (
            ("gpu", node_name, "gpu-1"),
            ("gpu", node_name, "gpu-3"),
        )


async def test_one_claims_error_leaves_the_others_prepared(
    kdir: Path, kubeconfig: Path, node_name: str, api: Api, namespace: str
) -> None:
    driver = FakeDriver(gpus(3))
    good = create_claim(
        api, namespace, f"good-{node_name}", results=[result("gpu", DRIVER, node_name, "gpu-0")]
    )
    unallocated = create_claim(api, namespace, f"unalloc-{node_name}")
    failing = create_claim(
        api, namespace, f"fail-{node_name}", results=[result("gpu", DRIVER, node_name, "gpu-1")]
    )
    crashing = create_claim(
        api, namespace, f"crash-{node_name}", results=[result("gpu", DRIVER, node_name, "gpu-2")]
    )
    driver.fail[failing["metadata"]["name"]] = dra.ClaimError("GPU 1 is busy")
    driver.fail[crashing["metadata"]["name"]] = RuntimeError("boom")

    def ref(c: dict) -> tuple[str, str, str]:
        return (namespace, c["metadata"]["name"], c["metadata"]["uid"])

    async with server(driver, kdir, kubeconfig, node_name):
        dra_sock = kdir / "plugins" / DRIVER / "dra.sock"
        answer = await clients.prepare(
            dra_sock,
            [
                ref(good),
                ref(unallocated),
                ref(failing),
                ref(crashing),
                (namespace, good["metadata"]["name"], "not-the-uid"),
                (namespace, "no-such-claim", "uid-x"),
                ("", "x", "uid-empty-ns"),
                (namespace, "../../../api/v1/nodes", "uid-path"),
                (namespace, "c", "../../etc/passwd"),
            ],
        )
        errors = {uid: entry.error for uid, entry in answer.claims.items()}
        assert errors[good["metadata"]["uid"]] == ""
        assert len(answer.claims[good["metadata"]["uid"]].devices) == 1
        assert "is not allocated" in errors[unallocated["metadata"]["uid"]]
        assert errors[failing["metadata"]["uid"]] == "GPU 1 is busy"
        assert errors[crashing["metadata"]["uid"]] == "preparing failed: RuntimeError: boom"
        assert "not not-the-uid" in errors["not-the-uid"]
        assert "does not exist" in errors["uid-x"]
        assert errors["uid-empty-ns"] == "claim namespace is empty"
        assert errors["uid-path"] == (
            "claim name '../../../api/v1/nodes' is not a ResourceClaim name"
        )
        assert errors["../../etc/passwd"] == "claim uid '../../etc/passwd' is not a UID"
        # still serving
        info = await clients.get_info(kdir / "plugins_registry" / f"{DRIVER}-reg.sock")
        assert info.name == DRIVER


async def test_opaque_configs_reach_the_hook_class_first_per_request(
    kdir: Path, kubeconfig: Path, node_name: str, api: Api, namespace: str
) -> None:
    driver = FakeDriver(gpus(2))

    def opaque(source: str, requests: list[str], parameters: object) -> dict:
        return {
            "source": source,
            "requests": requests,
            "opaque": {"driver": DRIVER, "parameters": parameters},
        }

    claim = create_claim(
        api,
        namespace,
        f"cfg-{node_name}",
        requests=["a", "b"],
        results=[result("a", DRIVER, node_name, "gpu-0"), result("b", DRIVER, node_name, "gpu-1")],
        config=[
            opaque("FromClaim", ["a"], {"kind": "GpuConfig", "sharing": "claim-a"}),
            opaque("FromClass", [], {"kind": "GpuConfig", "sharing": "class"}),
            {
                "source": "FromClaim",
                "requests": [],
                "opaque": {"driver": "other.io", "parameters": {}},
            },
        ],
    )
    async with server(driver, kdir, kubeconfig, node_name):
        dra_sock = kdir / "plugins" / DRIVER / "dra.sock"
        answer = await clients.prepare(
            dra_sock,
            [(namespace, claim["metadata"]["name"], claim["metadata"]["uid"])],
        )
        assert answer.claims[claim["metadata"]["uid"]].error == ""
        prepared = next(c for c in driver.prepared if c.ref.uid == claim["metadata"]["uid"])
        assert [c.parameters["sharing"] for c in prepared.configs] == ["class", "claim-a"]
        by_request = {
            d.request: [c.parameters["sharing"] for c in d.configs] for d in prepared.devices
        }
        assert by_request == {"a": ["class", "claim-a"], "b": ["class"]}


async def test_restarted_driver_unprepares_from_its_checkpoint(
    kdir: Path, kubeconfig: Path, node_name: str, api: Api, namespace: str
) -> None:
    claim = create_claim(
        api, namespace, f"rs-{node_name}", results=[result("gpu", DRIVER, node_name, "gpu-0")]
    )
    ref = (namespace, claim["metadata"]["name"], claim["metadata"]["uid"])
    dra_sock = kdir / "plugins" / DRIVER / "dra.sock"
    first = FakeDriver(gpus(1))
    async with server(first, kdir, kubeconfig, node_name):
        prepared = await clients.prepare(dra_sock, [ref])
    second = FakeDriver(gpus(1))
    async with server(second, kdir, kubeconfig, node_name):
        again = await clients.prepare(dra_sock, [ref])
        assert again == prepared
        assert second.prepared == []  # answered from the checkpoint
        gone = await clients.unprepare(dra_sock, [ref])
        assert gone.claims[ref[2]].error == ""
        assert [c.ref.uid for c in second.unprepared] == [ref[2]]


async def test_corrupt_checkpoint_is_moved_aside_with_a_warning(
    kdir: Path, kubeconfig: Path, node_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    plugin_dir = kdir / "plugins" / DRIVER
    plugin_dir.mkdir(parents=True)
    (plugin_dir / "checkpoint.json").write_text('{"version": 1, "claims": {"x": ')
    async with server(FakeDriver(gpus(1)), kdir, kubeconfig, node_name) as srv:
        assert srv.checkpoint.claims == {}
    aside = [p.name for p in plugin_dir.iterdir() if p.name.startswith("checkpoint.json.corrupt-")]
    assert len(aside) == 1
    assert "is unusable" in caplog.text


async def test_checkpoint_whose_checksum_does_not_match_is_moved_aside(
    kdir: Path,
    kubeconfig: Path,
    node_name: str,
    api: Api,
    namespace: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    claim = create_claim(
        api, namespace, f"sum-{node_name}", results=[result("gpu", DRIVER, node_name, "gpu-0")]
    )
    ref = (namespace, claim["metadata"]["name"], claim["metadata"]["uid"])
    dra_sock = kdir / "plugins" / DRIVER / "dra.sock"
    async with server(FakeDriver(gpus(2)), kdir, kubeconfig, node_name):
        assert (await clients.prepare(dra_sock, [ref])).claims[ref[2]].error == ""
    path = kdir / "plugins" / DRIVER / "checkpoint.json"
    document = json.loads(path.read_text())
    document["claims"][ref[2]]["devices"][0]["device"] = "gpu-1"  # valid JSON, edited entry
    edited = json.dumps(document)
    path.write_text(edited)
    second = FakeDriver(gpus(2))
    async with server(second, kdir, kubeconfig, node_name) as srv:
        assert srv.checkpoint.claims == {}
        # the driver serves: the claim is prepared afresh, by the hook, with its real device
        again = await clients.prepare(dra_sock, [ref])
        assert [d.device_name for d in again.claims[ref[2]].devices] == ["gpu-0"]
        assert len(second.prepared) == 1
    aside = [p for p in path.parent.iterdir() if p.name.startswith("checkpoint.json.corrupt-")]
    assert [p.read_text() for p in aside] == [edited]
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any("is unusable (checksum mismatch)" in w and str(aside[0]) in w for w in warnings)


async def test_checkpoint_is_replaced_whole_through_its_twin(
    kdir: Path, kubeconfig: Path, node_name: str, api: Api, namespace: str
) -> None:
    """Each save writes the twin (the version before) and exchanges the two names: a reader
    of the file as it was keeps that version whole through the next save, and nothing but
    the two files is left."""
    claims = [
        create_claim(
            api, namespace, f"at{i}-{node_name}", results=[result("gpu", DRIVER, node_name, gpu)]
        )
        for i, gpu in enumerate(("gpu-0", "gpu-1"))
    ]
    refs = [(namespace, c["metadata"]["name"], c["metadata"]["uid"]) for c in claims]
    plugin_dir = kdir / "plugins" / DRIVER
    path = plugin_dir / "checkpoint.json"
    twin = plugin_dir / ".checkpoint.json.twin"
    async with server(FakeDriver(gpus(2)), kdir, kubeconfig, node_name) as srv:
        dra_sock = plugin_dir / "dra.sock"
        assert (await clients.prepare(dra_sock, refs[:1])).claims[refs[0][2]].error == ""
        before = path.stat()
        old = path.open("rb")  # a reader in the middle of reading the first version
        try:
            srv.checkpoint.claims.pop(refs[0][2])
            srv.checkpoint.save(sync=False)  # one save: the twin written, names exchanged
            after = path.stat()
            first = json.loads(old.read())
        finally:
            old.close()
        assert after.st_ino != before.st_ino
        assert twin.stat().st_ino == before.st_ino  # the version before, kept beside it
        assert stat.S_IMODE(after.st_mode) == stat.S_IMODE(twin.stat().st_mode) == 0o600
        assert list(first["claims"]) == [refs[0][2]]  # the reader still has a whole file
        assert json.loads(path.read_text())["claims"] == {}
        assert after.st_size % 4096 == 0  # padded: the size rarely changes
        srv.checkpoint.claims = {}
        srv.checkpoint.load()
        assert (await clients.prepare(dra_sock, refs)).claims[refs[1][2]].error == ""
        assert set(json.loads(path.read_text())["claims"]) == {refs[0][2], refs[1][2]}
        assert sorted(os.listdir(plugin_dir)) == [
            ".checkpoint.json.twin",
            "checkpoint.json",
            "claims.lock",
            "dra.sock",
            "driver.lock",
        ]  # no temp


class _ThousandsOfResults(KubeClient):
    """The API client, but the claims it reads have 5,000 allocation results.

    The API server refuses more than 32 (``status.allocation.devices.results: Too many``),
    so a claim like this one can only come from a server that does not check it.
    """

    async def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        claim = await super().get_claim(namespace, name)
        (one,) = claim["status"]["allocation"]["devices"]["results"]
        claim["status"]["allocation"]["devices"]["results"] = [one] * 5000
        return claim


async def test_a_claim_with_thousands_of_results_is_one_clear_error_over_the_socket(
    kdir: Path, kubeconfig: Path, node_name: str, api: Api, namespace: str
) -> None:
    claim = create_claim(
        api, namespace, f"big-{node_name}", results=[result("gpu", DRIVER, node_name, "gpu-0")]
    )
    ref = (namespace, claim["metadata"]["name"], claim["metadata"]["uid"])
    driver = FakeDriver(gpus(1))
    settings = dra.DriverOptions(
        node_name=node_name, kubelet_dir=kdir, cdi_dir=kdir / "cdi", kubeconfig=kubeconfig
    ).resolved(driver)
    kube = await asyncio.to_thread(_ThousandsOfResults.connect, kubeconfig)
    try:
        async with DriverServer(driver, settings, kube=kube):
            dra_sock = kdir / "plugins" / DRIVER / "dra.sock"
            for version in ("v1", "v1beta1"):
                answer = await clients.prepare(dra_sock, [ref], version=version)
                assert answer.claims[ref[2]].error == (
                    f"claim {namespace}/{ref[1]} has 5000 allocation results; "
                    f"this driver takes at most {MAX_RESULTS}"
                )
                assert not answer.claims[ref[2]].devices
            assert driver.prepared == []
            assert not list(kdir.glob("cdi/*.json"))
            # still serving: the next call is answered
            gone = await clients.unprepare(dra_sock, [ref])
            assert gone.claims[ref[2]].error == ""
    finally:
        kube.close()


async def test_more_claims_than_the_per_call_cap_each_get_the_error(
    kdir: Path, kubeconfig: Path, node_name: str, api: Api, namespace: str
) -> None:
    good = create_claim(
        api, namespace, f"cap-{node_name}", results=[result("gpu", DRIVER, node_name, "gpu-0")]
    )
    ref = (namespace, good["metadata"]["name"], good["metadata"]["uid"])
    many = [ref] + [(namespace, f"c{i}", f"uid-{i}") for i in range(MAX_CLAIMS_PER_CALL)]
    driver = FakeDriver(gpus(1))
    async with server(driver, kdir, kubeconfig, node_name):
        dra_sock = kdir / "plugins" / DRIVER / "dra.sock"
        answer = await clients.prepare(dra_sock, many)
        errors = {uid: entry.error for uid, entry in answer.claims.items()}
        assert set(errors) == {uid for _, _, uid in many}
        assert set(errors.values()) == {
            f"{MAX_CLAIMS_PER_CALL + 1} claims in one call; at most {MAX_CLAIMS_PER_CALL}"
        }
        assert driver.prepared == []
        # still serving, and a call within the cap prepares
        within = await clients.prepare(dra_sock, many[:MAX_CLAIMS_PER_CALL])
        assert within.claims[ref[2]].error == ""
        assert [d.device_name for d in within.claims[ref[2]].devices] == ["gpu-0"]
        assert "does not exist" in within.claims["uid-0"].error


class _Silent(dra.Driver):
    driver_name = DRIVER

    async def devices(self):  # type: ignore[no-untyped-def]
        await asyncio.Event().wait()  # never a first device list
        yield []


class _Broken(dra.Driver):
    driver_name = DRIVER

    async def devices(self):  # type: ignore[no-untyped-def]
        raise RuntimeError("no devices today")
        yield []


def _options(kdir: Path, kubeconfig: Path, node: str) -> dra.DriverOptions:
    return dra.DriverOptions(
        node_name=node, kubelet_dir=kdir, cdi_dir=kdir / "cdi", kubeconfig=kubeconfig
    )


async def test_stop_while_waiting_for_the_first_device_list(
    kdir: Path, kubeconfig: Path, node_name: str
) -> None:
    stop = asyncio.Event()
    serving = asyncio.ensure_future(
        dra.serve(_Silent(), _options(kdir, kubeconfig, node_name), stop=stop)
    )
    await asyncio.sleep(0)
    stop.set()
    await asyncio.wait_for(serving, 10)
    assert not (kdir / "plugins_registry" / f"{DRIVER}-reg.sock").exists()


async def test_a_device_list_that_fails_at_once_fails_serve(
    kdir: Path, kubeconfig: Path, node_name: str
) -> None:
    with pytest.raises(KubeDeviceError) as err:
        await asyncio.wait_for(dra.serve(_Broken(), _options(kdir, kubeconfig, node_name)), 10)
    assert "no devices today" in str(err.value)
    assert not (kdir / "plugins" / DRIVER / "dra.sock").exists()


class _Gated(FakeDriver):
    def __init__(self) -> None:
        super().__init__(gpus(1))
        self.entered = asyncio.Event()
        self.gate = asyncio.Event()

    async def prepare(self, claim: dra.Claim) -> Sequence[dra.PreparedDevice]:
        self.entered.set()
        await self.gate.wait()
        return await super().prepare(claim)


async def test_concurrent_prepares_of_one_claim_prepare_it_once(
    kdir: Path, kubeconfig: Path, node_name: str, api: Api, namespace: str
) -> None:
    claim = create_claim(
        api, namespace, f"cc-{node_name}", results=[result("gpu", DRIVER, node_name, "gpu-0")]
    )
    ref = (namespace, claim["metadata"]["name"], claim["metadata"]["uid"])
    driver = _Gated()
    async with server(driver, kdir, kubeconfig, node_name) as srv:
        dra_sock = kdir / "plugins" / DRIVER / "dra.sock"
        first = asyncio.ensure_future(clients.prepare(dra_sock, [ref]))
        await asyncio.wait_for(driver.entered.wait(), 10)
        second = asyncio.ensure_future(clients.prepare(dra_sock, [ref], version="v1beta1"))
        assert srv.claims is not None
        locks = srv.claims._locks

        async def second_waits() -> None:  # the second call is in, queued behind the first
            while locks[ref[2]][1][0] < 2:
                await asyncio.sleep(0)

        await asyncio.wait_for(second_waits(), 10)
        driver.gate.set()
        one, two = await asyncio.gather(first, second)
        assert one.claims[ref[2]].error == ""
        assert one.SerializeToString(deterministic=True) == two.SerializeToString(
            deterministic=True
        )
        assert len(driver.prepared) == 1
        assert locks == {}


class _Liar(FakeDriver):
    async def prepare(self, claim: dra.Claim) -> Sequence[dra.PreparedDevice]:
        self.prepared.append(claim)
        stranger = dra.AllocatedDevice(request="gpu", pool="p", name="gpu-99", device=None)
        return [dra.PreparedDevice(stranger)]


async def test_hook_answering_a_device_not_allocated_fails_the_claim_and_is_undone(
    kdir: Path, kubeconfig: Path, node_name: str, api: Api, namespace: str
) -> None:
    claim = create_claim(
        api, namespace, f"liar-{node_name}", results=[result("gpu", DRIVER, node_name, "gpu-0")]
    )
    ref = (namespace, claim["metadata"]["name"], claim["metadata"]["uid"])
    driver = _Liar(gpus(1))
    async with server(driver, kdir, kubeconfig, node_name):
        answer = await clients.prepare(kdir / "plugins" / DRIVER / "dra.sock", [ref])
    assert answer.claims[ref[2]].error == (
        "the prepare hook returned device gpu-99 (request gpu), which is not allocated to the claim"
    )
    assert [c.devices for c in driver.unprepared] == [(("gpu", node_name, "gpu-0"),)]
    assert not list(kdir.glob("cdi/*.json"))


async def test_the_plugin_dirs_other_files_are_let_go_without_a_look(
    kdir: Path, kubeconfig: Path, node_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checkpoint's writes make four events in the plugin dir each: none of them is a
    socket, so none costs the settings' socket paths (on the loop, in every call)."""
    srv = server(FakeDriver(gpus(1)), kdir, kubeconfig, node_name)
    looked: list[str] = []
    settings = type(srv.settings)
    real = settings.dra_socket

    def counting(self: Any) -> Path:
        looked.append("dra_socket")
        path: Path = real.fget(self)  # type: ignore[attr-defined]
        return path

    monkeypatch.setattr(settings, "dra_socket", property(counting))
    for name in ("checkpoint.json", ".checkpoint.json.twin", "claims.lock", "driver.lock"):
        srv._on_dir_change(name)
    assert looked == []
    assert not srv._repair.is_set()
    srv._on_dir_change("dra.sock")
    assert looked
    assert srv._repair.is_set()

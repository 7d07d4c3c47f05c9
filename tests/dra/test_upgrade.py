"""Two instances of one driver on a node (a DaemonSet rolling with maxSurge): sockets named
by the pod UID, claim work serialised by the node's claims lock, the checkpoint shared."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Sequence
from pathlib import Path

import grpc
import pytest

import kubedevice.dra as dra
from dra import clients
from dra.api import RESOURCE, Api
from dra.conftest import create_claim, result
from dra.fakes import DRIVER, FakeDriver, gpus, server
from kubedevice._api.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from kubedevice.dra.node.registration import RegistrationService, supported_versions
from kubedevice.dra.node.server import DriverServer
from kubedevice.errors import ConfigError

pytestmark = pytest.mark.timeout(60)

NAMESPACE = "default"
UID_A = "0a0a0a0a-1111-4222-8333-444444444444"
UID_B = "0b0b0b0b-1111-4222-8333-444444444444"


class _Recording(FakeDriver):
    """Records what ``restore`` got; its prepare hook can be held at a gate."""

    def __init__(self, devices: Sequence[dra.Device]) -> None:
        super().__init__(devices)
        self.restored: list[list[str]] = []
        self.gate: asyncio.Event | None = None
        self.in_hook = asyncio.Event()

    async def prepare(self, claim: dra.Claim) -> Sequence[dra.PreparedDevice]:
        self.in_hook.set()
        if self.gate is not None:
            await self.gate.wait()
        done = await super().prepare(claim)
        return [dra.PreparedDevice(p.device, p.edits, {"by": "hook"}) for p in done]

    async def restore(self, claims: Sequence[dra.PreparedClaim]) -> None:
        self.restored.append(sorted(c.ref.uid for c in claims))


def _claim(api: Api, name: str, node: str, device: str) -> tuple[str, str, str]:
    claim = create_claim(api, NAMESPACE, name, results=[result("gpu", DRIVER, node, device)])
    return (NAMESPACE, claim["metadata"]["name"], claim["metadata"]["uid"])


def test_sockets_are_named_by_the_pod_uid(kdir: Path) -> None:
    named = dra.DriverOptions(node_name="n1", kubelet_dir=kdir, pod_uid=UID_A)
    settings = named.resolved(FakeDriver(()))
    assert settings.dra_socket == kdir / "plugins" / DRIVER / f"dra-{UID_A}.sock"
    assert settings.registration_socket == (
        kdir / "plugins_registry" / f"{DRIVER}-{UID_A}-reg.sock"
    )
    fixed = dra.DriverOptions(node_name="n1", kubelet_dir=kdir, pod_uid="").resolved(FakeDriver(()))
    assert fixed.dra_socket.name == "dra.sock"
    assert fixed.registration_socket.name == f"{DRIVER}-reg.sock"
    with pytest.raises(ConfigError, match=r"pod UID '\.\./x'"):
        dra.DriverOptions(node_name="n1", pod_uid="../x").resolved(FakeDriver(()))


def test_the_pod_uid_comes_from_the_environment(
    kdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(dra.ENV_POD_UID, UID_B)
    settings = dra.DriverOptions(node_name="n1", kubelet_dir=kdir).resolved(FakeDriver(()))
    assert settings.dra_socket.name == f"dra-{UID_B}.sock"


async def test_two_instances_serve_side_by_side_and_share_the_claims(
    kdir: Path, kubeconfig: Path, node_name: str, api: Api
) -> None:
    ref = _claim(api, f"up-{node_name}", node_name, "gpu-0")
    uid = ref[2]
    a_driver, b_driver = _Recording(gpus(2)), _Recording(gpus(2))
    a = server(a_driver, kdir, kubeconfig, node_name, pod_uid=UID_A)
    b = server(b_driver, kdir, kubeconfig, node_name, pod_uid=UID_B)
    async with a:
        await a.wait_published()
        assert (await clients.prepare(a.settings.dra_socket, [ref])).claims[uid].error == ""
        async with b:  # no lock refused: it starts beside a
            await b.wait_published()
            assert b.publisher is not None
            assert b.publisher.writes == 0  # a's slices adopted unchanged: no write
            assert b_driver.restored == [[uid]]  # a's claim, from the shared checkpoint
            # b answers a's claim from the checkpoint (its own hook is not called) ...
            answer = (await clients.prepare(b.settings.dra_socket, [ref])).claims[uid]
            assert answer.error == ""
            assert [d.device_name for d in answer.devices] == ["gpu-0"]
            assert b_driver.prepared == []
            # ... and unprepares it, with what a's hook recorded
            assert (await clients.unprepare(b.settings.dra_socket, [ref])).claims[uid].error == ""
            (gone,) = b_driver.unprepared
            assert [dict(d) for d in gone.data] == [{"by": "hook"}]
            assert list((kdir / "cdi").glob(f"*{uid}*")) == []
            # a sees that the claim is gone: an unprepare through it is a no-op
            assert (await clients.unprepare(a.settings.dra_socket, [ref])).claims[uid].error == ""
            assert a_driver.unprepared == []
            assert a.claims is not None
            assert a.claims.shared.catch_ups == 1
            assert a_driver.restored == [[], []]  # a's state rebuilt: no claims
            a_sockets = (a.settings.dra_socket, a.settings.registration_socket)
            await a.stop()  # a goes: only its own sockets with it
            assert not any(p.exists() for p in a_sockets)
            assert b.settings.dra_socket.exists()
            assert b.settings.registration_socket.exists()
            info = await asyncio.wait_for(clients.get_info(b.settings.registration_socket), 10)
            assert info.endpoint == str(b.settings.dra_socket)
    assert json.loads((kdir / "plugins" / DRIVER / "checkpoint.json").read_text())["claims"] == {}


@pytest.mark.parametrize("first_uid", [UID_A, ""], ids=["with-uid-first", "no-uid-first"])
async def test_an_instance_without_a_pod_uid_never_runs_beside_one_with(
    kdir: Path, kubeconfig: Path, node_name: str, first_uid: str
) -> None:
    """One without a pod UID (an older version, or run by hand) takes no claims lock: it
    must not serve beside the instances of a rolling upgrade, whichever starts first."""
    from kubedevice.dra.state.lock import LOCK_FILE
    from kubedevice.errors import InstanceLockError

    second_uid = "" if first_uid else UID_B
    async with server(FakeDriver(gpus(1)), kdir, kubeconfig, node_name, pod_uid=first_uid) as a:
        b = server(FakeDriver(gpus(1)), kdir, kubeconfig, node_name, pod_uid=second_uid)
        with pytest.raises(InstanceLockError) as caught:
            await b.start()
        await b.stop()
        assert str(kdir / "plugins" / DRIVER / LOCK_FILE) in str(caught.value)
        if second_uid:
            assert "without a pod UID" in str(caught.value)
            assert "maxSurge: 0" in str(caught.value)
        else:
            assert "with pod UIDs" in str(caught.value)
            assert "set POD_UID or --pod-uid" in str(caught.value)
        assert a.settings.dra_socket.exists()
        info = await asyncio.wait_for(clients.get_info(a.settings.registration_socket), 10)
        assert info.endpoint == str(a.settings.dra_socket)


async def test_a_claim_in_the_hook_of_a_live_instance_is_not_undone_by_a_new_one(
    kdir: Path, kubeconfig: Path, node_name: str, api: Api
) -> None:
    """b starts while a is inside its prepare hook: b's start waits for the claims lock,
    then sees the claim prepared, never "preparing" (which it would undo)."""
    ref = _claim(api, f"mid-{node_name}", node_name, "gpu-1")
    uid = ref[2]
    a_driver, b_driver = _Recording(gpus(2)), _Recording(gpus(2))
    a_driver.gate = asyncio.Event()
    async with server(a_driver, kdir, kubeconfig, node_name, pod_uid=UID_A) as a:
        preparing = asyncio.ensure_future(clients.prepare(a.settings.dra_socket, [ref]))
        await asyncio.wait_for(a_driver.in_hook.wait(), 10)
        b = server(b_driver, kdir, kubeconfig, node_name, pod_uid=UID_B)
        starting = asyncio.ensure_future(b.start())
        done, _ = await asyncio.wait({starting}, timeout=0.3)
        assert not done  # held at the claims lock while a is in its hook
        assert b_driver.restored == []
        a_driver.gate.set()
        assert (await preparing).claims[uid].error == ""
        await asyncio.wait_for(starting, 10)
        try:
            assert b_driver.restored == [[uid]]
            assert b_driver.unprepared == []  # nothing undone
            assert b.claims is not None
            assert uid in b.claims.checkpoint.claims
            assert list((kdir / "cdi").glob(f"*{uid}*")) != []
        finally:
            await b.stop()


async def test_only_the_newest_instance_writes_the_slices(
    kdir: Path, kubeconfig: Path, node_name: str, api: Api
) -> None:
    """Two versions publishing different devices never undo each other's slices: the older
    instance holds its writes while the newer one serves, and takes over when it goes."""
    a_driver = FakeDriver(gpus(2))
    async with server(a_driver, kdir, kubeconfig, node_name, pod_uid=UID_A) as a:
        assert a.publisher is not None
        await a.wait_published()
        api.wait_for_slices(DRIVER, node_name, 2)
        async with server(FakeDriver(gpus(3)), kdir, kubeconfig, node_name, pod_uid=UID_B) as b:
            assert b.publisher is not None
            assert not b.publisher.deferring  # a's socket was there before b: b is newer
            await b.wait_published()
            api.wait_for_slices(DRIVER, node_name, 3)
            await asyncio.wait_for(a.publisher.wait_deferring(True), 10)
            writes = a.publisher.writes
            a.publisher.update(gpus(2, unhealthy=[1]))  # a's devices change (as _consume does)
            await a.wait_published()
            assert a.publisher.writes == writes  # a wrote nothing
            assert sum(len(s["spec"]["devices"]) for s in api.slices(DRIVER, node_name)) == 3
        await asyncio.wait_for(a.publisher.wait_deferring(False), 10)  # b went: a takes over
        await a.wait_published()
        await asyncio.to_thread(api.wait_for_slices, DRIVER, node_name, 2)
        assert a.publisher.writes > writes


class _Peer:
    """Another pod's sockets in the plugin dir: a plain listening DRA socket (its backlog
    takes connections, nothing answers) and, with ``registers_as``, a registration socket
    whose GetInfo names that driver (``"hung"``: a socket that never answers)."""

    def __init__(self, kdir: Path, uid: str, registers_as: str | None) -> None:
        options = dra.DriverOptions(node_name="n", kubelet_dir=kdir, pod_uid=uid)
        settings = options.resolved(FakeDriver(()))
        self.dra_path, self.reg_path = settings.dra_socket, settings.registration_socket
        self.registers_as = registers_as
        self.sockets: list[socket.socket] = []
        self.grpc: grpc.aio.Server | None = None

    def _listen(self, path: Path) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(str(path))
        sock.listen()
        self.sockets.append(sock)

    async def start(self) -> None:
        self._listen(self.dra_path)
        if self.registers_as == "hung":
            self._listen(self.reg_path)
        elif self.registers_as is not None:
            self.grpc = grpc.aio.server()
            service = RegistrationService(
                self.registers_as, str(self.dra_path), supported_versions(health=False)
            )
            reg_grpc.add_RegistrationServicer_to_server(service, self.grpc)
            self.grpc.add_insecure_port(f"unix:{self.reg_path}")
            await self.grpc.start()

    async def kill(self) -> None:
        """As SIGKILL leaves it: the DRA socket's file stays, nothing answers."""
        for sock in self.sockets:
            sock.close()
        if self.grpc is not None:
            await self.grpc.stop(None)


async def _wait_noticed(server: DriverServer) -> None:
    """Until the server has seen another instance's socket (its inotify event came)."""
    async with asyncio.timeout(10):
        while not server._newer:
            await asyncio.sleep(0.01)


async def test_a_newer_instance_killed_with_its_socket_left_is_not_deferred_to(
    kdir: Path, kubeconfig: Path, node_name: str, api: Api
) -> None:
    """A socket left by a newer instance killed with SIGKILL refuses connections: the older
    instance takes the slices back at its next check (here a resync asked for at once)."""
    async with server(FakeDriver(gpus(2)), kdir, kubeconfig, node_name, pod_uid=UID_A) as a:
        assert a.publisher is not None
        await a.wait_published()
        newer = _Peer(kdir, UID_B, DRIVER)  # a newer instance of this driver serving
        try:
            await newer.start()
            await asyncio.wait_for(a.publisher.wait_deferring(True), 10)
        finally:
            await newer.kill()
        assert newer.dra_path.exists()
        a.publisher.request()  # the periodic resync, now
        await asyncio.wait_for(a.publisher.wait_deferring(False), 10)
        newer.dra_path.unlink()


@pytest.mark.parametrize(
    "registers_as",
    [None, "hung", "other.example.com"],
    ids=["no-registration", "hung-registration", "another-driver"],
)
async def test_a_socket_that_does_not_answer_as_this_driver_freezes_no_slice(
    kdir: Path, kubeconfig: Path, node_name: str, api: Api, registers_as: str | None
) -> None:
    """A listening dra-*.sock is not a newer instance unless its registration socket's
    GetInfo names this driver and that socket: deleted slices are put back, the loop never
    waits on a peer that does not answer."""
    async with server(FakeDriver(gpus(2)), kdir, kubeconfig, node_name, pod_uid=UID_A) as a:
        assert a.publisher is not None
        await a.wait_published()
        peer = _Peer(kdir, UID_B, registers_as)
        try:
            await peer.start()
            await _wait_noticed(a)
            for item in api.slices(DRIVER, node_name):  # someone deletes the slices
                api.call("DELETE", f"{RESOURCE}/resourceslices/{item['metadata']['name']}")
            await asyncio.to_thread(api.wait_for_slices, DRIVER, node_name, 2, 10)
            assert not a.publisher.deferring
        finally:
            await peer.kill()

"""The kit's ``refresh`` hook over the real DRA socket on a real API server: asked for each
prepared claim at start and before every answer from the checkpoint; what it remakes replaces
the checkpoint entry and the CDI spec, the CDI IDs stay; a wrong answer fails that answer."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

import kubedevice.dra as dra
from dra import clients
from dra.api import Api
from dra.conftest import create_claim, result
from dra.fakes import DRIVER, FakeDriver, gpus, server
from kubedevice.dra.node.settings import CHECKPOINT_FILE
from kubedevice.dra.state.checkpoint import Checkpoint

pytestmark = pytest.mark.timeout(60)


class RemakingDriver(FakeDriver):
    """Its device's "hardware" (``generation``) is lost on demand; refresh makes it again."""

    def __init__(self, devices: Sequence[dra.Device]) -> None:
        super().__init__(devices)
        self.generation = 1
        self.lost = False
        self.asked: list[str] = []
        self.answer: object = None  # a wrong answer to give instead, when set

    async def prepare(self, claim: dra.Claim) -> Sequence[dra.PreparedDevice]:
        self.prepared.append(claim)
        return [self._made(d) for d in claim.devices]

    def _made(self, device: dra.AllocatedDevice) -> dra.PreparedDevice:
        edits = dra.ContainerEdits(env={"MADE": str(self.generation)})
        return dra.PreparedDevice(device, edits, {"generation": self.generation})

    async def refresh(self, claim: dra.PreparedClaim) -> Sequence[dra.PreparedDevice | None] | None:
        self.asked.append(claim.ref.uid)
        if self.answer is not None:
            return self.answer  # type: ignore[return-value]
        if not self.lost:
            return None
        self.lost = False
        self.generation += 1
        return [
            self._made(dra.AllocatedDevice(request, pool, name, None))
            for request, pool, name in claim.devices
        ]


def _sock(kdir: Path) -> Path:
    return kdir / "plugins" / DRIVER / "dra.sock"


def _env(kdir: Path, uid: str) -> list[str]:
    spec = json.loads((kdir / "cdi" / f"k8s.{DRIVER}-claim_{uid}.json").read_text())
    return [e for d in spec["devices"] for e in d["containerEdits"].get("env", [])]


def _data(kdir: Path, uid: str) -> list[object]:
    checkpoint = Checkpoint(kdir / "plugins" / DRIVER / CHECKPOINT_FILE, DRIVER)
    checkpoint.load()
    return [dict(d) for d in checkpoint.claims[uid].data]


async def test_what_refresh_remakes_replaces_the_entry_and_the_spec(
    kdir: Path, kubeconfig: Path, node_name: str, api: Api
) -> None:
    claim = create_claim(
        api, "default", f"rf-{node_name}", results=[result("gpu", DRIVER, node_name, "gpu-0")]
    )
    ref = ("default", f"rf-{node_name}", claim["metadata"]["uid"])
    driver = RemakingDriver(gpus(1))
    async with server(driver, kdir, kubeconfig, node_name):
        first = (await clients.prepare(_sock(kdir), [ref])).claims[ref[2]]
        assert _env(kdir, ref[2]) == ["MADE=1"]
        driver.lost = True  # under a running driver: mended on the next answer
        again = (await clients.prepare(_sock(kdir), [ref])).claims[ref[2]]
        assert again == first  # the same CDI IDs
        assert _env(kdir, ref[2]) == ["MADE=2"]
        assert _data(kdir, ref[2]) == [{"generation": 2}]
        # a wrong answer fails that answer, and the entry stays
        driver.answer = [None, None]
        wrong = (await clients.prepare(_sock(kdir), [ref])).claims[ref[2]]
        assert "one entry per device" in wrong.error
        assert _data(kdir, ref[2]) == [{"generation": 2}]
    restarted = RemakingDriver(gpus(1))
    restarted.generation, restarted.lost = 2, True  # the reboot
    async with server(restarted, kdir, kubeconfig, node_name):
        # at start, before serving
        assert restarted.asked == [ref[2]]
        assert _env(kdir, ref[2]) == ["MADE=3"]
        assert _data(kdir, ref[2]) == [{"generation": 3}]
    assert len(driver.prepared) == 1
    assert restarted.prepared == []


async def test_a_refresh_answer_of_the_wrong_type_fails_the_claim_not_the_start(
    kdir: Path, kubeconfig: Path, node_name: str, api: Api
) -> None:
    """A refresh answer whose entry has no edits (``None``) or no device is that claim's
    error in one line, at start (the driver still starts) and before an answer."""
    claim = create_claim(
        api, "default", f"rfbad-{node_name}", results=[result("gpu", DRIVER, node_name, "gpu-0")]
    )
    ref = ("default", f"rfbad-{node_name}", claim["metadata"]["uid"])
    driver = RemakingDriver(gpus(1))
    async with server(driver, kdir, kubeconfig, node_name):
        assert (await clients.prepare(_sock(kdir), [ref])).claims[ref[2]].error == ""
    for wrong in (
        dra.PreparedDevice(dra.AllocatedDevice("gpu", node_name, "gpu-0", None), None, {}),  # type: ignore[arg-type]
        dra.PreparedDevice(None, dra.ContainerEdits(), {}),  # type: ignore[arg-type]
    ):
        restarted = RemakingDriver(gpus(1))
        restarted.answer = [wrong]
        async with server(restarted, kdir, kubeconfig, node_name):  # it starts
            assert restarted.asked == [ref[2]]
            answer = (await clients.prepare(_sock(kdir), [ref])).claims[ref[2]]
            assert answer.error.startswith("the refresh hook returned"), answer.error
        assert _data(kdir, ref[2]) == [{"generation": 1}]  # the entry stays


async def test_a_prepare_answer_without_edits_is_undone_and_named(
    kdir: Path, kubeconfig: Path, node_name: str, api: Api
) -> None:
    claim = create_claim(
        api, "default", f"pbad-{node_name}", results=[result("gpu", DRIVER, node_name, "gpu-0")]
    )
    ref = ("default", f"pbad-{node_name}", claim["metadata"]["uid"])

    class NoEdits(FakeDriver):
        async def prepare(self, claim: dra.Claim) -> Sequence[dra.PreparedDevice]:
            self.prepared.append(claim)
            return [dra.PreparedDevice(d, None, {}) for d in claim.devices]  # type: ignore[arg-type]

    driver = NoEdits(gpus(1))
    async with server(driver, kdir, kubeconfig, node_name) as srv:
        answer = (await clients.prepare(_sock(kdir), [ref])).claims[ref[2]]
        assert answer.error.startswith("the prepare hook returned"), answer.error
        assert "edits" in answer.error
        assert len(driver.unprepared) == 1  # what the hook did is undone at once
        assert srv.claims is not None
        assert ref[2] not in srv.claims.checkpoint.preparing

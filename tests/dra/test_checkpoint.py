"""The checkpoint's per-device data: kept across a restart, given to ``restore`` and
``unprepare``, covered by the checksum; a checkpoint from before the data still loads."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

import kubedevice.dra as dra
from dra import clients
from dra.api import Api
from dra.conftest import create_claim, result
from dra.fakes import DRIVER, FakeDriver, gpus, server
from kubedevice.dra.state.checkpoint import Checkpoint
from kubedevice.errors import KubeDeviceError

pytestmark = pytest.mark.timeout(60)

NAMESPACE = "default"

#: A checkpoint as the code before per-device data wrote it (saved by that code, verbatim).
OLD_CHECKPOINT = """\
{
 "checksum": "785057bd2b77e82b5a0a442ab7fdfe0d2bdcc94875ea1c0fd764c00ff965b8d6",
 "claims": {
  "uid-old-1": {
   "devices": [
    {
     "cdiIDs": [
      "k8s.gpu.test.kubedevice.io/claim=uid-old-1-gpu-0"
     ],
     "device": "gpu-0",
     "pool": "node-x",
     "request": "gpu",
     "shareID": null
    }
   ],
   "name": "old-claim",
   "namespace": "default"
  }
 },
 "driver": "gpu.test.kubedevice.io",
 "version": 1
}"""


class _Recording(FakeDriver):
    """Gives each device ``data`` (``data_for``) and records what ``restore`` got."""

    def __init__(self, devices: Sequence[dra.Device], data_for: Any = None) -> None:
        super().__init__(devices)
        self.data_for = data_for or (lambda name: {"slot": name, "tags": ("a", "b")})
        self.restored: list[list[dra.PreparedClaim]] = []

    async def prepare(self, claim: dra.Claim) -> Sequence[dra.PreparedDevice]:
        done = await super().prepare(claim)
        return [dra.PreparedDevice(p.device, p.edits, self.data_for(p.device.name)) for p in done]

    async def restore(self, claims: Sequence[dra.PreparedClaim]) -> None:
        self.restored.append(list(claims))


def _checkpoint(kdir: Path) -> Path:
    return kdir / "plugins" / DRIVER / "checkpoint.json"


async def test_device_data_survives_a_restart_and_reaches_restore_and_unprepare(
    kdir: Path, kubeconfig: Path, node_name: str, api: Api
) -> None:
    claim = create_claim(
        api,
        NAMESPACE,
        f"data-{node_name}",
        results=[
            result("gpu", DRIVER, node_name, "gpu-0"),
            result("gpu", DRIVER, node_name, "gpu-1"),
        ],
    )
    uid = claim["metadata"]["uid"]
    ref = (NAMESPACE, claim["metadata"]["name"], uid)
    dra_sock = kdir / "plugins" / DRIVER / "dra.sock"
    first = _Recording(gpus(2))
    async with server(first, kdir, kubeconfig, node_name):
        assert first.restored == [[]]  # a first start: nothing to restore
        assert (await clients.prepare(dra_sock, [ref])).claims[uid].error == ""
    saved = json.loads(_checkpoint(kdir).read_text())["claims"][uid]["devices"]
    assert [d["data"] for d in saved] == [
        {"slot": "gpu-0", "tags": ["a", "b"]},
        {"slot": "gpu-1", "tags": ["a", "b"]},
    ]
    second = _Recording(gpus(2))
    async with server(second, kdir, kubeconfig, node_name):
        (restored,) = second.restored
        assert [(c.ref.uid, [dict(d) for d in c.data]) for c in restored] == [
            (uid, [{"slot": "gpu-0", "tags": ["a", "b"]}, {"slot": "gpu-1", "tags": ["a", "b"]}])
        ]
        assert (await clients.unprepare(dra_sock, [ref])).claims[uid].error == ""
        (gone,) = second.unprepared
        assert gone.devices == (("gpu", node_name, "gpu-0"), ("gpu", node_name, "gpu-1"))
        assert [dict(d) for d in gone.data] == [
            {"slot": "gpu-0", "tags": ["a", "b"]},
            {"slot": "gpu-1", "tags": ["a", "b"]},
        ]
    assert json.loads(_checkpoint(kdir).read_text())["claims"] == {}


async def test_unprepare_before_a_restart_gets_the_data_as_read_back_from_json(
    kdir: Path, kubeconfig: Path, node_name: str, api: Api
) -> None:
    claim = create_claim(
        api, NAMESPACE, f"same-{node_name}", results=[result("gpu", DRIVER, node_name, "gpu-0")]
    )
    ref = (NAMESPACE, claim["metadata"]["name"], claim["metadata"]["uid"])
    driver = _Recording(gpus(1))
    async with server(driver, kdir, kubeconfig, node_name):
        dra_sock = kdir / "plugins" / DRIVER / "dra.sock"
        assert (await clients.prepare(dra_sock, [ref])).claims[ref[2]].error == ""
        assert (await clients.unprepare(dra_sock, [ref])).claims[ref[2]].error == ""
    # tuples come back as lists, as they would after a restart
    assert [dict(d) for d in driver.unprepared[0].data] == [{"slot": "gpu-0", "tags": ["a", "b"]}]


async def test_a_checkpoint_written_before_device_data_loads(
    kdir: Path, kubeconfig: Path, node_name: str
) -> None:
    path = _checkpoint(kdir)
    path.parent.mkdir(parents=True)
    path.write_text(OLD_CHECKPOINT)
    # the spec the older driver wrote is still there (no reboot): answered as it is
    spec = kdir / "cdi" / f"k8s.{DRIVER}-claim_uid-old-1.json"
    spec.parent.mkdir()
    spec.write_text("{}")
    ref = (NAMESPACE, "old-claim", "uid-old-1")
    driver = _Recording(gpus(1))
    async with server(driver, kdir, kubeconfig, node_name):
        (restored,) = driver.restored
        assert [(c.ref, c.devices, c.data) for c in restored] == [
            (dra.ClaimRef(*ref), (("gpu", "node-x", "gpu-0"),), ({},))
        ]
        dra_sock = path.parent / "dra.sock"
        again = await clients.prepare(dra_sock, [ref])  # answered from the checkpoint
        assert [list(d.cdi_device_ids) for d in again.claims[ref[2]].devices] == [
            [f"k8s.{DRIVER}/claim=uid-old-1-gpu-0"]
        ]
        assert driver.prepared == []
        assert (await clients.unprepare(dra_sock, [ref])).claims[ref[2]].error == ""
        assert [c.ref.uid for c in driver.unprepared] == [ref[2]]
    assert not list(path.parent.glob("checkpoint.json.corrupt-*"))


def test_a_checkpoint_without_data_is_written_as_before(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    path.write_text(OLD_CHECKPOINT)
    checkpoint = Checkpoint(path, DRIVER)
    checkpoint.load()
    assert list(checkpoint.claims) == ["uid-old-1"]
    path.unlink()
    checkpoint.save()
    # the same document (keys, values, checksum) plus the version's number, which an older
    # driver ignores: it reads it back after a downgrade (the layout is compact now; JSON
    # readers do not mind)
    assert json.loads(path.read_text()) == {**json.loads(OLD_CHECKPOINT), "seq": 1}


async def test_the_checksum_covers_the_data(
    kdir: Path, kubeconfig: Path, node_name: str, api: Api, caplog: pytest.LogCaptureFixture
) -> None:
    claim = create_claim(
        api, NAMESPACE, f"sum-{node_name}", results=[result("gpu", DRIVER, node_name, "gpu-0")]
    )
    ref = (NAMESPACE, claim["metadata"]["name"], claim["metadata"]["uid"])
    async with server(_Recording(gpus(1)), kdir, kubeconfig, node_name):
        dra_sock = kdir / "plugins" / DRIVER / "dra.sock"
        assert (await clients.prepare(dra_sock, [ref])).claims[ref[2]].error == ""
    path = _checkpoint(kdir)
    document = json.loads(path.read_text())
    document["claims"][ref[2]]["devices"][0]["data"]["slot"] = "gpu-7"
    path.write_text(json.dumps(document))
    second = _Recording(gpus(1))
    async with server(second, kdir, kubeconfig, node_name):
        assert second.restored == [[]]
    assert "is unusable (checksum mismatch)" in caplog.text


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ({"when": object()}, "is not JSON: Object of type object is not JSON serializable"),
        ({1: "x"}, "is not JSON: its keys must be strings"),
        ({"nan": float("nan")}, "is not JSON: Out of range float values"),
        ({"big": "x" * 20_000}, "is larger than 10240 bytes as JSON"),
        (["not", "a", "mapping"], "is list, not a mapping"),
    ],
    ids=["object", "int-key", "nan", "too-large", "list"],
)
async def test_data_that_cannot_be_kept_fails_the_claim_and_is_undone(
    kdir: Path, kubeconfig: Path, node_name: str, api: Api, data: Any, needle: str
) -> None:
    claim = create_claim(
        api, NAMESPACE, f"bad-{node_name}", results=[result("gpu", DRIVER, node_name, "gpu-0")]
    )
    ref = (NAMESPACE, claim["metadata"]["name"], claim["metadata"]["uid"])
    driver = _Recording(gpus(1), data_for=lambda name: data)
    async with server(driver, kdir, kubeconfig, node_name):
        answer = await clients.prepare(kdir / "plugins" / DRIVER / "dra.sock", [ref])
    error = answer.claims[ref[2]].error
    assert error.startswith(f"the prepare hook's data for device gpu-0 {needle}"), error
    assert [c.ref.uid for c in driver.unprepared] == [ref[2]]
    assert json.loads(_checkpoint(kdir).read_text())["claims"] == {}  # never kept with it
    assert not list(kdir.glob("cdi/*.json"))


class _BadRestore(FakeDriver):
    async def restore(self, claims: Sequence[dra.PreparedClaim]) -> None:
        raise RuntimeError("state is gone")


async def test_a_failing_restore_hook_fails_the_start(
    kdir: Path, kubeconfig: Path, node_name: str
) -> None:
    with pytest.raises(KubeDeviceError, match="restore hook failed: RuntimeError: state is gone"):
        async with server(_BadRestore(gpus(1)), kdir, kubeconfig, node_name):
            pass
    assert not (kdir / "plugins" / DRIVER / "dra.sock").exists()


def test_changed_says_only_when_another_instance_wrote(tmp_path: Path) -> None:
    """Two instances share the file: each reads it again only after the other replaced it."""
    path = tmp_path / "checkpoint.json"
    path.write_text(OLD_CHECKPOINT)
    mine = Checkpoint(path, "gpu.test.kubedevice.io")
    other = Checkpoint(path, "gpu.test.kubedevice.io")
    mine.load()
    other.load()
    assert not mine.changed()  # nothing changed
    mine.save()
    assert not mine.changed()  # its own write
    assert other.changed()  # the other's write
    other.load()
    assert set(other.claims) == {"uid-old-1"}
    del other.claims["uid-old-1"]
    other.save()
    assert mine.changed()
    mine.load()
    assert mine.claims == {}
    assert not mine.changed()
    path.unlink()
    assert mine.changed()

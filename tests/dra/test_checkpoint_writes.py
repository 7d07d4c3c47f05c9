"""The checkpoint's write path: each claim encoded once, the same document as before (so
either version reads the other's files), a changed claim written anew, the fsync on demand."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import os
import threading
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest

from kubedevice.dra.model.types import ClaimRef, PreparedClaim
from kubedevice.dra.state import checkpoint as checkpoint_module
from kubedevice.dra.state.checkpoint import Checkpoint

DRIVER = "gpu.test.kubedevice.io"


def _claim(i: int) -> PreparedClaim:
    uid = f"uid-{i:04d}"
    return PreparedClaim(
        ref=ClaimRef(namespace="default", name=f"claim-{i}", uid=uid),
        devices=(("gpu", "node-a", f"gpu-{i}"),),
        cdi_ids=((f"k8s.{DRIVER}/claim={uid}-gpu-{i}",),),
        share_ids=(None,),
        data=(MappingProxyType({"slot": i, "ratio": 1.5, "name": "é"}),),
        edits=(MappingProxyType({"env": [f"GPU={i}"]}),),
        admin_access=(i % 2 == 0,),
    )


def _old_document(checkpoint: Checkpoint) -> dict[str, Any]:
    """The document as the earlier write path built it (whole, sorted, checksummed)."""
    claims = {
        uid: checkpoint_module._encode_claim(c) for uid, c in sorted(checkpoint.claims.items())
    }
    for uid, c in sorted(checkpoint.preparing.items()):
        claims[uid] = {**checkpoint_module._encode_claim(c), "state": "preparing"}
    canonical = json.dumps(claims, sort_keys=True, separators=(",", ":"))
    return {
        "version": 1,
        "driver": checkpoint.driver_name,
        "checksum": hashlib.sha256(canonical.encode()).hexdigest(),
        "claims": claims,
    }


def test_the_document_is_the_one_the_earlier_version_wrote_and_loads(tmp_path: Path) -> None:
    checkpoint = Checkpoint(tmp_path / "c.json", DRIVER)
    for i in range(5):
        checkpoint.claims[f"uid-{i:04d}"] = _claim(i)
    checkpoint.preparing["uid-0007"] = _claim(7)
    checkpoint.save()
    # the earlier document, plus the version's number (which the earlier reader ignores)
    assert json.loads(checkpoint.path.read_text()) == {**_old_document(checkpoint), "seq": 1}
    # and a file in the earlier layout (indented) loads
    checkpoint.path.write_text(json.dumps(_old_document(checkpoint), indent=1, sort_keys=True))
    again = Checkpoint(checkpoint.path, DRIVER)
    again.load()
    assert again.set_aside is None
    assert again.claims == checkpoint.claims
    assert again.preparing == checkpoint.preparing


def test_a_save_encodes_only_the_claims_that_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkpoint = Checkpoint(tmp_path / "c.json", DRIVER)
    for i in range(300):
        checkpoint.claims[f"uid-{i:04d}"] = _claim(i)
    encoded: list[str] = []
    real = checkpoint_module._encode_claim

    def counting(claim: PreparedClaim) -> dict[str, Any]:
        encoded.append(claim.ref.uid)
        return real(claim)

    monkeypatch.setattr(checkpoint_module, "_encode_claim", counting)
    checkpoint.save()
    assert len(encoded) == 300
    encoded.clear()
    checkpoint.preparing["uid-0300"] = _claim(300)  # a prepare starts
    checkpoint.save()
    assert encoded == ["uid-0300"]
    encoded.clear()
    checkpoint.claims["uid-0300"] = checkpoint.preparing.pop("uid-0300")  # ... and ends
    del checkpoint.claims["uid-0001"]  # an unprepare
    checkpoint.save()
    assert encoded == ["uid-0300"]  # its entry without "state"
    encoded.clear()
    checkpoint.save()
    assert encoded == []
    loaded = Checkpoint(checkpoint.path, DRIVER)
    loaded.load()
    assert loaded.claims == checkpoint.claims
    assert "uid-0001" not in loaded.claims
    assert loaded.preparing == {}


def test_a_claim_replaced_by_a_new_object_is_encoded_again(tmp_path: Path) -> None:
    checkpoint = Checkpoint(tmp_path / "c.json", DRIVER)
    checkpoint.claims["uid-0001"] = _claim(1)
    checkpoint.save()
    changed = dataclasses.replace(_claim(1), data=(MappingProxyType({"slot": 99}),))
    checkpoint.claims["uid-0001"] = changed
    checkpoint.save()
    loaded = Checkpoint(checkpoint.path, DRIVER)
    loaded.load()
    assert loaded.claims["uid-0001"].data[0]["slot"] == 99


def test_save_without_sync_is_seen_at_once_and_sync_makes_it_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[int] = []
    real_fsync = os.fsync

    def recording(fd: int) -> None:
        synced.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording)
    monkeypatch.setattr(os, "fdatasync", recording)
    checkpoint = Checkpoint(tmp_path / "c.json", DRIVER)
    checkpoint.claims["uid-0001"] = _claim(1)
    checkpoint.save(sync=False)
    assert synced == []
    reader = Checkpoint(checkpoint.path, DRIVER)  # another process would read the same
    reader.load()
    assert list(reader.claims) == ["uid-0001"]
    checkpoint.sync()
    assert len(synced) == 2  # the file, then its directory
    checkpoint.save()
    assert len(synced) == 3  # a plain save syncs (its data) before the exchange


async def test_an_unprepare_is_answered_after_the_write_and_synced_right_after(
    tmp_path: Path,
) -> None:
    from collections.abc import AsyncIterator, Sequence

    import kubedevice.dra as dra
    from kubedevice._api.dra.v1 import api_pb2 as v1
    from kubedevice.dra.node.service import ClaimService
    from kubedevice.dra.state.cdi import CdiWriter

    class Driver(dra.Driver):
        driver_name = DRIVER

        async def devices(self) -> AsyncIterator[Sequence[dra.Device]]:
            yield []

    events: list[str] = []
    gate = threading.Event()

    class Recording(Checkpoint):
        def save(self, *, sync: bool = True) -> None:
            super().save(sync=sync)
            events.append(f"save sync={sync}")

        def sync(self) -> None:
            assert gate.wait(10)  # held until the test has its answer
            super().sync()
            events.append("sync")

    checkpoint = Recording(tmp_path / "c.json", DRIVER)
    checkpoint.claims = {f"uid-{i:04d}": _claim(i) for i in range(3)}
    checkpoint.save()
    events.clear()
    service = ClaimService(
        Driver(),
        driver_name=DRIVER,
        node_name="node-a",
        kube=None,
        checkpoint=checkpoint,
        cdi=CdiWriter(tmp_path / "cdi", DRIVER),
        devices=dict,
    )
    claims = [v1.Claim(namespace="default", name=f"claim-{i}", uid=f"uid-{i:04d}") for i in (0, 1)]
    # answered while the fsync is held: the answer does not wait for it
    answer = await asyncio.wait_for(
        service.unprepare(v1.NodeUnprepareResourcesRequest(claims=claims)), 5
    )
    assert [answer.claims[c.uid].error for c in claims] == ["", ""]
    on_disk = Checkpoint(checkpoint.path, DRIVER)
    on_disk.load()
    assert list(on_disk.claims) == ["uid-0002"]  # in the file when answered
    assert events == ["save sync=False"]  # one write for the call's claims, not synced yet
    assert service.saver.syncing is not None
    gate.set()
    await service.saver.syncing
    assert events[-1] == "sync"
    assert events.count("sync") == 1  # one fsync for the call's claims


@pytest.mark.parametrize(("claims", "on_loop"), [(3, True), (400, False)])
async def test_an_unsynced_save_of_a_small_file_is_written_on_the_loop(
    tmp_path: Path, claims: int, on_loop: bool
) -> None:
    """A thread hop there and back costs more than writing a small file into the page
    cache; a big file (or a synced save) is written in a thread, so the loop never waits
    on the disk."""
    from kubedevice.dra.state.saver import ON_LOOP_BYTES, CheckpointSaver

    writers: list[bool] = []

    class Recording(Checkpoint):
        def save(self, *, sync: bool = True) -> None:
            writers.append(threading.current_thread() is threading.main_thread())
            super().save(sync=sync)

    checkpoint = Recording(tmp_path / "c.json", DRIVER)
    checkpoint.claims = {f"uid-{i:04d}": _claim(i) for i in range(claims)}
    saver = CheckpointSaver(checkpoint)
    await saver.save(sync=True)  # the first write: in a thread, synced
    assert (checkpoint.written_bytes <= ON_LOOP_BYTES) == on_loop
    del checkpoint.claims["uid-0001"]
    await saver.save(sync=False)
    assert writers == [False, on_loop]
    reread = Checkpoint(checkpoint.path, DRIVER)
    reread.load()
    assert "uid-0001" not in reread.claims
    assert len(reread.claims) == claims - 1
    if saver.syncing is not None:
        await saver.syncing


async def test_a_new_prepare_syncs_once_after_its_hook_and_its_spec_not_at_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The "preparing" record is in the file (every process, and the next start after a
    kill, sees it) when the hook runs, but is not fsynced on its own: the one synced save
    after the hook makes both durable. The CDI spec is never fsynced (a start writes it
    again from the checkpoint)."""
    from collections.abc import AsyncIterator, Sequence

    import kubedevice.dra as dra
    from dra.fakes import gpus
    from kubedevice._api.dra.v1 import api_pb2 as v1
    from kubedevice.dra.node.service import ClaimService
    from kubedevice.dra.state.cdi import CdiWriter

    devices = {d.name: d for d in gpus(1)}
    events: list[str] = []
    synced: list[str] = []
    real_fsync, real_fdatasync = os.fsync, os.fdatasync

    def recording(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    def recording_data(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fdatasync(fd)

    monkeypatch.setattr(os, "fsync", recording)
    monkeypatch.setattr(os, "fdatasync", recording_data)

    class Recording(Checkpoint):
        def save(self, *, sync: bool = True) -> None:
            super().save(sync=sync)
            events.append(f"save sync={sync}")

        def sync(self) -> None:
            super().sync()
            events.append("sync")

    checkpoint = Recording(tmp_path / "c.json", DRIVER)

    class Driver(dra.Driver):
        driver_name = DRIVER

        async def devices(self) -> AsyncIterator[Sequence[dra.Device]]:
            yield list(devices.values())

        async def prepare(self, claim: dra.Claim) -> Sequence[dra.PreparedDevice]:
            on_disk = Checkpoint(checkpoint.path, DRIVER)
            on_disk.load()
            events.append(f"hook sees preparing={sorted(on_disk.preparing)}")
            return await super().prepare(claim)

    class Kube:
        async def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
            result = {"request": "gpu", "driver": DRIVER, "pool": "node-a", "device": "gpu-0"}
            return {
                "metadata": {"namespace": namespace, "name": name, "uid": "uid-0001"},
                "status": {"allocation": {"devices": {"results": [result]}}},
            }

    service = ClaimService(
        Driver(),
        driver_name=DRIVER,
        node_name="node-a",
        kube=Kube(),  # type: ignore[arg-type]
        checkpoint=checkpoint,
        cdi=CdiWriter(tmp_path / "cdi", DRIVER),
        devices=lambda: devices,
    )
    claim = v1.Claim(namespace="default", name="claim-1", uid="uid-0001")
    answer = await service.prepare(v1.NodePrepareResourcesRequest(claims=[claim]))
    assert answer.claims["uid-0001"].error == ""
    assert events == ["save sync=False", "hook sees preparing=['uid-0001']", "save sync=True"]
    assert service.saver.syncing is None  # no fsync of the "preparing" record follows
    # one sync: the checkpoint's new version (its twin), before the two were exchanged;
    # none of a spec
    assert [Path(p).name for p in synced] == [".c.json.twin"]
    assert (tmp_path / "cdi" / f"k8s.{DRIVER}-claim_uid-0001.json").is_file()


async def test_an_unsynced_save_does_not_wait_for_the_fsync_of_the_one_before(
    tmp_path: Path,
) -> None:
    """Back-to-back unprepares: the second is written (and answered) while the first's
    fsync still runs; its own change is synced after, by the same background task."""
    from kubedevice.dra.state.saver import CheckpointSaver

    gate = threading.Event()
    syncs: list[int] = []

    class Held(Checkpoint):
        def sync(self) -> None:
            assert gate.wait(10)  # the first fsync is held until the second save is done
            super().sync()
            syncs.append(len(self.claims))

    checkpoint = Held(tmp_path / "c.json", DRIVER)
    checkpoint.claims = {f"uid-{i:04d}": _claim(i) for i in range(3)}
    saver = CheckpointSaver(checkpoint)
    await saver.save()
    del checkpoint.claims["uid-0000"]
    await saver.save(sync=False)
    syncing = saver.syncing
    assert syncing is not None
    del checkpoint.claims["uid-0001"]
    await asyncio.wait_for(saver.save(sync=False), 5)  # not behind the held fsync
    reread = Checkpoint(checkpoint.path, DRIVER)
    reread.load()
    assert list(reread.claims) == ["uid-0002"]
    gate.set()
    await syncing
    assert syncs[-1] == 1  # the last change synced too
    assert saver.syncing is None


def test_a_write_cut_off_in_the_twin_leaves_the_file_whole(tmp_path: Path) -> None:
    """A process killed mid-write has written only (part of) the twin: the file is the
    version before, whole."""
    checkpoint = Checkpoint(tmp_path / "c.json", DRIVER)
    checkpoint.claims = {"uid-0001": _claim(1)}
    checkpoint.save()
    checkpoint.claims["uid-0002"] = _claim(2)
    checkpoint.save(sync=False)
    twin = tmp_path / ".c.json.twin"
    assert json.loads(twin.read_text())["claims"].keys() == {"uid-0001"}
    with twin.open("r+b") as f:  # the next write, cut off halfway into the twin
        f.write(b'{"checksum":"00","claims":{"uid-')
    reader = Checkpoint(checkpoint.path, DRIVER)
    reader.load()
    assert reader.set_aside is None
    assert sorted(reader.claims) == ["uid-0001", "uid-0002"]


def test_a_file_torn_by_a_power_loss_is_set_aside_and_the_twin_taken(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A power loss may keep the exchange of the names but not the new version's unsynced
    data: the file does not decode; the twin (the version before, whole) is started from,
    and made the file again."""
    checkpoint = Checkpoint(tmp_path / "c.json", DRIVER)
    checkpoint.claims = {"uid-0001": _claim(1)}
    checkpoint.save()
    checkpoint.claims["uid-0002"] = _claim(2)
    checkpoint.save(sync=False)
    torn = checkpoint.path.read_bytes()[:300] + b"\0" * 200  # part of it reached the disk
    checkpoint.path.write_bytes(torn)
    reader = Checkpoint(checkpoint.path, DRIVER)
    reader.load()
    assert reader.set_aside is not None
    assert reader.set_aside.read_bytes() == torn
    assert sorted(reader.claims) == ["uid-0001"]
    assert "is whole; starting from it: 1 prepared claims" in caplog.text
    again = Checkpoint(checkpoint.path, DRIVER)  # what every instance now reads
    again.load()
    assert again.set_aside is None
    assert sorted(again.claims) == ["uid-0001"]
    assert not reader.changed()


def test_a_torn_file_without_a_whole_twin_starts_empty(tmp_path: Path) -> None:
    checkpoint = Checkpoint(tmp_path / "c.json", DRIVER)
    checkpoint.claims = {"uid-0001": _claim(1)}
    checkpoint.save()
    checkpoint.save()
    checkpoint.path.write_bytes(b'{"version": 1, "claims": {"x": ')
    (tmp_path / ".c.json.twin").write_bytes(b"{")
    reader = Checkpoint(checkpoint.path, DRIVER)
    reader.load()
    assert reader.set_aside is not None
    assert reader.claims == {}
    assert reader.preparing == {}


def test_a_claims_spec_is_compact_json_and_an_indented_one_of_the_same_content_is_kept(
    tmp_path: Path,
) -> None:
    """The spec is encoded by json's C encoder (no indent: the Python encoder took
    0.06-0.17 ms on the loop per prepare); a spec an earlier version wrote indented, with
    the same content, is not written again (no "written again" at the upgrade's start)."""
    from kubedevice.dra.state.cdi import CdiWriter

    cdi = CdiWriter(tmp_path / "cdi", DRIVER)
    devices = [("uid-0001-gpu-1", MappingProxyType({"env": ["GPU=1"]}))]
    text = cdi.text("uid-0001", devices)
    assert "\n" not in text
    assert " " not in text
    path = cdi.path("uid-0001")
    path.parent.mkdir()
    earlier = json.dumps(json.loads(text), indent=2, sort_keys=True)
    path.write_text(earlier)
    assert cdi.ensure("uid-0001", devices) is False
    assert path.read_text() == earlier
    path.write_text(earlier.replace("GPU=1", "GPU=2"))
    assert cdi.ensure("uid-0001", devices) is True
    assert path.read_text() == text


def test_without_renameat2_a_save_is_a_rename_and_still_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No renameat2 (not glibc 2.28+): the twin is renamed over the file (and made again
    on the next save); readers still get whole versions."""
    from kubedevice.dra.state import twin as twin_module

    monkeypatch.setattr(twin_module, "_RENAMEAT2", None)
    checkpoint = Checkpoint(tmp_path / "c.json", DRIVER)
    for i in range(3):
        checkpoint.claims[f"uid-{i:04d}"] = _claim(i)
        checkpoint.save(sync=i == 0)
        assert not (tmp_path / ".c.json.twin").exists()
        reader = Checkpoint(checkpoint.path, DRIVER)
        reader.load()
        assert len(reader.claims) == i + 1
    assert os.stat(checkpoint.path).st_mode & 0o777 == 0o600


def test_a_filesystem_without_the_exchange_falls_back_to_renames_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ctypes
    import errno

    from kubedevice.dra.state import twin as twin_module

    tries: list[int] = []

    def refusing(*_args: Any) -> int:
        tries.append(1)
        ctypes.set_errno(errno.EINVAL)  # as overlayfs answers RENAME_EXCHANGE
        return -1

    monkeypatch.setattr(twin_module, "_RENAMEAT2", refusing)
    checkpoint = Checkpoint(tmp_path / "c.json", DRIVER)
    for i in range(3):
        checkpoint.claims[f"uid-{i:04d}"] = _claim(i)
        checkpoint.save()
    assert len(tries) == 1  # refused at the first save, never tried again
    reader = Checkpoint(checkpoint.path, DRIVER)
    reader.load()
    assert len(reader.claims) == 3


def test_a_file_two_versions_back_is_passed_over_for_its_newer_twin(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A power loss may keep the exchange of an unsynced write and none of its blocks: the
    file is then whole but two versions back (the twin's old content) and the twin, the
    version before the lost one, is newer: it is taken (the old code started from the file,
    with a claim unprepared since)."""
    checkpoint = Checkpoint(tmp_path / "c.json", DRIVER)
    checkpoint.claims = {"uid-0001": _claim(1), "uid-0002": _claim(2)}
    checkpoint.save()  # version 1: both prepared
    del checkpoint.claims["uid-0002"]
    checkpoint.save()  # version 2: uid-0002 unprepared (synced)
    two_back = checkpoint.path.with_name("two-back")
    os.replace(tmp_path / ".c.json.twin", two_back)  # version 1
    checkpoint.preparing["uid-0003"] = _claim(3)
    checkpoint.save(sync=False)  # version 3, its data lost: the file reads as version 1
    os.replace(two_back, checkpoint.path)
    reader = Checkpoint(checkpoint.path, DRIVER)
    reader.load()
    assert sorted(reader.claims) == ["uid-0001"]
    assert reader.preparing == {}
    assert "older than its twin's" in caplog.text
    again = Checkpoint(checkpoint.path, DRIVER)  # the twin is the file again
    again.load()
    assert sorted(again.claims) == ["uid-0001"]


def test_a_file_without_a_version_number_is_never_passed_over(tmp_path: Path) -> None:
    """An earlier version of the kit (a rolling upgrade's other instance) writes no number:
    its file is newer than any twin."""
    checkpoint = Checkpoint(tmp_path / "c.json", DRIVER)
    checkpoint.claims = {"uid-0001": _claim(1)}
    checkpoint.save()
    checkpoint.save()
    unnumbered = json.loads(checkpoint.path.read_text())
    del unnumbered["seq"]
    unnumbered["claims"] = {}
    unnumbered["checksum"] = hashlib.sha256(b"{}").hexdigest()
    checkpoint.path.write_text(json.dumps(unnumbered))
    reader = Checkpoint(checkpoint.path, DRIVER)
    reader.load()
    assert reader.set_aside is None
    assert reader.claims == {}

"""Allocations across restarts, and corrupt checkpoints set aside."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kubelet_helpers import pod_manifest
from rawplugin import Dev, RawPlugin, devs

from kubedevice.errors import AdmissionError
from kubedevice.kubelet import AdmissionEvent, Emulator, ReadmissionEvent
from kubedevice.kubelet.checkpoint import loads

R = "example.com/foo"


async def test_allocations_survive_emulator_restart(dp_dir: Path) -> None:
    async with Emulator(dp_dir, control_socket=False) as emu:
        p = RawPlugin(dp_dir, R, devs(3, numa=lambda i: (0,)))
        await p.start()
        await emu.wait_for_resource(R, allocatable=3)
        await emu.apply_pod(pod_manifest("p", {R: 2}))
        await p.stop()
    data = loads((dp_dir / "kubelet_internal_checkpoint").read_bytes())
    assert data.entries is not None
    assert [dict(e.device_ids or {}) for e in data.entries] == [{0: ["d0", "d1"]}]
    # a new emulator (new "process"): resource known from the checkpoint, allocatable 0
    async with Emulator(dp_dir, control_socket=False) as emu2:
        s = emu2.node().resources[R]
        assert (s.capacity, s.allocatable, s.allocated, s.connected) == (0, 0, 2, False)
        p2 = RawPlugin(dp_dir, R, devs(3))
        await p2.start()
        await emu2.wait_for_resource(R, allocatable=3)
        # without the pod journal the allocation belongs to an unknown pod: GC'd at admission
        pod = await emu2.apply_pod(pod_manifest("q", {R: 3}))
        assert pod.container("c").devices[R] == ("d0", "d1", "d2")
        await p2.stop()


async def test_simulated_restart_keeps_pods_and_devices(dp_dir: Path) -> None:
    async with Emulator(dp_dir, control_socket=False) as emu:
        p = RawPlugin(dp_dir, R, devs(3))
        await p.start()
        await emu.wait_for_resource(R, allocatable=3)
        await emu.apply_pod(pod_manifest("p", {R: 2}))
        await emu.restart()
        assert [x.name for x in emu.pods()] == ["p"]
        assert emu.pods()[0].container("c").devices == {R: ("d0", "d1")}
        assert emu.pods()[0].container("c").runtime.envs == {"DEVICES": "d0,d1"}
        await p.stop()
        p2 = RawPlugin(dp_dir, R, devs(3))
        await p2.start()
        await emu.wait_for_resource(R, allocatable=3)
        with pytest.raises(AdmissionError, match="Requested: 2, Available: 1"):
            await emu.apply_pod(pod_manifest("q", {R: 2}))
        assert p2.calls.allocate == []  # not re-issued for the running pod
        await p2.stop()


@pytest.mark.parametrize(
    "content",
    [
        b"\x89\x00garbage\xff",
        b'{"Data":{"PodDeviceEntries":null,"RegisteredDevices":{"example.com/foo":[]}},'
        b'"Checksum":12345}',
        json.dumps({"apiVersion": "v1", "kind": "Something"}).encode(),
        b"",
    ],
    ids=["garbage", "bad-checksum", "wrong-shape", "empty"],
)
async def test_corrupt_checkpoint_set_aside(dp_dir: Path, content: bytes) -> None:
    cp = dp_dir / "kubelet_internal_checkpoint"
    cp.write_bytes(content)
    async with Emulator(dp_dir, control_socket=False) as emu:
        assert emu.node().resources == {}
        assert len(emu.checkpoint_errors) == 1
        aside = [p for p in dp_dir.iterdir() if p.name.startswith(cp.name + ".corrupt-")]
        assert len(aside) == 1
        assert aside[0].read_bytes() == content
        assert loads(cp.read_bytes()).entries is None  # a fresh, valid checkpoint


def _registered(dp_dir: Path) -> dict[str, list[str] | None] | None:
    data = loads((dp_dir / "kubelet_internal_checkpoint").read_bytes())  # checksum verified
    return None if data.registered is None else dict(data.registered)


async def test_checkpoint_follows_device_sets_and_grace(dp_dir: Path) -> None:
    cp = dp_dir / "kubelet_internal_checkpoint"
    async with Emulator(dp_dir, control_socket=False, grace_period_s=0.3) as emu:
        # a fresh node writes exactly what a fresh kubelet writes (contract vector 1)
        assert cp.read_bytes() == (
            b'{"Data":{"PodDeviceEntries":null,"RegisteredDevices":{}},"Checksum":3467439661}'
        )
        p = RawPlugin(dp_dir, R, [*devs(2, "b"), *devs(1, "a", health="Unhealthy")])
        await p.start()
        await emu.wait_for_resource(R, allocatable=2)
        assert _registered(dp_dir) == {R: ["b0", "b1"]}  # healthy IDs only, after the message
        await p.stop()
        await emu.wait_for_resource(R, allocatable=0)
        assert _registered(dp_dir) == {R: []}  # key kept with [] during the grace period
        await emu.wait_until(lambda: R not in emu.node().resources, 5)
        assert _registered(dp_dir) == {}


async def test_checkpoint_only_resource_removed_after_grace(dp_dir: Path) -> None:
    (dp_dir / "kubelet_internal_checkpoint").write_bytes(
        b'{"Data":{"PodDeviceEntries":null,"RegisteredDevices":{"example.com/foo":null}},'
        b'"Checksum":1667033492}'  # contract vector 5: written by Go, null list
    )
    async with Emulator(dp_dir, control_socket=False, grace_period_s=0.3) as emu:
        assert emu.checkpoint_errors == []
        s = emu.node().resources[R]
        assert (s.capacity, s.allocatable, s.connected) == (0, 0, False)
        assert _registered(dp_dir) == {R: []}  # rewritten as the kubelet would: []
        await emu.wait_until(lambda: R not in emu.node().resources, 5)
        assert _registered(dp_dir) == {}


async def test_restored_allocation_keeps_numa_groups_and_response(dp_dir: Path) -> None:
    from rawplugin import Dev

    async with Emulator(dp_dir, control_socket=False) as emu:
        p = RawPlugin(dp_dir, R, [Dev("a", numa=(0, 1)), Dev("b")])
        await p.start()
        await emu.wait_for_resource(R, allocatable=2)
        pod = await emu.apply_pod(pod_manifest("p", {R: 2}))
        before = pod.container("c")
        await emu.restart()  # re-reads the checkpoint it wrote
        after = emu.pod("p").container("c")
        assert sorted(after.devices[R]) == ["a", "b"]
        assert after.runtime == before.runtime  # AllocResp survived the round trip
        data = loads((dp_dir / "kubelet_internal_checkpoint").read_bytes())
        assert data.entries is not None
        assert [dict(e.device_ids or {}) for e in data.entries] == [{-1: ["b"], 0: ["a"], 1: ["a"]}]
        await p.stop()


async def test_undecodable_alloc_resp_entry_is_skipped(dp_dir: Path) -> None:
    # checksum-valid checkpoint whose AllocResp is not a ContainerAllocateResponse: the
    # kubelet logs "Can't unmarshal allocResp" and drops that entry; never a crash
    from kubedevice.kubelet.checkpoint import CheckpointData, CheckpointEntry, dumps

    async with Emulator(dp_dir) as emu:  # with the pod journal
        p = RawPlugin(dp_dir, R, devs(2))
        await p.start()
        await emu.wait_for_resource(R, allocatable=2)
        await emu.apply_pod(pod_manifest("p", {R: 1}))
        await emu.apply_pod(pod_manifest("q", {R: 1}))
        await p.stop()
    cp = dp_dir / "kubelet_internal_checkpoint"
    data = loads(cp.read_bytes())
    assert data.entries is not None
    bad, good = data.entries
    bad = CheckpointEntry(bad.pod_uid, bad.container, bad.resource, bad.device_ids, b"\x00")
    cp.write_bytes(dumps(CheckpointData((bad, good), data.registered)))
    async with Emulator(dp_dir) as emu2:
        assert emu2.checkpoint_errors == []
        devices = {x.name: x.container("c").devices for x in emu2.pods()}
        assert devices == {"p": {}, "q": {R: ("d1",)}}
        assert emu2.node().resources[R].allocated == 1


async def _readmitted(emu: Emulator, after: int) -> ReadmissionEvent:
    await emu.wait_until(lambda: len(emu.events.of_type(ReadmissionEvent)) > after, timeout=10)
    return emu.events.of_type(ReadmissionEvent)[-1]


async def test_readmission_rejects_a_pod_whose_init_container_held_devices_of_a_plugin_gone(
    dp_dir: Path,
) -> None:
    async with Emulator(dp_dir, control_socket=False, readmit_after_s=0.05) as emu:
        p = RawPlugin(dp_dir, R, devs(3))
        await p.start()
        await emu.wait_for_resource(R, allocatable=3)
        await emu.apply_pod(pod_manifest("with-init", {R: 1}, init=[("setup", {R: 1})]))
        await emu.apply_pod(pod_manifest("plain", {R: 1}))
        await p.stop()  # gone while the kubelet restarts
        await emu.restart()
        event = await _readmitted(emu, 0)
        assert event.rejected == ("default/with-init",)
        assert event.kept == 1
        assert [x.name for x in emu.pods()] == ["plain"]  # its container runs: kept
        [refusal] = [
            e for e in emu.events.of_type(AdmissionEvent) if e.reason == "UnexpectedAdmissionError"
        ]
        assert refusal.pod == "with-init"
        assert refusal.message == (
            "Allocate failed due to no healthy devices present; cannot allocate unhealthy "
            f"devices {R}, which is unexpected"
        )
        # its devices are free again: only the plain pod's one is allocated
        assert emu.node().resources[R].allocated == 1


async def test_readmission_keeps_every_pod_when_the_plugin_is_back_in_time(dp_dir: Path) -> None:
    async with Emulator(dp_dir, control_socket=False, readmit_after_s=None) as emu:
        p = RawPlugin(dp_dir, R, devs(3))
        await p.start()
        await emu.wait_for_resource(R, allocatable=3)
        await emu.apply_pod(pod_manifest("with-init", {R: 1}, init=[("setup", {R: 1})]))
        await p.stop()
        await emu.restart()
        p2 = RawPlugin(dp_dir, R, devs(3))
        await p2.start()
        await emu.wait_for_resource(R, allocatable=3)
        event = await emu.readmit()
        assert (event.kept, event.rejected) == (1, ())
        assert [x.name for x in emu.pods()] == ["with-init"]
        assert p2.calls.allocate == []  # nothing asked of the plugin
        # a device of the init container turned unhealthy: refused with the kubelet's text
        [held] = emu.pods()[0].container("setup").devices[R]
        p2.devices = [Dev(d.id, "Unhealthy" if d.id == held else "Healthy") for d in p2.devices]
        p2.push()
        await emu.wait_for_resource(R, allocatable=2)
        event = await emu.readmit()
        assert event.rejected == ("default/with-init",)
        [refusal] = [
            e for e in emu.events.of_type(AdmissionEvent) if e.reason == "UnexpectedAdmissionError"
        ]
        assert "previously allocated devices are no longer healthy" in (refusal.message or "")
        await p2.stop()

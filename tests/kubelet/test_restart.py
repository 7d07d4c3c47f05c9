"""Allocations across restarts, and corrupt checkpoints set aside."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kubelet_helpers import pod_manifest
from rawplugin import RawPlugin, devs

from kubedevice.errors import AdmissionError
from kubedevice.kubelet import Emulator
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

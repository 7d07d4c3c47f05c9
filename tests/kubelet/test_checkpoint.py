"""Checkpoint format and checksum (contract.md#checkpoint), incremental writer, corrupt files."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from asyncinotify import Inotify, Mask
from grpc import aio
from hypothesis import given, settings, strategies as st
from rawplugin import Dev, RawPlugin, devs

from kubedevice.errors import CheckpointError
from kubedevice.kubelet import Emulator, ListAndWatchEvent
from kubedevice.kubelet.checkpoint import (
    CheckpointData,
    CheckpointEntry,
    CheckpointWriter,
    checksum,
    dumps,
    loads,
    render_for_hash,
)
from kubedevice.kubelet.endpoint import PluginEndpoint
from kubedevice.kubelet.events import EventLog, Notifier
from kubedevice.kubelet.manager import DeviceManager
from kubedevice.kubelet.types import DeviceStatus, PluginOptions

VECTORS = [
    ('{"Data":{"PodDeviceEntries":null,"RegisteredDevices":{}},"Checksum":3467439661}', 3467439661),
    (
        '{"Data":{"PodDeviceEntries":null,"RegisteredDevices":null},"Checksum":1944006890}',
        1944006890,
    ),
    ('{"Data":{"PodDeviceEntries":[],"RegisteredDevices":{}},"Checksum":2932075448}', 2932075448),
    (
        '{"Data":{"PodDeviceEntries":null,"RegisteredDevices":{"example.com/foo":["dev1","dev2"]}},'
        '"Checksum":3566578302}',
        3566578302,
    ),
    (
        '{"Data":{"PodDeviceEntries":null,"RegisteredDevices":{"example.com/foo":null}},'
        '"Checksum":1667033492}',
        1667033492,
    ),
    (
        '{"Data":{"PodDeviceEntries":[{"PodUID":"u","ContainerName":"c","ResourceName":"r/x",'
        '"DeviceIDs":null,"AllocResp":null}],"RegisteredDevices":{}},"Checksum":4219650831}',
        4219650831,
    ),
    (
        '{"Data":{"PodDeviceEntries":[{"PodUID":"u","ContainerName":"c","ResourceName":"r/x",'
        '"DeviceIDs":{},"AllocResp":""}],"RegisteredDevices":{}},"Checksum":2062205611}',
        2062205611,
    ),
    (
        '{"Data":{"PodDeviceEntries":[{"PodUID":"11111111-2222-3333-4444-555555555555",'
        '"ContainerName":"c0","ResourceName":"example.com/foo","DeviceIDs":{"-1":["dev3"],'
        '"0":["dev1"]},"AllocResp":"CgYKAUESATE="}],"RegisteredDevices":{"example.com/bar":[],'
        '"example.com/foo":["dev1","dev2","dev3"]}},"Checksum":975997860}',
        975997860,
    ),
    (
        '{"Data":{"PodDeviceEntries":[{"PodUID":"p1","ContainerName":"a","ResourceName":"r/x",'
        '"DeviceIDs":{"10":["d10"],"2":["d2a","d2b"]},"AllocResp":""},{"PodUID":"p2",'
        '"ContainerName":"b","ResourceName":"r/x","DeviceIDs":{"0":[]},"AllocResp":"AA=="}],'
        '"RegisteredDevices":{"B/y":["q"],"a/z":["with space","br]ack"],"r/x":["d10","d2a",'
        '"d2b"]}},"Checksum":2339077719}',
        2339077719,
    ),
]


@pytest.mark.parametrize(("text", "expected"), VECTORS, ids=[f"vector{i + 1}" for i in range(9)])
def test_contract_vectors(text: str, expected: int) -> None:
    data = loads(text.encode())
    assert checksum(data) == expected
    assert dumps(data).decode() == text  # byte-identical round trip


def test_vector8_rendering() -> None:
    data = loads(VECTORS[7][0].encode())
    assert render_for_hash(data) == (
        "(checkpoint.checkpointData){PodDeviceEntries:([]checkpoint.PodDevicesEntry)"
        "[{PodUID:(string)11111111-2222-3333-4444-555555555555 ContainerName:(string)c0 "
        "ResourceName:(string)example.com/foo DeviceIDs:(checkpoint.DevicesPerNUMA)"
        "map[-1:[dev3] 0:[dev1]] AllocResp:([]uint8)[10 6 10 1 65 18 1 49]}] "
        "RegisteredDevices:(map[string][]string)map[example.com/bar:[] "
        "example.com/foo:[dev1 dev2 dev3]]}"
    )


@pytest.mark.parametrize(
    "raw",
    [
        b"\x00\xff garbage \x13",
        b"",
        b"[1, 2, 3]",
        b'{"Data":{"PodDeviceEntries":null,"RegisteredDevices":{}},"Checksum":1}',
        b'{"Data":{"PodDeviceEntries":{"a":1},"RegisteredDevices":{}},"Checksum":1}',
        b'{"Data":{"PodDeviceEntries":null,"RegisteredDevices":{"r/x":[1]}},"Checksum":1}',
        b'{"foo": "bar"}',
    ],
    ids=["garbage", "empty", "list", "bad-checksum", "entries-shape", "ids-shape", "foreign"],
)
def test_corrupt_raises(raw: bytes) -> None:
    with pytest.raises(CheckpointError):
        loads(raw)


def test_writer_writes_atomically(sock_dir: Path) -> None:
    w = CheckpointWriter(sock_dir / "kubelet_internal_checkpoint")
    w.set_registered({"example.com/foo": ["b", "a"]})
    w.write()
    data = loads(w.path.read_bytes())
    assert data.entries is None
    assert data.registered == {"example.com/foo": ["a", "b"]}
    assert sorted(p.name for p in sock_dir.iterdir()) == ["kubelet_internal_checkpoint"]


_ids = st.lists(st.text("abc123-", min_size=1, max_size=4), max_size=3)
_entry = st.builds(
    CheckpointEntry,
    st.sampled_from(["p1", "p2", "p3"]),
    st.sampled_from(["c", "d"]),
    st.sampled_from(["r/x", "a/y"]),
    st.dictionaries(st.integers(-1, 11), _ids, max_size=3),
    st.binary(max_size=8),
)


@settings(max_examples=60, deadline=None)
@given(
    ops=st.lists(st.one_of(_entry, st.sampled_from(["p1", "p2", "p3"])), max_size=12),
    reg=st.dictionaries(st.sampled_from(["r/x", "a/y", "B/z"]), _ids, max_size=3),
)
def test_incremental_writer_matches_full_checksum(
    ops: list[CheckpointEntry | str], reg: dict[str, list[str]]
) -> None:
    w = CheckpointWriter(Path("/nonexistent/cp"))
    model: dict[tuple[str, str, str], CheckpointEntry] = {}
    for op in ops:
        if isinstance(op, str):
            w.remove_pod(op)
            model = {k: v for k, v in model.items() if k[0] != op}
        else:
            w.set_entry(op)
            model[(op.pod_uid, op.container, op.resource)] = op
        w.set_registered(reg)
        content = w.content()
        data = loads(content)  # verifies the checksum
        expected = CheckpointData(
            tuple(model.values()) or None, {k: sorted(v) for k, v in reg.items()}
        )
        assert checksum(data) == checksum(expected)
        assert json.loads(content)["Checksum"] == checksum(expected)


def test_all_low_bytes_table_matches_scalar_fnv() -> None:
    from kubedevice.kubelet.checkpoint import _fnv, _fnv_all_low_bytes

    data = bytes(range(256)) * 3 + b"example.com/foo:[d0 d1]"
    table = _fnv_all_low_bytes(data)
    assert [table[x] for x in (0, 1, 77, 255)] == [_fnv(x, data) for x in (0, 1, 77, 255)]


def test_many_allocations_keep_valid_checksums(sock_dir: Path) -> None:
    w = CheckpointWriter(sock_dir / "cp")
    w.set_registered({"example.com/foo": [f"dev-{i}" for i in range(64)]})
    for i in range(40):  # enough writes to switch to the whole-table path
        w.set_entry(CheckpointEntry(f"pod-{i}", "c", "example.com/foo", {-1: [f"dev-{i}"]}, b"\n"))
        w.write()
        data = loads(w.path.read_bytes())
        assert data.entries is not None
        assert len(data.entries) == i + 1


async def test_flapping_plugin_checkpoint_writes_coalesced(dp_dir: Path) -> None:
    r = "example.com/flap"
    async with Emulator(dp_dir, control_socket=False, checkpoint_interval_s=0.5) as emu:
        p = RawPlugin(dp_dir, r, devs(4))
        await p.start()
        await emu.wait_for_resource(r, allocatable=4)
        with Inotify() as ino:
            ino.add_watch(dp_dir, Mask.MOVED_TO)
            seen = len(emu.events.of_type(ListAndWatchEvent))
            for i in range(11):  # d0 flaps 11 times, as fast as the plugin can send
                p.devices[0] = Dev("d0", "Unhealthy" if i % 2 == 0 else "Healthy")
                p.push()
            await emu.wait_until(
                lambda: len(emu.events.of_type(ListAndWatchEvent)) == seen + 11, 10
            )
            writes = 0
            while True:  # the coalesced write comes at the end of the interval
                event = await asyncio.wait_for(ino.get(), 5)
                if event.name is not None and event.name.name == "kubelet_internal_checkpoint":
                    writes += 1
                    data = loads((dp_dir / "kubelet_internal_checkpoint").read_bytes())
                    assert data.registered is not None
                    if list(data.registered[r] or ()) == ["d1", "d2", "d3"]:
                        break
            assert writes <= 2  # not one per message
        await p.stop()


async def test_coalesced_resource_does_not_delay_another(dp_dir: Path) -> None:
    a, b = "example.com/flap", "example.com/new"
    async with Emulator(dp_dir, control_socket=False, checkpoint_interval_s=60) as emu:
        pa = RawPlugin(dp_dir, a, devs(2))
        await pa.start()
        await emu.wait_for_resource(a, allocatable=2)
        pa.devices[0] = Dev("d0", "Unhealthy")
        pa.push()  # within the interval of a's first write: deferred by a minute
        await emu.wait_for_resource(a, allocatable=1)
        with Inotify() as ino:
            ino.add_watch(dp_dir, Mask.MOVED_TO)
            pb = RawPlugin(dp_dir, b, devs(1), name="b.sock")
            await pb.start()
            while True:  # b's first message is written at once, with a's pending change
                event = await asyncio.wait_for(ino.get(), 5)
                if event.name is not None and event.name.name == "kubelet_internal_checkpoint":
                    data = loads((dp_dir / "kubelet_internal_checkpoint").read_bytes())
                    assert data.registered is not None
                    if b in data.registered:
                        break
            assert list(data.registered[a] or ()) == ["d1"]
        await pb.stop()
        await pa.stop()


class _CountingWriter(CheckpointWriter):
    """The real writer, counting its writes."""

    writes = 0

    def write(self) -> None:
        self.writes += 1
        super().write()


async def test_burst_of_first_messages_is_one_checkpoint_write(dp_dir: Path) -> None:
    """The first messages of many plugins (a restart of a busy node) share one checkpoint
    write; one who looks (flush_checkpoint) gets what is pending written at once."""
    notifier = Notifier()
    events = EventLog(notifier)
    writer = _CountingWriter(dp_dir / "kubelet_internal_checkpoint")
    m = DeviceManager(dp_dir, writer, events, notifier, grace_period_s=60, per_socket_clients=False)
    names = [f"example.com/r{i}" for i in range(60)]
    eps = [  # channels to a socket nobody serves: never connected, never used
        PluginEndpoint(
            n,
            dp_dir / f"r{i}.sock",
            aio.insecure_channel(f"unix://{dp_dir}/nobody.sock"),
            PluginOptions(),
            events,
        )
        for i, n in enumerate(names)
    ]
    dev = (DeviceStatus(id="d0", health="Healthy", numa=()),)

    def on_disk() -> list[str]:
        return sorted(loads((dp_dir / "kubelet_internal_checkpoint").read_bytes()).registered or {})

    for ep in eps[:50]:
        m._on_message(ep, dev)
    assert writer.writes == 0  # not one per message
    await notifier.wait_until(lambda: writer.writes > 0, 5)
    assert writer.writes == 1
    assert on_disk() == sorted(names[:50])
    for ep in eps[50:]:
        m._on_message(ep, dev)
    m.flush_checkpoint()  # someone looks: written now
    assert writer.writes == 2
    assert on_disk() == sorted(names)
    m.flush_checkpoint()  # nothing pending any more
    assert writer.writes == 2
    for ep in eps:
        await ep.close()

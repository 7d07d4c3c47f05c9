"""Hand-damaged state, crashes mid-churn and plugins that misbehave mid-admission."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import stat
import sys
from pathlib import Path
from typing import Any

import pytest
from kubelet_helpers import PluginFactory, pod_manifest
from rawplugin import devs

from kubedevice.errors import AdmissionError
from kubedevice.kubelet import Emulator
from kubedevice.kubelet.control import state_dir

R = "example.com/foo"
B = "example.com/bar"


def _journal(dp_dir: Path) -> Path:
    return state_dir(dp_dir) / f"{dp_dir.name}.pods.jsonl"


async def test_checkpoint_checksum_with_thousands_of_digits(dp_dir: Path) -> None:
    cp = dp_dir / "kubelet_internal_checkpoint"
    cp.write_bytes(
        b'{"Data":{"PodDeviceEntries":null,"RegisteredDevices":{}},"Checksum":' + b"9" * 5000 + b"}"
    )
    async with Emulator(dp_dir, control_socket=False) as emu:
        assert len(emu.checkpoint_errors) == 1
        assert "Checksum" in emu.checkpoint_errors[0]
        assert [p.name for p in dp_dir.glob("kubelet_internal_checkpoint.corrupt-*")]


async def test_bad_journal_lines_are_skipped(
    dp_dir: Path, plugin: PluginFactory, caplog: pytest.LogCaptureFixture
) -> None:
    async with Emulator(dp_dir, dial_timeout_s=2.0) as emu:
        await plugin(R, devs(2))
        await emu.wait_for_resource(R, allocatable=2)
        await emu.apply_pod(pod_manifest("good", {R: 1}))
    journal = _journal(dp_dir)
    good = journal.read_bytes()
    journal.write_bytes(
        good
        + b'{"add": {"name": 5, "namespace": [], "uid": 1, "containers": "x"}}\n'
        + b'{"add": {"name": "n", "namespace": "default", "uid": "u", '
        + b'"containers": [["c", "app", {"r/x": "many"}]]}}\n'
        + b'{"del": {"no": "pe"}}\n'
        + b"\xff\xfe not utf-8 \x80\n"
        + b"[1, 2]\n"
    )
    caplog.set_level(logging.WARNING)
    async with Emulator(dp_dir, dial_timeout_s=2.0) as emu:
        assert [p.name for p in emu.pods()] == ["good"]
        assert emu.pods()[0].containers[0].devices == {R: ("d0",)}
    skipped = [r for r in caplog.records if "pod journal" in r.getMessage()]
    assert len(skipped) == 5, [r.getMessage() for r in skipped]
    assert stat.S_IMODE(journal.stat().st_mode) == 0o600


async def test_pod_journal_is_private(dp_dir: Path, plugin: PluginFactory) -> None:
    async with Emulator(dp_dir, dial_timeout_s=2.0) as emu:
        await plugin(R, devs(1))
        await emu.wait_for_resource(R, allocatable=1)
        old = os.umask(0o022)
        try:
            await emu.apply_pod(pod_manifest("p", {R: 1}))
        finally:
            os.umask(old)
        assert stat.S_IMODE(_journal(dp_dir).stat().st_mode) == 0o600


async def test_pod_restored_without_devices_warns(
    dp_dir: Path, plugin: PluginFactory, caplog: pytest.LogCaptureFixture
) -> None:
    async with Emulator(dp_dir, dial_timeout_s=2.0) as emu:
        await plugin(R, devs(2))
        await emu.wait_for_resource(R, allocatable=2)
        await emu.apply_pod(pod_manifest("p", {R: 1}))
    # the checkpoint lost its entries (e.g. moved aside as corrupt)
    (dp_dir / "kubelet_internal_checkpoint").write_bytes(b"garbage")
    caplog.set_level(logging.WARNING)
    async with Emulator(dp_dir, dial_timeout_s=2.0) as emu:
        assert [p.name for p in emu.pods()] == ["p"]
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("default/p" in m and "without its devices" in m and R in m for m in warned), warned


async def test_allocations_reconciled_at_start_after_crash(
    dp_dir: Path, plugin: PluginFactory
) -> None:
    async with Emulator(dp_dir, dial_timeout_s=2.0) as emu:
        await plugin(R, devs(4))
        await emu.wait_for_resource(R, allocatable=4)
        await emu.apply_pod(pod_manifest("a", {R: 1}))
        await emu.apply_pod(pod_manifest("b", {R: 2}))
    # kill -9 after the checkpoint got b's devices but before the journal got b
    journal = _journal(dp_dir)
    lines = journal.read_text().splitlines(keepends=True)
    journal.write_text("".join(x for x in lines if '"b"' not in x))
    async with Emulator(dp_dir, dial_timeout_s=2.0) as emu:
        assert [p.name for p in emu.pods()] == ["a"]
        assert emu.node().resources[R].allocated == 1


async def test_stream_end_during_allocate_rolls_back(
    emu: Emulator, plugin: PluginFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="kubedevice.kubelet")
    a = await plugin(B, devs(2))
    p = await plugin(R, devs(2))
    await emu.wait_for_resource(B, allocatable=2)
    await emu.wait_for_resource(R, allocatable=2)
    entered = asyncio.Event()
    release = asyncio.Event()
    p.allocate_gate = (entered, release)
    manifest = pod_manifest("p", {B: 1, R: 1})  # B is allocated first (sorted), then R hangs
    task = asyncio.create_task(emu.apply_pod(manifest))
    await asyncio.wait_for(entered.wait(), 5)
    p.end_streams()  # the plugin ends ListAndWatch while Allocate is in flight
    with pytest.raises(AdmissionError) as err:
        await asyncio.wait_for(task, 10)
    assert err.value.reason == "UnexpectedAdmissionError"
    assert "has been stopped" in err.value.message
    assert str(p.socket_path) in err.value.message
    assert emu.node().resources[B].allocated == 0
    assert emu.pods() == []
    assert f"pod default/p rejected: UnexpectedAdmissionError: {err.value.message}" in caplog.text
    release.set()
    assert a.calls.allocate == [[["d0"]]]


async def _line(reader: asyncio.StreamReader) -> dict[str, Any]:
    return json.loads(await asyncio.wait_for(reader.readline(), 15))  # type: ignore[no-any-return]


async def _cli_apply(
    dp_dir: Path, sock_dir: Path, manifest: dict[str, Any]
) -> asyncio.subprocess.Process:
    """Start ``kubedevice pod apply`` on ``manifest`` (stdout and stderr piped)."""
    f = sock_dir / "p.yaml"
    f.write_text(json.dumps(manifest))
    return await asyncio.create_subprocess_exec(
        str(Path(sys.executable).parent / "kubedevice"),
        "pod",
        "apply",
        "-f",
        str(f),
        env={**os.environ, "DP_DEVICE_PLUGIN_DIR": str(dp_dir)},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


async def test_hung_allocate_reported_and_abandoned_requests_dropped(
    dp_dir: Path, sock_dir: Path, plugin: PluginFactory, caplog: pytest.LogCaptureFixture
) -> None:
    async with Emulator(dp_dir, dial_timeout_s=2.0) as emu:
        assert emu.control_socket is not None
        p = await plugin(R, devs(3))
        await emu.wait_for_resource(R, allocatable=3)
        await emu.apply_pod(pod_manifest("q", {R: 1}))
        entered, release = asyncio.Event(), asyncio.Event()
        p.allocate_gate = (entered, release)
        # the CLI: it reports the pending Allocate and its socket instead of timing out
        cli = await _cli_apply(dp_dir, sock_dir, pod_manifest("p", {R: 1}))
        assert cli.stderr is not None
        await asyncio.wait_for(entered.wait(), 15)
        waiting = (await asyncio.wait_for(cli.stderr.readline(), 15)).decode()
        assert "Allocate" in waiting, waiting
        assert str(p.socket_path) in waiting, waiting
        # a delete queued behind it whose client gives up must never run
        reader, writer = await asyncio.open_unix_connection(str(emu.control_socket))
        writer.write(json.dumps({"op": "delete", "name": "q"}).encode() + b"\n")
        await writer.drain()
        progress = await _line(reader)  # it waits: told so, then its client hangs up
        assert "Allocate" in progress["progress"]
        writer.close()
        await writer.wait_closed()
        caplog.set_level(logging.WARNING)
        release.set()
        out, _ = await asyncio.wait_for(cli.communicate(), 30)
        assert cli.returncode == 0
        assert b"pod/p admitted" in out
        await emu.wait_until(lambda: "client gave up" in caplog.text, 10)
        assert sorted(x.name for x in emu.pods()) == ["p", "q"]


async def test_cli_stream_end_during_allocate_exits_3(
    dp_dir: Path, sock_dir: Path, plugin: PluginFactory
) -> None:
    async with Emulator(dp_dir, dial_timeout_s=2.0) as emu:
        a = await plugin(B, devs(1))
        p = await plugin(R, devs(1))
        await emu.wait_for_resource(B, allocatable=1)
        await emu.wait_for_resource(R, allocatable=1)
        entered, release = asyncio.Event(), asyncio.Event()
        p.allocate_gate = (entered, release)
        cli = await _cli_apply(dp_dir, sock_dir, pod_manifest("p", {B: 1, R: 1}))
        await asyncio.wait_for(entered.wait(), 15)
        p.end_streams()  # the SDK's own shutdown does this with an Allocate in flight
        _, err = await asyncio.wait_for(cli.communicate(), 30)
        release.set()
        assert cli.returncode == 3, err
        assert b"UnexpectedAdmissionError" in err
        assert f"endpoint {p.socket_path} has been stopped".encode() in err
        assert emu.node().resources[B].allocated == 0
        assert a.calls.allocate == [[["d0"]]]

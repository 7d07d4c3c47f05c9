"""The control socket and the emulator's lifecycle: robustness, modes, clean shutdown."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

import pytest
from kubelet_helpers import PluginFactory, pod_manifest
from rawplugin import devs

from kubedevice.kubelet import Emulator
from kubedevice.kubelet.control import call

R = "example.com/foo"


@pytest.fixture
async def cemu(dp_dir: Path) -> Any:
    """A running emulator WITH its control socket."""
    async with Emulator(dp_dir, dial_timeout_s=1.0) as e:
        yield e


async def _exchange(path: Path, *lines: bytes) -> list[dict[str, Any]]:
    """Send raw lines on one connection; one parsed reply per line."""
    reader, writer = await asyncio.open_unix_connection(str(path), limit=1 << 24)
    try:
        out = []
        for line in lines:
            writer.write(line)
            await writer.drain()
            out.append(json.loads(await reader.readline()))
        return out
    finally:
        writer.close()
        await writer.wait_closed()


async def test_bad_requests_answered_and_connection_kept(cemu: Emulator) -> None:
    assert cemu.control_socket is not None
    replies = await _exchange(
        cemu.control_socket,
        b"{not json\n",
        b"[1, 2]\n",
        b'{"op": "nope"}\n',
        b'{"op": "apply", "manifest": 3}\n',
        b'{"op": "ping"}\n',
    )
    assert [r["ok"] for r in replies] == [False, False, False, False, True]
    assert replies[1]["error"]["message"] == "request must be a JSON object"
    assert replies[2]["error"]["message"] == "unknown control op 'nope'"
    assert replies[3]["error"]["type"] == "ManifestError"
    assert replies[4]["result"] == {"pid": os.getpid()}


async def test_large_manifest_over_control_socket(cemu: Emulator, plugin: PluginFactory) -> None:
    # asyncio's default line limit is 64 KiB; a pod with big annotations is larger
    await plugin(R, devs(1))
    await cemu.wait_for_resource(R, allocatable=1)
    m = pod_manifest("big", {R: 1})
    m["metadata"]["annotations"] = {"note": "x" * 200_000}
    assert cemu.control_socket is not None
    reply = await asyncio.to_thread(call, cemu.control_socket, {"op": "apply", "manifest": m})
    assert reply["ok"], reply
    assert reply["result"]["containers"][0]["devices"] == {R: ["d0"]}


async def test_client_gone_mid_request(cemu: Emulator, plugin: PluginFactory) -> None:
    await plugin(R, devs(1))
    await cemu.wait_for_resource(R, allocatable=1)
    assert cemu.control_socket is not None
    _, writer = await asyncio.open_unix_connection(str(cemu.control_socket))
    req = {"op": "apply", "manifest": pod_manifest("p", {R: 1})}
    writer.write(json.dumps(req).encode() + b"\n")
    await writer.drain()
    writer.close()  # hang up before the answer
    await writer.wait_closed()
    await cemu.wait_until(lambda: [p.name for p in cemu.pods()] == ["p"], 5)
    replies = await _exchange(cemu.control_socket, b'{"op": "list"}\n')
    assert [p["name"] for p in replies[0]["result"]] == ["p"]


async def test_control_socket_private_and_second_emulator_refused(
    cemu: Emulator, dp_dir: Path, plugin: PluginFactory
) -> None:
    assert cemu.control_socket is not None
    assert cemu.control_socket.parent != dp_dir  # never in the device-plugin dir
    assert stat.S_IMODE(os.stat(cemu.control_socket).st_mode) == 0o600
    second = Emulator(dp_dir)
    with pytest.raises(OSError, match="another emulator is serving"):
        await second.start()
    # the running emulator's sockets were not touched: a plugin still registers
    assert cemu.kubelet_socket.is_socket()
    await plugin(R, devs(2))
    await cemu.wait_for_resource(R, allocatable=2)


async def test_stop_leaves_no_tasks_and_no_sockets(dp_dir: Path, raw_plugin_path: Path) -> None:
    before = asyncio.all_tasks()
    emu = Emulator(dp_dir, dial_timeout_s=1.0)
    await emu.start()
    # the plugin runs in another process so that its own server tasks are not counted
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(raw_plugin_path),
        "--dir",
        str(dp_dir),
        "--count",
        "2",
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "GRPC_VERBOSITY": "ERROR"},
    )
    try:
        assert proc.stdout is not None
        assert (await proc.stdout.readline()).strip() == b"READY"
        await emu.wait_for_resource(R, allocatable=2)
        assert emu.control_socket is not None
        # an idle client connection stays open across the stop
        reader, writer = await asyncio.open_unix_connection(str(emu.control_socket))
        writer.write(b'{"op": "ping"}\n')
        await writer.drain()
        assert json.loads(await reader.readline())["ok"]
        sockets = [emu.kubelet_socket, emu.pod_resources_socket, emu.control_socket]
        assert all(s.is_socket() for s in sockets)
        await emu.stop()
        assert [s for s in sockets if s.exists()] == []
        assert (dp_dir / "example.com_foo.sock").is_socket()  # the plugin's, not ours
        assert asyncio.all_tasks() - before == set()
        assert await reader.read() == b""  # the emulator hung up
        writer.close()
        await writer.wait_closed()
    finally:
        proc.terminate()
        await proc.wait()

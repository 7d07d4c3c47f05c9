"""A node to inspect: the emulator, raw and SDK plugins, a hanging and a dead socket, pods."""

from __future__ import annotations

import asyncio
import socket
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kubelet"))

from rawplugin import Dev, RawPlugin, devs

from kubedevice.kubelet import Emulator
from node_inspect.helpers import BAR, COUNTER, FOO, ROOT, Node, pod


@pytest.fixture
def hanging(dp_dir: Path) -> Iterator[Path]:
    """A socket that accepts connections (kernel backlog) but never answers."""
    path = dp_dir / "hang.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    s.listen(64)
    try:
        yield path
    finally:
        s.close()


@pytest.fixture
def dead(dp_dir: Path) -> Path:
    """A stale socket file: bound once, its process gone (nothing listens)."""
    path = dp_dir / "dead.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    s.close()
    return path


@pytest.fixture
async def node(emu: Emulator, dp_dir: Path) -> AsyncIterator[Node]:
    """Two raw plugins (one with an Unhealthy device) and the SDK example; two pods."""
    foo = RawPlugin(
        dp_dir,
        FOO,
        [
            Dev("foo-0", numa=(0,)),
            Dev("foo-1", numa=(0,)),
            Dev("foo-2", numa=(1,)),
            Dev("foo-3", "Unhealthy", (1,)),
        ],
        preferred_available=True,
    )
    bar = RawPlugin(dp_dir, BAR, devs(3, prefix="bar-"), pre_start_required=True)
    sdk = await asyncio.create_subprocess_exec(
        sys.executable,
        str(ROOT / "examples" / "minimal.py"),
        "--device-plugin-dir",
        str(dp_dir),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        for p in (foo, bar):
            await p.start()
        await emu.wait_for_resource(FOO, allocatable=3)
        await emu.wait_for_resource(BAR, allocatable=3)
        await emu.wait_for_resource(COUNTER, allocatable=4, timeout=20)
        await emu.apply_pod(pod("train", FOO, 2))
        await emu.apply_pod(pod("serve", BAR, 1, container="app"))
        yield Node(emu, dp_dir, emu.pod_resources_socket, foo, bar)
    finally:
        sdk.terminate()
        await sdk.wait()
        for p in (foo, bar):
            await p.stop()

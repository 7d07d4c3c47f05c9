"""Shared fixtures: short socket dirs (AF_UNIX paths are capped near 107 bytes), an emulator."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from kubedevice.kubelet import Emulator


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    """A fresh, short directory under /tmp for Unix sockets; removed after the test."""
    path = Path(tempfile.mkdtemp(prefix="kd-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def dp_dir(sock_dir: Path) -> Path:
    """The device-plugin dir: a sub-directory, so sibling sockets stay inside ``sock_dir``."""
    d = sock_dir / "dp"
    d.mkdir()
    return d


@pytest.fixture
async def emu(dp_dir: Path) -> AsyncIterator[Emulator]:
    """A running kubelet emulator on ``dp_dir`` (no control socket; 2 s dial deadline)."""
    async with Emulator(dp_dir, control_socket=False, dial_timeout_s=2.0) as e:
        yield e

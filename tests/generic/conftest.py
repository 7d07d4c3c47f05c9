"""Fixtures for the generic plugin's tests: a fake host tree and a kubelet double."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from generic.gen_kubelet import KubeletDouble
from kubedevice.generic import FakeHost


@pytest.fixture
def host() -> Iterator[FakeHost]:
    """An empty fake host (``root/dev``, ``root/sys``)."""
    root = Path(tempfile.mkdtemp(prefix="kdg-", dir="/tmp"))
    try:
        yield FakeHost(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
async def kubelet(sock_dir: Path) -> AsyncIterator[KubeletDouble]:
    """A kubelet double serving ``kubelet.sock`` in ``sock_dir``."""
    async with KubeletDouble(sock_dir) as double:
        yield double

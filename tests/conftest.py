"""Fixtures shared by every test: short socket dirs (AF_UNIX paths are capped near 107 bytes)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    """A fresh, short directory under /tmp for Unix sockets; removed after the test."""
    path = Path(tempfile.mkdtemp(prefix="kd-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)

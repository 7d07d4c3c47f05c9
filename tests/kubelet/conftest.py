"""Fixtures for the emulator tests: an emulator in a short temp dir and raw test plugins."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from kubelet_helpers import PluginFactory
from rawplugin import RawPlugin


@pytest.fixture
async def plugin(dp_dir: Path) -> AsyncIterator[PluginFactory]:
    """Factory: ``await plugin(resource, devices, **kw)`` serves and registers a RawPlugin."""
    made: list[RawPlugin] = []

    async def make(*args: Any, register: bool = True, **kw: Any) -> RawPlugin:
        p = RawPlugin(dp_dir, *args, **kw)
        made.append(p)
        await p.serve()
        if register:
            await p.register()
        return p

    try:
        yield make
    finally:
        for p in made:
            await p.stop()


@pytest.fixture
def raw_plugin_path() -> Path:
    """Path of the rawplugin script (for subprocesses)."""
    return Path(__file__).parent / "rawplugin.py"

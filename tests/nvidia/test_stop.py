"""Stopping the GPU plugin never waits for the NVML event wait (real NVML cannot be woken).

The stand-in pynvml's ``nvmlEventSetWait`` blocks like the real one: nothing but an event
(or its timeout) ends it, ``interrupt()`` only takes effect when it returns.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from kubedevice.kubelet import Emulator
from kubedevice.nvidia.config import parse_config
from kubedevice.nvidia.nvml_real import RealNvml
from kubedevice.nvidia.runner import GpuPlugins

from .stand_in_pynvml import GpuSpec, make_module

GPU = "nvidia.com/gpu"
U0 = "GPU-00000000-1111-2222-3333-444444444444"


def _nvml(monkeypatch: pytest.MonkeyPatch) -> tuple[Any, threading.Event]:
    mod = make_module([GpuSpec(uuid=U0, bus="00000000:18:00.0", minor=0)])
    in_wait = threading.Event()
    wait = mod.nvmlEventSetWait

    def blocking_wait(s: Any, timeout_ms: int) -> Any:
        in_wait.set()
        return wait(s, timeout_ms)

    mod.nvmlEventSetWait = blocking_wait
    monkeypatch.setitem(sys.modules, "pynvml", mod)
    return mod, in_wait


async def test_stop_leaves_the_event_thread_in_its_nvml_wait(
    emu: Emulator, dp_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mod, in_wait = _nvml(monkeypatch)
    # one wait slice of ten minutes: stopping must not wait for it to end
    backend = RealNvml(proc_root=tmp_path / "proc", interrupt_slice_ms=600_000)
    overrides = {
        "dev_root": str(tmp_path / "dev"),
        "sys_root": str(tmp_path / "sys"),
        "features_dir": "",
        "pod_resources_socket": str(tmp_path / "none.sock"),
    }
    plugins = GpuPlugins(
        parse_config({"version": "v1"}),
        backend,
        device_plugin_dir=dp_dir,
        overrides=overrides,
        wait_timeout_ms=600_000,
    )
    async with plugins:
        await emu.wait_for_resource(GPU, allocatable=1, timeout=5)
        assert await asyncio.to_thread(in_wait.wait, 10)
    # stopped, while the event thread is still blocked in nvmlEventSetWait ...
    (thread,) = [t for t in threading.enumerate() if t.name == "nvml-events"]
    assert thread.is_alive()
    assert mod.state["init"] is True  # ... so NVML was not shut down under it
    assert mod.state["freed"] == 0
    mod.events.put("TIMEOUT")  # the wait ends: the thread sees the stop and leaves
    await asyncio.to_thread(thread.join, 10)
    assert not thread.is_alive()

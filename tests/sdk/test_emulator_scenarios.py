"""The SDK against the kubelet emulator where the double is too kind: kubernetes#121994.

Released kubelets (1.25-1.36) key plugin clients by resource name: when an old stream of a
resource ends, the newest registration of that name is disconnected. A rolling update (a
second instance taking over the socket name) and a re-added plugin must still converge to
a connected resource with every device allocatable.
"""

from __future__ import annotations

from typing import Any

from sdk_helpers import StaticPlugin

import kubedevice
from kubedevice.kubelet import Emulator, RegistrationEvent, StreamEndEvent

RES = "example.com/dev"
OPTS: dict[str, Any] = {"stream_grace": 0.2, "backoff_initial": 0.01, "backoff_max": 0.2}


def devs(n: int) -> list[kubedevice.Device]:
    return [kubedevice.Device(id=f"d{i}") for i in range(n)]


async def _converges(emu: Emulator, since: float, allocatable: int) -> None:
    """Wait for a stream end after ``since`` (the race point), then for the steady state."""

    def ended() -> bool:
        return any(e.resource == RES for e in emu.events.of_type(StreamEndEvent, since))

    await emu.wait_until(ended, 10)
    status = await emu.wait_for_resource(RES, allocatable=allocatable, timeout=10)
    assert status.connected
    assert status.capacity == allocatable


async def test_rolling_update_converges(emu: Emulator) -> None:
    async with kubedevice.PluginServer(emu.device_plugin_dir, **OPTS) as old:
        await old.add(StaticPlugin(devs(2)))
        await emu.wait_for_resource(RES, allocatable=2, timeout=10)
        first = emu.events.of_type(RegistrationEvent)[-1].t
        async with kubedevice.PluginServer(emu.device_plugin_dir, **OPTS) as new:
            await new.add(StaticPlugin(devs(3)))  # takes the socket name over
            await new.wait_registered(RES, timeout=10)
            await _converges(emu, first, allocatable=3)
            await old.remove(RES)  # the old pod terminates
            assert new.registered(RES).is_set()
            status = await emu.wait_for_resource(RES, allocatable=3, timeout=10)
            assert status.connected


async def test_remove_and_readd_converges(emu: Emulator) -> None:
    async with kubedevice.PluginServer(emu.device_plugin_dir, **OPTS) as server:
        plugin = StaticPlugin(devs(2))
        await server.add(plugin)
        await emu.wait_for_resource(RES, allocatable=2, timeout=10)
        first = emu.events.of_type(RegistrationEvent)[-1].t
        await server.remove(RES)  # hot reload: the old stream ends...
        await server.add(StaticPlugin(devs(4)))  # ...while the new one registers
        await _converges(emu, first, allocatable=4)


async def test_kubelet_restart_converges(emu: Emulator) -> None:
    async with kubedevice.PluginServer(emu.device_plugin_dir, **OPTS) as server:
        await server.add(StaticPlugin(devs(2)))
        await emu.wait_for_resource(RES, allocatable=2, timeout=10)
        first = emu.events.of_type(RegistrationEvent)[-1].t
        await emu.restart()
        await _converges(emu, first, allocatable=2)
        await server.wait_registered(RES, count=2, timeout=10)

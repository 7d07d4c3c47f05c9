"""``inspect`` must not change what a plugin tells the kubelet.

Plugins on the upstream Go stub (``pkg/kubelet/cm/devicemanager/plugin/v1beta1``), NVIDIA's
among them, serve every ListAndWatch stream from ONE shared update channel, and a stream's
handler never returns when its client leaves. A stream opened by ``inspect`` would leave such
a reader behind, taking turns with the kubelet's on the channel: every other health update
would never reach the kubelet. The stand-in plugin here does exactly what the stub does.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from rawplugin import Dev, RawPlugin

from kubedevice._api import dp
from kubedevice.kubelet import Emulator
from node_inspect.helpers import FOO, inspect_json

N = 8


class SharedChannelPlugin(RawPlugin):
    """Every ListAndWatch stream is fed from one shared queue by a reader that outlives it."""

    def __init__(self, dp_dir: Path) -> None:
        super().__init__(dp_dir, FOO, [Dev(f"d{i}") for i in range(N)])
        self.channel: asyncio.Queue[dp.ListAndWatchResponse] = asyncio.Queue()
        self._readers: set[asyncio.Task[None]] = set()

    async def ListAndWatch(self, request: dp.Empty, context: Any) -> AsyncIterator[Any]:
        self.calls.list_and_watch += 1
        out: asyncio.Queue[dp.ListAndWatchResponse] = asyncio.Queue()
        out.put_nowait(self._snapshot())

        async def reader() -> None:  # the stub's loop: Send errors ignored, never returns
            while True:
                out.put_nowait(await self.channel.get())

        task = asyncio.create_task(reader())
        self._readers.add(task)
        while True:
            yield await out.get()

    def update(self, unhealthy: int) -> None:
        """Devices ``d0`` .. ``d<unhealthy-1>`` Unhealthy, sent on the shared channel."""
        self.devices = [Dev(f"d{i}", "Unhealthy" if i < unhealthy else "Healthy") for i in range(N)]
        self.channel.put_nowait(self._snapshot())

    async def stop(self) -> None:
        for t in self._readers:
            t.cancel()
        await asyncio.gather(*self._readers, return_exceptions=True)
        await super().stop()


async def test_the_kubelet_sees_every_update_after_inspect(emu: Emulator, dp_dir: Path) -> None:
    plugin = SharedChannelPlugin(dp_dir)
    await plugin.start()
    try:
        await emu.wait_for_resource(FOO, allocatable=N)
        rc, doc, err = await inspect_json(dp_dir)
        assert (rc, doc["findings"], err) == (0, [], "")
        assert [(p["resource"], p["state"]) for p in doc["plugins"]] == [(FOO, "ok")]
        assert plugin.calls.list_and_watch == 1  # the kubelet's stream, nobody else's
        for i in range(1, N + 1):
            plugin.update(unhealthy=i)
            # with a second reader on the channel, update 2 would go to it and never arrive
            await emu.wait_for_resource(FOO, allocatable=N - i, timeout=5)
    finally:
        await plugin.stop()

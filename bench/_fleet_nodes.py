"""Many simulated nodes of one DRA driver in this process: ``bench_fleet.py``'s worker.

Each node gets what a driver's ``DriverServer`` runs for it: its own
:class:`~kubedevice.dra.api.kube.KubeClient` and
:class:`~kubedevice.dra.api.slices.SlicePublisher`, publishing the devices the driver
itself builds (the GPU DRA driver on fake NVML ``dgx-8gpu``, or ``dgx-8gpu-mig`` with MIG on
demand, every profile or only 1g.10gb and 3g.40gb; the ``/dev`` driver on a fake tree of 1,000
nodes) and watching its slices as on a
real node. Nothing of the publishing or watching is copied here: the same classes run.

Usage: ``python bench/_fleet_nodes.py KUBECONFIG LAYOUT PREFIX FIRST COUNT``. One JSON line
per answer on stdout: ``published`` once every node's slices are written, then, for each line
on stdin: ``upgrade`` (each node's publisher and client replaced by a new instance that adopts
the slices, a tenth of the nodes at a time: ``upgraded``), ``stop`` (exit).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _common import write_generic_config

from kubedevice.dra.api.kube import KubeClient
from kubedevice.dra.api.slices import SlicePublisher
from kubedevice.dra.model.types import CounterSet, Device

#: The fake /dev layout: this many device nodes in one node.
DEV_DEVICES = 1000


async def layout_devices(
    layout: str, root: Path
) -> tuple[str, Sequence[Device], Sequence[CounterSet]]:
    """The driver name, devices and counter sets the layout's driver builds (its first
    device list, as ``DriverServer`` takes it)."""
    if layout in ("gpu", "mig", "mig-few"):
        from kubedevice.nvidia.config import Config
        from kubedevice.nvidia.dra import GpuDraDriver
        from kubedevice.nvidia.fake import FakeNvml, write_fake_dev, write_fake_sysfs

        machine = "dgx-8gpu" if layout == "gpu" else "dgx-8gpu-mig"
        nvml = FakeNvml.from_file(machine, state_file=root / "state.json")
        write_fake_dev(nvml, root / "dev")
        write_fake_sysfs(nvml, root / "sys")
        config = Config(version="v1").with_overrides(
            dev_root=str(root / "dev"), sys_root=str(root / "sys")
        )
        if layout != "gpu":
            few = ["1g.10gb", "3g.40gb"] if layout == "mig-few" else []
            dra = dataclasses.replace(config.dra, mig_on_demand=True, mig_on_demand_profiles=few)
            config = dataclasses.replace(config, dra=dra)
        driver: Any = GpuDraDriver(config, nvml)
    elif layout == "dev":
        from kubedevice.generic import load_config
        from kubedevice.generic.dra import GenericDraDriver

        cfg = write_generic_config(root, "fleet", (f"d{i}" for i in range(DEV_DEVICES)))
        driver = GenericDraDriver(load_config(cfg))
    else:
        raise SystemExit(f"layout {layout!r}: use gpu, mig, mig-few or dev")
    snapshots = driver.devices()
    devices = tuple(await anext(snapshots))
    sets = tuple(driver.counter_sets())
    await snapshots.aclose()
    return str(driver.driver_name), devices, sets


class Node:
    """One simulated node: a client and a publisher, as a driver instance has."""

    def __init__(self, kubeconfig: Path, driver: str, name: str) -> None:
        self.kubeconfig, self.driver, self.name = kubeconfig, driver, name
        self.kube: KubeClient | None = None
        self.publisher: SlicePublisher | None = None
        self.task: asyncio.Task[None] | None = None

    async def start(self, devices: Sequence[Device], sets: Sequence[CounterSet]) -> int:
        """A new instance: publish (adopting what is there); the writes it made."""
        self.kube = KubeClient.connect(self.kubeconfig)
        self.publisher = SlicePublisher(self.kube, self.driver, self.name)
        self.task = asyncio.create_task(self.publisher.run())
        self.publisher.update(devices, sets)
        await self.publisher.wait_published()
        return self.publisher.writes

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
        if self.kube is not None:
            self.kube.close()


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def say(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


async def main(kubeconfig: Path, layout: str, prefix: str, first: int, count: int) -> None:
    root = Path(tempfile.mkdtemp(prefix="kd-fleet-node-", dir="/tmp"))
    try:
        base = rss_mb()
        driver, devices, sets = await layout_devices(layout, root)
        nodes = [Node(kubeconfig, driver, f"{prefix}{i:04d}") for i in range(first, first + count)]
        t0 = time.monotonic()
        writes = await asyncio.gather(*(n.start(devices, sets) for n in nodes))
        say(
            "published",
            s=time.monotonic() - t0,
            writes=sum(writes),
            devices=len(devices),
            counter_sets=len(sets),
            rss_mb_before=base,
            rss_mb=rss_mb(),
            threads=threading.active_count(),
        )
        loop = asyncio.get_running_loop()
        while line := (await loop.run_in_executor(None, sys.stdin.readline)).strip():
            if line == "upgrade":
                t0 = time.monotonic()
                step = max(1, len(nodes) // 10)
                total = 0
                for i in range(0, len(nodes), step):
                    batch = nodes[i : i + step]
                    await asyncio.gather(*(n.stop() for n in batch))
                    total += sum(await asyncio.gather(*(n.start(devices, sets) for n in batch)))
                say("upgraded", s=time.monotonic() - t0, writes=total, rss_mb=rss_mb())
            elif line == "stop":
                break
        await asyncio.gather(*(n.stop() for n in nodes))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    kc, lay, pre, fst, cnt = sys.argv[1:6]
    asyncio.run(main(Path(kc), lay, pre, int(fst), int(cnt)))

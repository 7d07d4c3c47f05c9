"""A test driver: devices fed through a queue, hooks that record their calls."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from asyncinotify import Inotify, Mask

import kubedevice.dra as dra
from kubedevice.dra.node.server import DriverServer

DRIVER = "gpu.test.kubedevice.io"


def gpus(count: int, *, unhealthy: Sequence[int] = (), shared: bool = False) -> list[dra.Device]:
    """Fake GPUs; ``shared``: each allows multiple allocations (memory 1Gi steps)."""
    policy = dra.RequestPolicy(default="80Gi", min="1Gi", step="1Gi")
    return [
        dra.Device(
            name=f"gpu-{i}",
            attributes={
                "index": i,
                "model": "Fake H100",
                "mig": False,
                "driverVersion": dra.Version("550.54.15"),
                "resource.kubernetes.io/pcieRoot": f"pci0000:{i:02x}",
            },
            capacity={"memory": "80Gi"},
            health=dra.Health.UNHEALTHY if i in unhealthy else dra.Health.HEALTHY,
            allow_multiple_allocations=shared,
            request_policies={"memory": policy} if shared else {},
            edits=dra.ContainerEdits(
                env={"FAKE_GPU": str(i)},
                device_nodes=[dra.DeviceNode(f"/dev/fakegpu{i}", host_path="/dev/null")],
            ),
        )
        for i in range(count)
    ]


class FakeDriver(dra.Driver):
    driver_name = DRIVER

    def __init__(self, devices: Sequence[dra.Device]) -> None:
        self.snapshots: asyncio.Queue[Sequence[dra.Device]] = asyncio.Queue()
        self.snapshots.put_nowait(devices)
        self.prepared: list[dra.Claim] = []
        self.unprepared: list[dra.PreparedClaim] = []
        self.fail: dict[str, Exception] = {}

    async def devices(self) -> AsyncIterator[Sequence[dra.Device]]:
        while True:
            yield await self.snapshots.get()

    async def prepare(self, claim: dra.Claim) -> Sequence[dra.PreparedDevice]:
        self.prepared.append(claim)
        if claim.ref.name in self.fail:
            raise self.fail[claim.ref.name]
        return await super().prepare(claim)

    async def unprepare(self, claim: dra.PreparedClaim) -> None:
        self.unprepared.append(claim)
        if claim.ref.name in self.fail:
            raise self.fail[claim.ref.name]


def server(
    driver: dra.Driver, kdir: Path, kubeconfig: Path, node: str, **options: object
) -> DriverServer:
    settings = dra.DriverOptions(
        node_name=node,
        kubelet_dir=kdir,
        cdi_dir=kdir / "cdi",
        kubeconfig=kubeconfig,
        **options,  # type: ignore[arg-type]
    ).resolved(driver)
    return DriverServer(driver, settings)


async def wait_for_path(path: Path, timeout: float = 10) -> None:
    """Wait (inotify on the parent) until ``path`` exists."""
    with Inotify() as inotify:
        inotify.add_watch(path.parent, Mask.CREATE | Mask.MOVED_TO)
        async with asyncio.timeout(timeout):
            while not path.exists():  # the watch is armed before each look: no race
                await inotify.get()

"""GPU plugin fixtures: a fake host (fake NVML machine + /dev and /sys trees) per test."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kubedevice.nvidia.fake import FakeNvml, write_fake_dev, write_fake_sysfs
from kubedevice.nvidia.fake.mps import PID_FILE


@dataclass
class GpuHost:
    """A fake GPU node: the NVML fake and the trees the plugin reads and writes."""

    nvml: FakeNvml
    root: Path

    @property
    def dev(self) -> Path:
        return self.root / "dev"

    @property
    def sys(self) -> Path:
        return self.root / "sys"

    @property
    def cdi(self) -> Path:
        return self.root / "cdi"

    @property
    def features(self) -> Path:
        return self.root / "features.d"

    def overrides(self) -> dict[str, Any]:
        return {
            "dev_root": str(self.dev),
            "sys_root": str(self.sys),
            "cdi_dir": str(self.cdi),
            "features_dir": str(self.features),
            "nvidia_driver_root": str(self.root / "driver"),
            "pod_resources_socket": str(self.root / "no-pod-resources.sock"),
        }


@pytest.fixture
def gpu_host(tmp_path: Path) -> Iterator[Any]:
    """Call with a machine name: ``gpu_host("dgx-8gpu")``; the fakes are closed afterwards."""
    made: list[FakeNvml] = []

    def make(machine: str) -> GpuHost:
        nvml = FakeNvml.from_file(machine)
        root = tmp_path / f"host{len(made)}"
        write_fake_dev(nvml, root / "dev")
        write_fake_sysfs(nvml, root / "sys")
        made.append(nvml)
        return GpuHost(nvml, root)

    yield make
    for nvml in made:
        nvml.close()


def pod(name: str, resource: str, count: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "containers": [
                {"name": "main", "image": "cuda", "resources": {"limits": {resource: str(count)}}}
            ]
        },
    }


@pytest.fixture
def mps_root(tmp_path: Path) -> Iterator[Path]:
    """Where MPS control daemons (the fake's stand-in) go; any left running is killed."""
    root = tmp_path / "mps"
    yield root
    for pid_file in root.glob(f"*/pipe/{PID_FILE}"):
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)


async def exited(pid: int, timeout: float = 10.0) -> None:
    """Wait until ``pid`` has ended (its pidfd turns readable: an event, not a poll)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    loop = asyncio.get_running_loop()
    ended: asyncio.Future[None] = loop.create_future()
    loop.add_reader(fd, lambda: ended.done() or ended.set_result(None))
    try:
        await asyncio.wait_for(ended, timeout)
    finally:
        loop.remove_reader(fd)
        os.close(fd)


def alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie is not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except OSError:
        return False
    return state != "Z"

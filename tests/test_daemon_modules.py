"""What the running plugin daemons hold in memory: no validation library once serving.

Each daemon is a real process registered with the emulator; what it has loaded is read from
``/proc/PID/maps`` (the shared objects it mapped), so nothing in the daemon is instrumented.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml

from kubedevice.generic.fake import FakeHost
from kubedevice.kubelet import Emulator
from kubedevice.nvidia.fake import FakeNvml, write_fake_dev, write_fake_sysfs

#: Compiled parts of validation libraries a daemon must not map (pydantic loads pydantic_core).
VALIDATION_LIBRARIES = ("pydantic_core", "msgspec")


def _mapped_libraries(pid: int) -> set[str]:
    names = set()
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and ".so" in parts[5]:
            names.add(parts[5])
    return names


@pytest.fixture
async def daemon() -> AsyncIterator[list[asyncio.subprocess.Process]]:
    procs: list[asyncio.subprocess.Process] = []
    yield procs
    for proc in procs:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def _start(procs: list[asyncio.subprocess.Process], *args: str) -> int:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "kubedevice",
        *args,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    procs.append(proc)
    return proc.pid


def _check(pid: int) -> None:
    mapped = _mapped_libraries(pid)
    assert any("cygrpc" in m for m in mapped), mapped  # the reading works: grpcio is there
    found = [m for m in mapped if any(lib in m for lib in VALIDATION_LIBRARIES)]
    assert found == [], found


async def test_generic_daemon_holds_no_validation_library(
    emu: Emulator, dp_dir: Path, tmp_path: Path, daemon: list[asyncio.subprocess.Process]
) -> None:
    host = FakeHost(tmp_path / "host")
    host.add_char_device("/dev/ttyUSB0")
    config = tmp_path / "c.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "version": "v1",
                "devRoot": str(host.dev_root),
                "sysRoot": str(host.sys_root),
                "resources": [
                    {"name": "example.com/serial", "groups": [{"paths": [{"path": "/dev/tty*"}]}]}
                ],
            }
        )
    )
    pid = await _start(daemon, "run", "--config", str(config), "--device-plugin-dir", str(dp_dir))
    await emu.wait_for_resource("example.com/serial", allocatable=1, timeout=30)
    _check(pid)


async def test_gpu_daemon_on_the_fake_backend_holds_no_validation_library(
    emu: Emulator, dp_dir: Path, tmp_path: Path, daemon: list[asyncio.subprocess.Process]
) -> None:
    nvml = FakeNvml.from_file("dgx-8gpu")
    write_fake_dev(nvml, tmp_path / "dev")
    write_fake_sysfs(nvml, tmp_path / "sys")
    nvml.close()
    pid = await _start(
        daemon,
        "nvidia",
        "run",
        "--nvml",
        "fake:dgx-8gpu",
        "--device-plugin-dir",
        str(dp_dir),
        "--dev-root",
        str(tmp_path / "dev"),
        "--sys-root",
        str(tmp_path / "sys"),
        "--features-dir",
        str(tmp_path / "features.d"),
        "--cdi-dir",
        str(tmp_path / "cdi"),
        "--pod-resources-socket",
        str(tmp_path / "none.sock"),
    )
    await emu.wait_for_resource("nvidia.com/gpu", allocatable=8, timeout=30)
    _check(pid)

"""`kubedevice nvidia run` as a real process: errors, no driver, control socket, reload."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from kubedevice.kubelet import Emulator
from kubedevice.nvidia.fake import MACHINES_DIR, send_control

GPU = "nvidia.com/gpu"


def _kubedevice(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kubedevice", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )


def _roots(host: Any) -> list[str]:
    return [
        "--dev-root",
        str(host.dev),
        "--sys-root",
        str(host.sys),
        "--cdi-dir",
        str(host.cdi),
        "--features-dir",
        str(host.features),
        "--driver-root",
        str(host.root / "driver"),
        "--pod-resources-socket",
        str(host.root / "none.sock"),
    ]


def test_no_driver_is_one_line_and_exit_2(dp_dir: Path) -> None:
    proc = _kubedevice(
        "nvidia", "run", "--nvml", "fake:no-driver", "--device-plugin-dir", str(dp_dir)
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: NVML DriverNotLoaded")
    assert "kernel driver is not loaded" in lines[0]
    assert "failOnInitError: false" in lines[0]
    assert "Traceback" not in proc.stderr + proc.stdout
    assert not any(dp_dir.iterdir())  # nothing was served


@pytest.mark.parametrize(
    ("args", "text", "message"),
    [
        (
            ["--nvml", "fake:dgx-8gpu"],
            "version: v1\nflags:\n  migStrategy: half\n",
            "flags.migStrategy: must be",
        ),
        (
            ["--nvml", "fake:dgx-8gpu"],
            "version: v1\nflag: {}\n",
            "flag: unknown key (allowed: dra, flags",
        ),
        (["--nvml", "gpu"], "version: v1\n", "nvml: 'gpu' is not 'real' or 'fake:PATH'"),
    ],
)
def test_bad_config_or_option_exits_2_naming_it(
    tmp_path: Path, dp_dir: Path, args: list[str], text: str, message: str
) -> None:
    cfg = tmp_path / "gpu.yaml"
    cfg.write_text(text)
    proc = _kubedevice(
        "nvidia", "run", "--config", str(cfg), *args, "--device-plugin-dir", str(dp_dir)
    )
    assert proc.returncode == 2
    assert message in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


@pytest.fixture
async def spawn(dp_dir: Path) -> AsyncIterator[Callable[..., Any]]:
    procs: list[asyncio.subprocess.Process] = []

    async def start(*args: str, env: dict[str, str] | None = None) -> asyncio.subprocess.Process:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "kubedevice",
            "nvidia",
            "run",
            "--device-plugin-dir",
            str(dp_dir),
            *args,
            env={**os.environ, **(env or {})},
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_fail_on_init_error_false_serves_zero_gpus(
    emu: Emulator, tmp_path: Path, spawn: Any
) -> None:
    cfg = tmp_path / "gpu.yaml"
    cfg.write_text("version: v1\nflags:\n  failOnInitError: false\n")
    proc = await spawn("--config", str(cfg), "--nvml", "fake:no-driver")
    status = await emu.wait_for_resource(GPU, timeout=10)
    assert status.capacity == 0
    proc.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(proc.wait(), 10) == 0


async def test_control_socket_xid_and_file_reload(
    emu: Emulator, tmp_path: Path, sock_dir: Path, gpu_host: Any, spawn: Any
) -> None:
    host = gpu_host("pcie-4gpu")
    ctl = sock_dir / "nvml.sock"
    cfg = tmp_path / "gpu.yaml"
    cfg.write_text("version: v1\n")
    proc = await spawn(
        "--config",
        str(cfg),
        "--nvml",
        "fake:pcie-4gpu",
        *_roots(host),
        env={"KUBEDEVICE_FAKE_NVML_CONTROL": str(ctl)},
    )
    status = await emu.wait_for_resource(GPU, allocatable=4, timeout=10)
    uuid = status.devices[1].id

    def health(dev: str) -> str | None:
        st = emu.node().resources.get(GPU)
        return None if st is None else next((d.health for d in st.devices if d.id == dev), None)

    send_control(ctl, {"op": "xid", "uuid": uuid, "xid": 79})
    await emu.wait_until(lambda: health(uuid) == "Unhealthy", 2.0)

    # an invalid edit is rejected (the log says which field), the daemon keeps serving
    assert proc.stderr is not None
    _replace(cfg, "version: v1\nsharing: {timeSlicing: {resources: [{name: nvidia.com/gpu}]}}\n")
    line = await _log_line(proc.stderr, "new config rejected")
    assert "sharing.timeSlicing.resources[0].replicas: required field is missing" in line
    # a valid one is applied
    _replace(
        cfg,
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
        "      - {name: nvidia.com/gpu, replicas: 2}\n",
    )
    await emu.wait_until(lambda: emu.node().resources[GPU].capacity == 8, 10.0)
    # the GPU that had XID 79 is still Unhealthy in its replicas (health survives a reload)
    st = emu.node().resources[GPU]
    assert {d.health for d in st.devices if d.id.startswith(uuid)} == {"Unhealthy"}

    # SIGHUP re-reads the file too (unchanged now: the reload says so, nothing restarts)
    proc.send_signal(signal.SIGHUP)
    await _log_line(proc.stderr, "config unchanged")
    proc.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(proc.wait(), 10) == 0


def _replace(path: Path, text: str) -> None:
    """Replace a file atomically (as a ConfigMap update does): never seen half-written."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


async def _log_line(stream: asyncio.StreamReader, needle: str) -> str:
    async with asyncio.timeout(10):
        while True:
            line = (await stream.readline()).decode()
            if not line:
                raise AssertionError(f"the log ended before {needle!r}")
            if needle in line:
                return line


def test_info_text_and_json(gpu_host: Any) -> None:
    host = gpu_host("dgx-8gpu")
    text = _kubedevice("nvidia", "info", "--nvml", "fake:dgx-8gpu", "--sys-root", str(host.sys))
    assert text.returncode == 0, text.stderr
    assert "GPU0  X     NV18  NV18  NV18  NV2" in text.stdout
    assert "nvidia.com/gpu.count=8" in text.stdout
    proc = _kubedevice("nvidia", "info", "--nvml", "fake:mig-mixed", "-o", "json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    profiles = {m["profile"] for g in data["gpus"] for m in g["mig_devices"]}
    assert profiles == {"1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb"}
    none = _kubedevice("nvidia", "info", "--nvml", "fake:no-driver")
    assert none.returncode == 2
    assert none.stderr.strip().splitlines() == [
        "error: NVML DriverNotLoaded: fake machine 'no-driver' "
        "(the NVIDIA kernel driver is not loaded on this node)"
    ]


#: A rename whose socket path is longer than AF_UNIX allows (107 bytes) in any directory.
_LONG_NAME = f"{'a' * 60}.example.com/{'g' * 60}"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "version: v1\nflags:\n  migStrategy: single\n",
            "error: flags.migStrategy: 'single' needs every GPU MIG-enabled with one MIG profile",
        ),
        (
            "version: v1\nflags: {migStrategy: mixed}\nsharing:\n  timeSlicing:\n"
            "    resources: [{name: nvidia.com/mig-1g.18gb, replicas: 2, "
            "rename: nvidia.com-mig/3g.71gb}]\n",
            "socket name 'nvidia.com-mig-3g.71gb.sock' is already used",
        ),
        (
            "version: v1\nsharing:\n  timeSlicing:\n"
            f"    resources: [{{name: nvidia.com/gpu, replicas: 2, rename: {_LONG_NAME}}}]\n",
            f"error: sharing.timeSlicing: nvidia.com/gpu would be advertised as {_LONG_NAME}, "
            "whose socket path ",
        ),
    ],
    ids=["single-on-mixed", "socket-clash", "socket-path-too-long"],
)
def test_info_refuses_what_run_refuses(tmp_path: Path, text: str, message: str) -> None:
    cfg = tmp_path / "gpu.yaml"
    cfg.write_text(text)
    proc = _kubedevice("nvidia", "info", "--nvml", "fake:mig-mixed", "--config", str(cfg))
    assert proc.returncode == 2, proc.stdout
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"minor": "zero"}, "gpus.0.minor: expected an integer (got 'zero')"),
        ({"memory_mib": [1]}, "gpus.0.memory_mib: expected an integer"),
        ({"mig_capable": "yes"}, "gpus.0.mig_capable: expected true or false (got 'yes')"),
    ],
    ids=["minor", "memory", "mig-capable"],
)
def test_info_on_a_machine_file_with_a_mistyped_field_is_one_line_exit_2(
    tmp_path: Path, change: dict[str, Any], says: str
) -> None:
    doc = json.loads((MACHINES_DIR / "pcie-4gpu.json").read_text())
    doc["gpus"][0].update(change)
    machine = tmp_path / "typo.json"
    machine.write_text(json.dumps(doc))
    proc = _kubedevice("nvidia", "info", "--nvml", f"fake:{machine}")
    assert proc.returncode == 2, proc.stdout
    assert proc.stdout == ""
    assert proc.stderr.startswith(f"error: {machine}: {says}")
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_info_shows_a_fake_machines_numa_nodes() -> None:
    proc = _kubedevice("nvidia", "info", "--nvml", "fake:mig-mixed", "-o", "json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["topology"]["numa_nodes"] == [0, 0, 1, 1]
    text = _kubedevice("nvidia", "info", "--nvml", "fake:mig-mixed").stdout
    row = next(line for line in text.splitlines() if line.startswith("GPU2 "))
    assert row.split()[-1] == "1"  # the NUMA column of the topology matrix


def test_info_with_a_huge_sysfs_numa_node_is_one_line(gpu_host: Any) -> None:
    host = gpu_host("pcie-4gpu")
    bus = host.nvml.machine.gpus[0].info.pci_bus_id
    (host.sys / "bus" / "pci" / "devices" / bus / "numa_node").write_text(f"{10**20}\n")
    proc = _kubedevice("nvidia", "info", "--nvml", "fake:pcie-4gpu", "--sys-root", str(host.sys))
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "100000000000000000000' is not a NUMA node" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1

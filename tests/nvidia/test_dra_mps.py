"""MPS behind the GPU DRA driver's memory shares (``dra.mps``), on the fake NVML and its MPS
control daemon stand-in (real processes): each share's env and mounts, the daemon's
lifecycle (first prepare starts it, the last unprepare stops it, kill -9 restarts it and the
device's health says so, a restarted driver adopts it with the same pid or stops it when no
claim holds it), and the stand-in itself driven as ``nvidia-cuda-mps-control``."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from kubedevice.dra import AllocatedDevice, Claim, ClaimError, ClaimRef, Device, Health
from kubedevice.dra.api.slices import device_object
from kubedevice.dra.model.types import PreparedClaim
from kubedevice.nvidia.config import Config, parse_config
from kubedevice.nvidia.dra import GpuDraDriver
from kubedevice.nvidia.fake import mps as fake_mps
from kubedevice.nvidia.fake.mps import PID_FILE, read_state
from kubedevice.nvidia.fake.nvml import FakeNvml
from kubedevice.nvidia.mps import MpsDaemons
from kubedevice.nvidia.mpsclient import CONTAINER_PIPE_DIR

from .conftest import alive, exited

GIB = 1 << 30
FAKE_MPS = [sys.executable, "-S", str(Path(fake_mps.__file__))]


def _config(host: Any) -> Config:
    config = Config(version="v1").with_overrides(dev_root=str(host.dev), sys_root=str(host.sys))
    return config.with_mps()


def _share(name: str, share: str, memory: str, compute: str | None = None) -> AllocatedDevice:
    consumed = {"memory": memory}
    if compute is not None:
        consumed["compute"] = compute
    return AllocatedDevice(
        request="gpu", pool="node-1", name=name, device=None, share_id=share,
        consumed_capacity=consumed,
    )  # fmt: skip


def _claim(uid: str, *devices: AllocatedDevice) -> Claim:
    return Claim(ref=ClaimRef("default", f"c-{uid}", uid), devices=devices)


def _prepared(claim: Claim, prepared: Any) -> PreparedClaim:
    return PreparedClaim(
        claim.ref,
        devices=tuple((d.request, d.pool, d.name) for d in claim.devices),
        share_ids=tuple(d.share_id for d in claim.devices),
        data=tuple(dict(p.data) for p in prepared),
    )


async def _first(driver: GpuDraDriver) -> tuple[Any, dict[str, Device]]:
    gen = driver.devices()
    devices = await asyncio.wait_for(anext(gen), 10)
    return gen, {d.name: d for d in devices}


@dataclasses.dataclass
class Running:
    driver: GpuDraDriver
    gen: Any  # its devices() generator
    devices: dict[str, Device]  # the first snapshot
    uuid: str  # the first GPU's
    mps: MpsDaemons

    async def next(self) -> dict[str, Device]:
        return {d.name: d for d in await asyncio.wait_for(anext(self.gen), 10)}

    async def hold(self, *uids: str, memory: str = "20Gi") -> list[PreparedClaim]:
        out = []
        for uid in uids:
            claim = _claim(uid, _share("gpu-0", f"s-{uid}", memory))
            out.append(_prepared(claim, await self.driver.prepare(claim)))
        return out


@contextlib.asynccontextmanager
async def _running(
    host: Any, root: Path, restore: list[PreparedClaim] | None = None
) -> AsyncIterator[Running]:
    """A driver with dra.mps started (after restore(), when given), stopped afterwards."""
    driver = GpuDraDriver(_config(host), host.nvml, mps_root=root)
    if restore is not None:
        await driver.restore(restore)
    gen, devices = await _first(driver)
    assert driver.mps is not None
    try:
        yield Running(driver, gen, devices, driver.gpu_devices[0].gpu.uuid, driver.mps)
    finally:
        await gen.aclose()


async def _held_then_killed(host: Any, root: Path) -> tuple[list[PreparedClaim], int]:
    """A share prepared by a driver that then stops; its daemon killed while none runs."""
    async with _running(host, root) as run:
        held = await run.hold("u1")
        pid = run.mps.pid(run.uuid)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    await exited(pid)
    return held, pid


def test_the_config_key_and_the_flag_turn_memory_shares_on() -> None:
    config = parse_config({"version": "v1", "dra": {"mps": True}})
    assert config.dra.mps
    assert not config.dra.memory_shares.enabled  # the file says what it says ...
    assert Config(version="v1").with_mps().dra.memory_shares.enabled  # ... --mps turns both on
    assert not parse_config({"version": "v1"}).dra.mps


async def test_shared_gpus_publish_compute_beside_memory(gpu_host: Any, mps_root: Path) -> None:
    async with _running(gpu_host("one-gpu-80gib"), mps_root) as run:
        body = device_object(run.devices["gpu-0"])
        assert body["capacity"]["compute"] == {
            "value": "100",
            "requestPolicy": {
                "default": "0",
                "validRange": {"min": "0", "max": "100", "step": "1"},
            },
        }
        assert body["capacity"]["memory"]["requestPolicy"]["validRange"]["step"] == "1Gi"


async def test_each_share_is_an_mps_client_limited_to_what_was_counted(
    gpu_host: Any, mps_root: Path
) -> None:
    async with _running(gpu_host("one-gpu-80gib"), mps_root) as run:
        # 20.5Gi asked, 21Gi counted by the scheduler (step 1Gi): the limit is 21Gi
        one = await run.driver.prepare(_claim("u1", _share("gpu-0", "s-1", "21Gi", "25")))
        env = dict(one[0].edits.env)
        assert env["CUDA_MPS_PIPE_DIRECTORY"] == CONTAINER_PIPE_DIR
        assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"0={21 * 1024}M"
        assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
        assert env["KUBEDEVICE_GPU_MEMORY_LIMIT"] == str(21 * GIB)
        mounts = {m.container_path: m for m in one[0].edits.mounts}
        paths = run.mps.paths(run.uuid)
        assert paths.pipe.parent.parent == mps_root
        assert mounts[CONTAINER_PIPE_DIR].host_path == str(paths.pipe)
        assert not mounts[CONTAINER_PIPE_DIR].read_only
        assert "/dev/shm" in mounts
        # the daemon runs, bound to that GPU, with its directories under the root
        state = read_state(paths.log)
        assert state is not None
        assert state["visibleDevices"] == run.uuid
        assert state["pipeDirectory"] == str(paths.pipe)
        assert alive(state["pid"])
        # a share that names no compute has no SM limit
        two = await run.driver.prepare(_claim("u2", _share("gpu-0", "s-2", "20Gi", "0")))
        assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in two[0].edits.env
        assert two[0].edits.env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20480M"
        # a process with that env, as CUDA connects at its first call: the daemon records it
        client = subprocess.run(
            [*FAKE_MPS, "client"],
            env={**os.environ, **env, "CUDA_MPS_PIPE_DIRECTORY": str(paths.pipe)},
            capture_output=True, text=True, check=True, timeout=10,
        )  # fmt: skip
        assert '"pinnedMemLimit": "0=21504M"' in client.stdout
        recorded = read_state(paths.log)
        assert recorded is not None
        assert recorded["clients"][0]["activeThreadPercentage"] == "25"


async def test_first_prepare_starts_the_last_unprepare_stops(gpu_host: Any, mps_root: Path) -> None:
    async with _running(gpu_host("one-gpu-80gib"), mps_root) as run:
        assert run.mps.pid(run.uuid) is None  # nothing before the first share
        done = await run.hold("u0", "u1", "u2")
        pid = run.mps.pid(run.uuid)
        assert pid is not None
        assert alive(pid)
        assert all(p.data[0] == {"gpu": run.uuid, "mps": True} for p in done)
        for claim in done[:2]:
            await run.driver.unprepare(claim)
            assert run.mps.pid(run.uuid) == pid  # shares remain: the same daemon
        await run.driver.unprepare(done[2])
        assert run.mps.pid(run.uuid) is None
        await exited(pid)
        assert not run.mps.paths(run.uuid).pipe.exists()
        log = (run.mps.paths(run.uuid).log / "control.log").read_text()
        assert "command: quit" in log  # stopped as NVIDIA documents, not killed


async def test_a_killed_daemon_is_restarted_and_the_gpu_reports_it(
    gpu_host: Any, mps_root: Path
) -> None:
    async with _running(gpu_host("one-gpu-80gib"), mps_root) as run:
        [held] = await run.hold("u1")
        pid = run.mps.pid(run.uuid)
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        bad = (await run.next())["gpu-0"]
        assert bad.health == Health.UNHEALTHY
        assert bad.fault is not None
        assert bad.fault.kind == "mps-daemon"
        assert f"(pid {pid}) died" in bad.fault.message
        # a share prepared now waits for the restart under way, then joins the new daemon
        [after] = await run.hold("u2")
        new = run.mps.pid(run.uuid)
        assert new not in (None, pid)
        assert new is not None
        assert alive(new)
        # healthy again once the shares that lost their server are gone
        await run.driver.unprepare(held)
        assert (await run.next())["gpu-0"].health == Health.HEALTHY
        assert run.mps.pid(run.uuid) == new  # still held by the later share
        await run.driver.unprepare(after)


async def test_a_restarted_driver_adopts_the_daemon_or_stops_it(
    gpu_host: Any, mps_root: Path
) -> None:
    host = gpu_host("one-gpu-80gib")
    async with _running(host, mps_root) as run:
        held = await run.hold("u0", "u1", "u2", "u3")
        pid = run.mps.pid(run.uuid)
    # the driver stopped; its daemon did not
    assert pid is not None
    assert alive(pid)
    async with _running(host, mps_root, restore=held) as run:
        assert run.mps.pid(run.uuid) == pid  # adopted, not restarted
        assert run.devices["gpu-0"].health == Health.HEALTHY
        for claim in held:
            await run.driver.unprepare(claim)
        await exited(pid)
    # a daemon no claim holds (its claims unprepared while no driver ran) is stopped at start
    async with _running(host, mps_root) as run:
        await run.hold("u9")
        orphan = run.mps.pid(run.uuid)
    assert orphan is not None
    async with _running(host, mps_root, restore=[]) as run:
        await exited(orphan)
        assert run.mps.pid(run.uuid) is None


async def test_a_held_daemon_that_died_with_no_driver_is_started_at_start(
    gpu_host: Any, mps_root: Path
) -> None:
    host = gpu_host("one-gpu-80gib")
    held, pid = await _held_then_killed(host, mps_root)  # the pod's container ended with it
    async with _running(host, mps_root, restore=held) as run:
        new = run.mps.pid(run.uuid)
        assert new is not None
        assert new != pid
        assert alive(new)
        gpu = run.devices["gpu-0"]
        assert gpu.health == Health.UNHEALTHY
        assert gpu.fault is not None
        assert "was not running" in gpu.fault.message


async def test_shares_of_two_gpus_in_one_claim_are_refused(gpu_host: Any, mps_root: Path) -> None:
    async with _running(gpu_host("dgx-8gpu"), mps_root) as run:
        claim = _claim("u1", _share("gpu-0", "s-1", "10Gi"), _share("gpu-1", "s-2", "10Gi"))
        with pytest.raises(ClaimError, match="shares are of 2 GPUs"):
            await run.driver.prepare(claim)
        assert not list(mps_root.glob(f"*/pipe/{PID_FILE}"))  # nothing started


async def test_a_daemon_that_cannot_start_fails_the_claim(gpu_host: Any, mps_root: Path) -> None:
    async with _running(gpu_host("one-gpu-80gib"), mps_root) as run:
        run.mps.command = [sys.executable, "-c", "import sys; sys.exit('no GPU for MPS')"]
        with pytest.raises(ClaimError, match=r"cannot start the MPS control daemon.*no GPU"):
            await run.hold("u1")
        assert run.mps.holders(run.uuid) == frozenset()


def test_the_stand_in_is_driven_as_nvidia_cuda_mps_control(tmp_path: Path) -> None:
    pipe, logs = tmp_path / "pipe", tmp_path / "log"
    env = {
        **os.environ,
        "CUDA_MPS_PIPE_DIRECTORY": str(pipe),
        "CUDA_MPS_LOG_DIRECTORY": str(logs),
        "CUDA_VISIBLE_DEVICES": "GPU-abc",
    }
    run = dict(env=env, capture_output=True, text=True, timeout=10)
    assert subprocess.run([*FAKE_MPS, "-d"], **run).returncode == 0  # type: ignore[call-overload]
    pid = int((pipe / PID_FILE).read_text())
    try:
        assert alive(pid)
        again = subprocess.run([*FAKE_MPS, "-d"], **run)  # type: ignore[call-overload]
        assert again.returncode == 1
        assert "already running" in again.stderr
        out = subprocess.run(  # type: ignore[call-overload]
            FAKE_MPS,
            input="set_default_device_pinned_mem_limit 0 2G\n"
            "get_default_active_thread_percentage\n",
            **run,
        )
        assert out.stdout.strip() == "100"
        state = read_state(logs)
        assert state is not None
        assert state["defaults"]["pinnedMemLimit"] == {"0": "2G"}
        assert state["visibleDevices"] == "GPU-abc"
        subprocess.run(FAKE_MPS, input="quit\n", **run)  # type: ignore[call-overload]
        for _ in range(1000):
            if not alive(pid):
                break
            subprocess.run(["sleep", "0.01"], check=True)
        assert not alive(pid)
        assert not (pipe / PID_FILE).exists()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    no_pipe = {k: v for k, v in env.items() if k != "CUDA_MPS_PIPE_DIRECTORY"}
    bare = subprocess.run([*FAKE_MPS, "-d"], env=no_pipe, capture_output=True, text=True)
    assert bare.returncode == 1
    assert "CUDA_MPS_PIPE_DIRECTORY" in bare.stderr


def test_the_control_program_is_found_on_path_then_in_the_driver_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gpu_host: Any
) -> None:
    from kubedevice.errors import ConfigError
    from kubedevice.nvidia.mps import control_command

    class Real:  # a backend with no control program of its own (the real one)
        pass

    backend: Any = Real()
    root = tmp_path / "driver"
    tool = root / "usr/bin/nvidia-cuda-mps-control"
    tool.parent.mkdir(parents=True)
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    # a driver root mounted in a container: run there, with its libraries
    assert control_command(backend, str(root)) == ["chroot", str(root), "/usr/bin/" + tool.name]
    # the container runtime put it on PATH (compute capability): that one
    monkeypatch.setenv("PATH", str(tool.parent))
    assert control_command(backend, "/nonexistent") == [str(tool)]
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(ConfigError, match="no nvidia-cuda-mps-control on PATH nor under"):
        control_command(backend, str(tmp_path / "none"))
    # the fake brings its stand-in
    assert control_command(gpu_host("one-gpu-80gib").nvml, "/")[-1].endswith("fake/mps.py")


async def test_after_a_reboot_the_daemon_is_started_again_and_the_gpu_stays_healthy(
    gpu_host: Any, mps_root: Path
) -> None:
    host = gpu_host("one-gpu-80gib")
    held, _ = await _held_then_killed(host, mps_root)
    [boot] = mps_root.glob("*/boot-id")
    boot.write_text("an-earlier-boot\n")  # the node rebooted: every client went with it
    async with _running(host, mps_root, restore=held) as run:
        new = run.mps.pid(run.uuid)
        assert new is not None
        assert alive(new)
        assert run.devices["gpu-0"].health == Health.HEALTHY  # nobody lost a server
        assert (
            boot.read_text().strip() == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        )


async def test_a_hold_cut_off_while_the_daemon_starts_leaves_it_known(mps_root: Path) -> None:
    """A prepare cut off (a deadline, SIGTERM) while the daemon's start runs in its thread:
    the daemon the thread started is watched, and the GPU's last release stops it (before,
    the supervisor knew no daemon while one ran)."""
    fake = FakeNvml.from_file("one-gpu-80gib")
    try:
        daemons = MpsDaemons(mps_root, fake.mps_control_command())
    finally:
        fake.close()
    uuid = "GPU-00000000-0000-4000-8000-0000000000c1"
    hold = asyncio.ensure_future(daemons.hold(uuid, "claim-a"))
    while not daemons.paths(uuid).pipe.exists():  # the thread has begun the start
        await asyncio.sleep(0)
    hold.cancel()
    with pytest.raises(asyncio.CancelledError):
        await hold
    pid = daemons.pid(uuid)
    assert pid is not None
    assert alive(pid)
    assert daemons.holders(uuid) == frozenset()
    await daemons.release(uuid, "claim-a")  # the cut-off prepare's unprepare
    await exited(pid)
    assert daemons.pid(uuid) is None

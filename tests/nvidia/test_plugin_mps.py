"""``sharing.mps`` in the GPU device plugin, against the kubelet emulator on the fake NVML and
its MPS control daemon stand-in (real processes): the config's checks, each replica's env and
mounts, the daemons run with one replica's defaults, kept across a restart of the plugin
(same pid) and stopped when a reload stops sharing; a daemon killed while a replica is in use
makes the GPU's replicas Unhealthy until the container holding one is gone (the kubelet's
PodResources says who holds what), or until the plugin restarts when nothing answers there."""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from kubedevice.errors import AdmissionError, ConfigError
from kubedevice.kubelet import Emulator
from kubedevice.nvidia.config import Config, parse_config
from kubedevice.nvidia.fake.mps import read_state
from kubedevice.nvidia.labels import node_labels
from kubedevice.nvidia.mpsclient import CONTAINER_PIPE_DIR
from kubedevice.nvidia.mpsreplicas import HOLDER
from kubedevice.nvidia.runner import GpuPlugins

from .conftest import alive, pod

GPU = "nvidia.com/gpu"
SHARED = "nvidia.com/gpu.shared"


def _config(root: Path, replicas: int = 4, **mps: Any) -> Config:
    return parse_config(
        {
            "version": "v1",
            "flags": {"mpsRoot": str(root)},
            "sharing": {
                "mps": {
                    "renameByDefault": True,
                    "resources": [{"name": GPU, "replicas": replicas}],
                    **mps,
                }
            },
        }
    )


def _plugins(
    host: Any, dp_dir: Path, config: Config, pod_resources: Path | None = None
) -> GpuPlugins:
    overrides = host.overrides()
    if pod_resources is not None:
        overrides["pod_resources_socket"] = str(pod_resources)
    return GpuPlugins(config, host.nvml, device_plugin_dir=dp_dir, overrides=overrides)


def _health(emu: Emulator) -> list[str]:
    """The health of each device of the shared resource, as ListAndWatch last said."""
    status = emu.node().resources.get(SHARED)
    return [] if status is None else [d.health for d in status.devices]


async def _killed(emu: Emulator, plugins: GpuPlugins, uuid: str) -> tuple[int, int]:
    """Kill -9 the GPU's daemon; wait until its replicas are Unhealthy and a new daemon runs.

    The old and the new pid.
    """
    daemons = plugins.mps.daemons
    assert daemons is not None
    pid = daemons.pid(uuid)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    await emu.wait_until(lambda: _health(emu) == ["Unhealthy"] * 4, timeout=5)
    await daemons.hold(uuid, HOLDER)  # held already: returns once the restart under way is done
    new = daemons.pid(uuid)
    assert new is not None
    assert new != pid
    assert alive(new)
    return pid, new


def test_the_config_shape_is_nvidias_and_its_checks() -> None:
    config = _config(Path("/run/x"), failRequestsGreaterThanOne=True)
    assert config.sharing.strategy == "mps"
    assert config.sharing.active.fail_requests_greater_than_one
    assert config.sharing.active.advertised_name(GPU) == SHARED
    with pytest.raises(ConfigError, match="sharing: timeSlicing and mps: use one of them"):
        parse_config(
            {
                "version": "v1",
                "sharing": {
                    "mps": {"resources": [{"name": GPU, "replicas": 2}]},
                    "timeSlicing": {"resources": [{"name": GPU, "replicas": 2}]},
                },
            }
        )
    with pytest.raises(ConfigError, match=r"mps.resources\[0\].name: MPS shares whole GPUs"):
        parse_config(
            {
                "version": "v1",
                "sharing": {
                    "mps": {"resources": [{"name": "nvidia.com/mig-1g.10gb", "replicas": 2}]}
                },
            }
        )


async def test_each_replica_is_a_client_limited_to_its_part(
    emu: Emulator, dp_dir: Path, gpu_host: Any, mps_root: Path
) -> None:
    host = gpu_host("one-gpu-80gib")
    uuid = host.nvml.machine.gpus[0].info.uuid
    async with _plugins(host, dp_dir, _config(mps_root)) as plugins:
        await emu.wait_for_resource(SHARED, allocatable=4, timeout=5)
        daemons = plugins.mps.daemons
        assert daemons is not None
        pid = daemons.pid(uuid)
        assert pid is not None
        assert alive(pid)
        state = read_state(daemons.paths(uuid).log)
        assert state is not None
        assert state["visibleDevices"] == uuid
        # the daemon's defaults: one replica's part (80 GiB / 4, 100 % / 4)
        assert state["defaults"] == {
            "pinnedMemLimit": {"0": "20480M"},
            "activeThreadPercentage": 25.0,
        }
        one = (await emu.apply_pod(pod("one", SHARED, 1))).container("main").runtime
        assert one.envs["CUDA_MPS_PIPE_DIRECTORY"] == CONTAINER_PIPE_DIR
        assert one.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20480M"
        assert one.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
        mounts = {m.container_path: m.host_path for m in one.mounts}
        assert mounts[CONTAINER_PIPE_DIR] == str(daemons.paths(uuid).pipe)
        assert "/dev/shm" in mounts
        two = (await emu.apply_pod(pod("two", SHARED, 2))).container("main").runtime
        assert two.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=40960M"
        assert two.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
        labels = node_labels(plugins.config, host.nvml.init(), host.nvml.gpus(), {})
        assert labels["nvidia.com/gpu.sharing-strategy"] == "mps"
    # the plugin stopped, the daemon did not (pods still use it); a new plugin adopts it
    assert alive(pid)
    async with _plugins(host, dp_dir, _config(mps_root)) as plugins:
        await emu.wait_for_resource(SHARED, allocatable=4, timeout=5)
        assert plugins.mps.daemons is not None
        assert plugins.mps.daemons.pid(uuid) == pid
        # a reload that stops sharing stops the daemon
        plain = parse_config({"version": "v1", "flags": {"mpsRoot": str(mps_root)}})
        await plugins.reload(plain)
        await emu.wait_for_resource(GPU, allocatable=1, timeout=5)
        assert plugins.mps.daemons.pid(uuid) is None
        assert not alive(pid)


async def test_replicas_of_two_gpus_in_one_container_are_refused(
    emu: Emulator, dp_dir: Path, gpu_host: Any, mps_root: Path
) -> None:
    host = gpu_host("pcie-4gpu")
    async with _plugins(host, dp_dir, _config(mps_root, replicas=2)):
        await emu.wait_for_resource(SHARED, allocatable=8, timeout=5)
        with pytest.raises(AdmissionError, match="replicas must be of one GPU"):
            await emu.apply_pod(pod("wide", SHARED, 8))


async def test_a_killed_daemon_makes_the_replicas_unhealthy_until_its_clients_are_gone(
    emu: Emulator,
    dp_dir: Path,
    gpu_host: Any,
    mps_root: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    host = gpu_host("one-gpu-80gib")
    uuid = host.nvml.machine.gpus[0].info.uuid
    caplog.set_level(logging.INFO, logger="kubedevice.nvidia.mpsreplicas")
    async with _plugins(host, dp_dir, _config(mps_root), emu.pod_resources_socket) as plugins:
        await emu.wait_for_resource(SHARED, allocatable=4, timeout=5)
        plugins.mps.recheck_s = 0.05  # how often it asks PodResources while Unhealthy
        await emu.apply_pod(pod("one", SHARED, 1))  # a client of the daemon about to die
        pid, new = await _killed(emu, plugins, uuid)
        daemons = plugins.mps.daemons
        assert daemons is not None
        warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        told = [m for m in warned if f"MPS replicas of {uuid} Unhealthy" in m]
        assert len(told) == 1, warned
        assert f"(pid {pid}) died" in told[0]
        state = read_state(daemons.paths(uuid).log)
        assert state is not None
        assert state["defaults"]["activeThreadPercentage"] == 25.0  # set up again
        # the new daemon runs, but pod one's container lost its server: still Unhealthy
        still = await plugins.mps.check()
        assert f"(pid {pid}) died" in still[uuid]
        assert _health(emu) == ["Unhealthy"] * 4
        with pytest.raises(AdmissionError):  # nothing new is placed on it meanwhile
            await emu.apply_pod(pod("two", SHARED, 1))
        await emu.delete_pod("one")  # the plugin's next reading of PodResources sees it gone
        await emu.wait_until(lambda: _health(emu) == ["Healthy"] * 4, timeout=5)
        assert plugins.mps.faults() == {}
        assert daemons.pid(uuid) == new
        assert any("Healthy again" in r.getMessage() for r in caplog.records)
        await emu.apply_pod(pod("three", SHARED, 1))


async def test_without_pod_resources_a_killed_daemon_is_unhealthy_until_the_plugin_restarts(
    emu: Emulator, dp_dir: Path, gpu_host: Any, mps_root: Path
) -> None:
    host = gpu_host("one-gpu-80gib")
    uuid = host.nvml.machine.gpus[0].info.uuid
    async with _plugins(host, dp_dir, _config(mps_root)) as plugins:  # no PodResources socket
        await emu.wait_for_resource(SHARED, allocatable=4, timeout=5)
        await emu.apply_pod(pod("one", SHARED, 1))
        _, new = await _killed(emu, plugins, uuid)
        assert uuid in await plugins.mps.check()  # nobody can tell whether pod one is gone
        await emu.delete_pod("one")
        assert uuid in await plugins.mps.check()
        assert _health(emu) == ["Unhealthy"] * 4
    # restarted: the running daemon is adopted (same pid) and its replicas are Healthy
    async with _plugins(host, dp_dir, _config(mps_root)) as plugins:
        await emu.wait_until(lambda: _health(emu) == ["Healthy"] * 4, timeout=5)
        assert plugins.mps.daemons is not None
        assert plugins.mps.daemons.pid(uuid) == new
        assert plugins.mps.faults() == {}

"""The container command and args the chart renders really start the plugin and register.

The rendered DaemonSet is "run" on this machine: a temp dir stands for the container's file
system and another for the node's. Each volume mount is laid out: the rendered ConfigMap's
keys are written at its mount path; a hostPath volume is a link to that path in the node's
tree, which has a fake /dev and /sys, and the device-plugin directory that the emulator
serves. Every argument that names a path under a mount is prefixed with the container's temp
dir, and the metrics port becomes a free local port. The command itself (dumb-init,
kubedevice) runs as rendered, with the rendered environment. Each component is one
:class:`Component`; the GPU plugin's variant adds an entry with its fake GPU tree.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from deploy.render import by_kind, container, daemonset, render
from kubedevice.demo.generic import free_port, pod_manifest, scrape
from kubedevice.generic.fake import FakeHost
from kubedevice.kubelet import Emulator
from kubedevice.nvidia import fake as nvml_fake

VENV_BIN = Path(sys.executable).parent


@dataclass(frozen=True)
class Component:
    """One component of the chart, as this test runs it."""

    name: str  # app.kubernetes.io/component
    values: dict[str, str]
    resource: str  # the resource it must register
    allocatable: int
    #: lay out the node's fake hardware (its /dev and /sys under the FakeHost root); returns
    #: environment variables that select fake hardware (nothing else is added to the env)
    prepare_host: Callable[[FakeHost], dict[str, str]]
    #: make every device vanish or fail (proves which tree and hardware it watches)
    unplug: Callable[[FakeHost], None]


def _fuse(host: FakeHost) -> dict[str, str]:
    host.add_char_device("/dev/fuse")
    return {}


_GPU_MACHINE = "pcie-4gpu"


def _gpus(host: FakeHost) -> dict[str, str]:
    machine = nvml_fake.load_machine(_GPU_MACHINE)
    nvml_fake.write_fake_dev(machine, host.dev_root)
    nvml_fake.write_fake_sysfs(machine, host.sys_root)
    return {
        "KUBEDEVICE_NVML": f"fake:{_GPU_MACHINE}",
        nvml_fake.CONTROL_ENV: str(host.root / "nvml.sock"),
    }


def _gpus_lost(host: FakeHost) -> None:
    for gpu in nvml_fake.load_machine(_GPU_MACHINE).gpus:
        nvml_fake.send_control(host.root / "nvml.sock", {"op": "lost", "uuid": gpu.info.uuid})


COMPONENTS = [
    Component(
        "generic",
        {},
        "kubedevice.io/fuse",
        10,
        _fuse,
        lambda host: host.remove("/dev/fuse"),
    ),
    Component(
        "nvidia",
        {"nvidia.enabled": "true", "generic.enabled": "false"},
        "nvidia.com/gpu",
        4,
        _gpus,
        _gpus_lost,
    ),
]


def _lay_out(docs: list[dict[str, Any]], ds: dict[str, Any], root: Path, node: Path) -> None:
    """Create every volume mount of the pod under ``root`` (hostPath volumes in ``node``)."""
    pod = ds["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    config_maps = {d["metadata"]["name"]: d for d in by_kind(docs, "ConfigMap")}
    for m in container(ds)["volumeMounts"]:
        target = root / m["mountPath"].lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        vol = volumes[m["name"]]
        if "configMap" in vol:
            data = config_maps[vol["configMap"]["name"]]["data"]
            target.mkdir()
            for item in vol["configMap"].get("items") or [{"key": k, "path": k} for k in data]:
                (target / item["path"]).write_text(data[item["key"]])
        else:
            on_node = node / vol["hostPath"]["path"].lstrip("/")
            on_node.mkdir(parents=True, exist_ok=True)
            target.symlink_to(on_node, target_is_directory=True)


def _rewrite(args: list[str], mounts: list[str], root: Path, metrics_port: int) -> list[str]:
    out = []
    for a in args:
        if any(a == p or a.startswith(p.rstrip("/") + "/") for p in mounts):
            a = str(root) + a
        elif a.startswith("0.0.0.0:"):
            a = f"127.0.0.1:{metrics_port}"
        out.append(a)
    return out


async def _kill_tree(proc: asyncio.subprocess.Process) -> None:
    """SIGKILL dumb-init and what it started (it cannot forward SIGKILL; the plugin runs in
    its own session)."""
    if proc.returncode is not None:
        return
    try:
        family = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        family = []
    for p in family:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    await proc.wait()


@pytest.fixture
async def stopper() -> AsyncIterator[list[asyncio.subprocess.Process]]:
    procs: list[asyncio.subprocess.Process] = []
    try:
        yield procs
    finally:
        for p in procs:
            await _kill_tree(p)


@pytest.mark.parametrize("comp", COMPONENTS, ids=lambda c: c.name)
async def test_rendered_container_registers_with_the_emulator(
    comp: Component, sock_dir: Path, stopper: list[asyncio.subprocess.Process]
) -> None:
    docs = render(values=comp.values)
    ds = daemonset(docs, comp.name)
    ctr = container(ds)
    mounts = [m["mountPath"] for m in ctr["volumeMounts"]]
    node = sock_dir / "node"
    host = FakeHost(node)
    fake_hardware = comp.prepare_host(host)
    root = sock_dir / "c"
    _lay_out(docs, ds, root, node)
    port = free_port()
    argv = ctr["command"] + _rewrite(ctr["args"], mounts, root, port)
    env = {e["name"]: e["value"] for e in ctr.get("env", [])}
    env.update(fake_hardware)
    # A guard only: the rendered args name the directory (test_chart checks it), and this
    # keeps a plugin that ignored them off the real host's kubelet directory.
    env["DP_DEVICE_PLUGIN_DIR"] = str(root / "var/lib/kubelet/device-plugins")
    env["PATH"] = f"{VENV_BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}"
    if "PYTHONPATH" in os.environ:  # a source tree given to this run reaches the plugin too
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    assert shutil.which(argv[0], path=env["PATH"]), f"{argv[0]} is not installed"
    dp_dir = node / "var/lib/kubelet/device-plugins"
    async with Emulator(dp_dir, control_socket=False, dial_timeout_s=2.0) as emu:
        proc = await asyncio.create_subprocess_exec(
            *argv, env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
        )
        stopper.append(proc)
        try:
            status = await emu.wait_for_resource(
                comp.resource, allocatable=comp.allocatable, timeout=20
            )
        except TimeoutError:
            await _kill_tree(proc)
            assert proc.stderr is not None
            err = (await proc.stderr.read()).decode(errors="replace")
            raise AssertionError(f"{argv} did not register:\n{err[-3000:]}") from None
        assert status.connected
        pod = await emu.apply_pod(pod_manifest("user", comp.resource, 1))
        [c] = pod.containers
        specs = c.runtime.devices
        assert specs, "the allocation carries device nodes"
        for spec in specs:  # host paths as the node sees them, not the /host mount
            assert spec.host_path.startswith("/dev/"), spec
            assert not spec.host_path.startswith(str(root)), spec
        body = await asyncio.to_thread(scrape, f"http://127.0.0.1:{port}/metrics")
        assert "# TYPE" in body
        comp.unplug(host)  # the node's /dev, seen through the /host/dev mount, not this /dev
        await emu.wait_for_resource(comp.resource, allocatable=0, timeout=10)
        proc.send_signal(signal.SIGTERM)  # to dumb-init, which forwards it
        rc = await asyncio.wait_for(proc.wait(), 15)
        assert proc.stderr is not None
        err = (await proc.stderr.read()).decode(errors="replace")
        assert rc == 0, err
        assert not [p for p in dp_dir.iterdir() if p.name != "kubelet.sock" and p.is_socket()]

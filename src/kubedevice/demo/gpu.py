"""``kubedevice demo --gpu``: the GPU plugin on a fake 8-GPU NVLink box, against the emulator.

One command, no GPU and no cluster: the fake NVML machine ``dgx-8gpu`` (two NVLink cliques
of four on two NUMA nodes), its ``/dev`` and ``/sys`` trees under a temp dir, the kubelet
emulator in-process and ``kubedevice nvidia run --nvml fake:dgx-8gpu`` as a real process.
It narrates: registration, a 4-GPU pod placed on an NVLink clique, an injected XID that
turns a GPU Unhealthy within milliseconds and a recovery after the quiet period, the
per-pod metrics, the node labels, time-slicing replicas after a config reload, and a clean
SIGTERM. Every step waits on an event (never a sleep) with a timeout, and is timed.

Glue between the two sides, like :mod:`kubedevice.demo.generic`; it holds no plugin logic.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubedevice.demo.generic import (
    STEP_TIMEOUT_S,
    DemoError,
    DemoResult,
    Narrator,
    check_plugin_exit,
    device_health,
    free_port,
    kill_plugin,
    logs_to_file,
    open_workdir,
    pod_manifest,
    scrape,
    terminate_plugin,
    timed,
)
from kubedevice.kubelet import Emulator
from kubedevice.kubelet.render import node_text, pods_table
from kubedevice.kubelet.types import RegistrationEvent
from kubedevice.nvidia.fake import FakeNvml, send_control, write_fake_dev, write_fake_sysfs

__all__ = ["run_gpu_demo"]

GPU = "nvidia.com/gpu"
SHARED = "nvidia.com/gpu.shared"
MACHINE = "dgx-8gpu"

CONFIG = """\
version: v1
flags:
  deviceListStrategy: [envvar, cdi-cri]   # NVIDIA_VISIBLE_DEVICES and CDI device names
health:
  quietPeriod: 1s                         # a GPU with XID 48 is probed again after 1 s
"""
SHARED_CONFIG = """\
version: v1
flags:
  deviceListStrategy: [envvar, cdi-cri]
sharing:
  timeSlicing:
    renameByDefault: true                 # advertised as nvidia.com/gpu.shared
    resources:
      - name: nvidia.com/gpu
        replicas: 4
"""


def _pod(name: str, resource: str, count: int) -> dict[str, Any]:
    return pod_manifest(name, resource, count, namespace="ml", container="train", image="cuda")


def _replace(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


async def run_gpu_demo(
    out: Callable[[str], None] = print, *, workdir: Path | None = None
) -> DemoResult:
    """Run the GPU demo, printing each step through ``out``.

    Raises:
        DemoError: A step did not reach its expected state within its timeout.
    """
    result = DemoResult()
    say = Narrator(out)
    with open_workdir(workdir) as root, logs_to_file(root / "emulator.log"):
        say.step(f"Simulated GPU node: fake NVML machine '{MACHINE}'")
        nvml = FakeNvml.from_file(MACHINE)
        machine = nvml.machine
        write_fake_dev(nvml, root / "dev")
        write_fake_sysfs(nvml, root / "sys")
        nvml.close()
        index = {g.info.uuid: g.info.index for g in machine.gpus}
        for g in machine.gpus:
            say.say(
                f"   GPU {g.info.index}  {g.info.name}  {g.info.uuid}  NUMA {g.numa_node}  "
                f"/dev/nvidia{g.info.minor}"
            )
        say.say(f"   log files: {root / 'emulator.log'}, {root / 'plugin.log'}")
        dp_dir = root / "kubelet" / "device-plugins"
        dp_dir.mkdir(parents=True, exist_ok=True)
        config = root / "gpu.yaml"
        config.write_text(CONFIG)
        control = root / "nvml.sock"
        port = free_port()
        metrics_url = f"http://127.0.0.1:{port}/metrics"

        emu = Emulator(dp_dir, control_socket=False)
        await emu.start()
        plugin: asyncio.subprocess.Process | None = None
        log_path = root / "plugin.log"
        try:
            say.step(f"GPU plugin started: kubedevice nvidia run --nvml fake:{MACHINE}")
            say.block(config.read_text())
            t_start = time.monotonic()
            env = {**os.environ, "KUBEDEVICE_FAKE_NVML_CONTROL": str(control)}
            with log_path.open("wb") as log_file:
                plugin = await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    "kubedevice",
                    "nvidia",
                    "run",
                    "--nvml",
                    f"fake:{MACHINE}",
                    "--config",
                    str(config),
                    "--device-plugin-dir",
                    str(dp_dir),
                    "--dev-root",
                    str(root / "dev"),
                    "--sys-root",
                    str(root / "sys"),
                    "--cdi-dir",
                    str(root / "cdi"),
                    "--features-dir",
                    str(root / "features.d"),
                    "--pod-resources-socket",
                    str(emu.pod_resources_socket),
                    "--metrics-address",
                    f"127.0.0.1:{port}",
                    env=env,
                    stdout=log_file,
                    stderr=log_file,
                )
            await timed(
                "start to registered",
                emu.wait_until(
                    lambda: any(
                        isinstance(e, RegistrationEvent) and e.ok and e.t >= t_start
                        for e in emu.events
                    ),
                    15.0,
                ),
                result,
            )
            await emu.wait_until(lambda: emu.node().allocatable().get(GPU) == 8, STEP_TIMEOUT_S)
            say.say(
                f"   registered {result.timings['start to registered'] * 1000:.0f} ms after "
                "the process started; 8 GPUs with their NUMA nodes:"
            )
            say.block(node_text(emu.node().to_dict()))

            say.step("A pod asking for 4 GPUs gets an NVLink-connected set")
            big = await emu.apply_pod(_pod("llm-train", GPU, 4))
            result.admitted.append("llm-train")
            chosen = sorted(index[u] for u in big.container("train").devices[GPU])
            links = [
                f"{a}-{b}: {machine.links[frozenset((ga, gb))].nvlinks} NVLinks"
                for a, ga in ((i, machine.gpus[i].info.uuid) for i in chosen)
                for b, gb in ((j, machine.gpus[j].info.uuid) for j in chosen)
                if a < b and frozenset((ga, gb)) in machine.links
            ]
            say.say(
                f"   GPUs {chosen}: one full-strength NVLink clique ({', '.join(links[:3])}, ...)"
            )
            runtime = big.container("train").runtime
            say.say(f"   NVIDIA_VISIBLE_DEVICES={runtime.envs.get('NVIDIA_VISIBLE_DEVICES')}")
            say.say(f"   CDI devices: {', '.join(runtime.cdi_devices)}")
            say.say(f"   device nodes: {', '.join(d.host_path for d in runtime.devices)}")
            small = await emu.apply_pod(_pod("notebook", GPU, 1))
            result.admitted.append("notebook")
            say.block(pods_table([p.to_dict() for p in emu.pods()]))

            victim = small.container("train").devices[GPU][0]
            say.step(f"XID 13 (an application fault) on GPU {index[victim]}: ignored")
            send_control(control, {"op": "xid", "uuid": victim, "xid": 13})
            say.step(f"XID 48 (double-bit ECC) on GPU {index[victim]}, held by pod/notebook")
            send_control(control, {"op": "xid", "uuid": victim, "xid": 48})
            await timed(
                "XID to Unhealthy",
                emu.wait_until(
                    lambda: device_health(emu, GPU, victim) == "Unhealthy", STEP_TIMEOUT_S
                ),
                result,
            )
            say.say(
                f"   the kubelet saw GPU {index[victim]} Unhealthy "
                f"{result.timings['XID to Unhealthy'] * 1000:.1f} ms after the XID "
                "(one thread blocked in the NVML event wait, no polling); allocatable now "
                f"{emu.node().allocatable()[GPU]}"
            )
            await timed(
                "XID to Healthy again",
                emu.wait_until(
                    lambda: device_health(emu, GPU, victim) == "Healthy", STEP_TIMEOUT_S
                ),
                result,
            )
            say.say(
                f"   quiet for 1 s, the GPU answered a probe: Healthy again "
                f"{result.timings['XID to Healthy again']:.2f} s after the XID, no restart"
            )

            say.step("Per-pod GPU metrics (Prometheus, no separate exporter)")
            send_control(
                control, {"op": "sample", "uuid": victim, "values": {"utilization_gpu": 87}}
            )
            text = await asyncio.to_thread(scrape, metrics_url)
            shown = [
                line
                for line in text.splitlines()
                if line.startswith("kubedevice_nvidia_gpu_xid_errors_total{")
                or (
                    line.startswith("kubedevice_nvidia_gpu_utilization_percent")
                    and 'pod=""' not in line
                )
            ]
            if not any('pod="notebook"' in line for line in shown):
                raise DemoError("the metrics do not show pod/notebook's GPU")
            say.block("\n".join(shown))

            say.step("Node labels for node-feature-discovery (features.d, no second daemon)")
            labels = (root / "features.d" / "kubedevice-nvidia").read_text().splitlines()
            say.block("\n".join(line for line in labels if "gpu." in line or "mig." in line))

            say.step("Time-slicing: the config file is edited, the plugin reloads it")
            for name in ("llm-train", "notebook"):
                await emu.delete_pod(name, "ml")
            _replace(config, SHARED_CONFIG)
            await timed(
                "config edit to replicas served",
                emu.wait_until(lambda: emu.node().allocatable().get(SHARED) == 32, STEP_TIMEOUT_S),
                result,
            )
            say.block(SHARED_CONFIG)
            say.say(
                f"   {SHARED}: 32 replicas (4 per GPU) after "
                f"{result.timings['config edit to replicas served'] * 1000:.0f} ms"
            )
            pair = await emu.apply_pod(_pod("inference", SHARED, 2))
            result.admitted.append("inference")
            held = pair.container("train").devices[SHARED]
            gpus = sorted({index[d.split("::")[0]] for d in held})
            say.say(f"   a pod asking for 2 replicas got {', '.join(held)}")
            say.say(f"   -> replicas spread over GPUs {gpus} first")

            say.step("Stopping the plugin with SIGTERM")
            await terminate_plugin(plugin, result)
            say.say(f"   exit code {result.plugin_exit_code}")
        finally:
            await kill_plugin(plugin)
            await emu.stop()
        check_plugin_exit(result, log_path)

    say.summary(result)
    return result

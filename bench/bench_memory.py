"""Where the plugins' memory goes; prints one JSON object.

* ``imports``: RSS of a fresh interpreter after each import step, in the order a plugin
  daemon loads them (what each layer costs before any work is done);
* ``processes``: RSS and PSS of the running daemons, each registered with its own kubelet
  emulator that holds the ListAndWatch stream: the SDK example, the generic plugin with 1
  and with 1,000 devices, the GPU plugin on the fake 8-GPU backend (``dgx-8gpu``), and
  ``bare-grpc-aio-plugin``, the least a ``grpc.aio`` plugin does (serve ``DevicePlugin``,
  call Register once, hold the stream; same imports as the SDK), which is the floor the SDK
  is measured against;
* ``targets``: each goal next to what this run measured, and whether it is met.

The package is byte-compiled first (``compileall``), as ``pip install`` leaves it: a module
imported without its ``.pyc`` is compiled in the process, and the compiler's transient
memory would stay in the figures (``PYTHONDONTWRITEBYTECODE=1`` shells never write one).

RSS counts shared library pages (libpython, grpcio's ``cygrpc``, OpenSSL) in full in every
process that maps them; PSS shares them out, so it is the better measure of what one more
process costs a node.

Usage: ``python bench/bench_memory.py``.
"""

from __future__ import annotations

import compileall
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import (
    KUBEDEVICE,
    PY,
    ROOT,
    cpu_model,
    gpu_plugin_command,
    memory_mb,
    start_emulator,
    wait_allocatable,
    write_generic_config,
)

IMPORT_STEPS = [
    "asyncio",  # loads OpenSSL through asyncio's ssl support
    "grpc",
    "kubedevice._api",  # protobuf (upb) and the generated code
    "kubedevice",  # the SDK
    "yaml",
    "prometheus_client",
    "kubedevice.plugin.schema",  # the config models' checker (standard library only)
    "kubedevice.generic.runner",  # the generic daemon: config models, discovery, runner
    "kubedevice.nvidia.runner",  # the GPU daemon (its fake backend and config included)
    "kubedevice.dra.node.server",  # the DRA kit (its own API client: urllib3, no kubernetes)
    "kubedevice.nvidia.dra",  # the GPU DRA driver
    "kubedevice.generic.dra",  # the generic DRA driver
    "kubernetes.config",  # the official client: only for exec/auth-provider/proxy kubeconfigs
]

_IMPORTS_CODE = """
import importlib, json, sys
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
out = [["python", rss()]]
for name in sys.argv[1:]:
    importlib.import_module(name)
    out.append([name, rss()])
print(json.dumps(out))
"""


def _imports() -> list[dict[str, float | str]]:
    raw = subprocess.run(
        [PY, "-c", _IMPORTS_CODE, *IMPORT_STEPS], capture_output=True, text=True, check=True
    ).stdout
    steps = json.loads(raw)
    out: list[dict[str, float | str]] = []
    prev = 0.0
    for name, rss in steps:
        out.append({"import": name, "rss_mb": round(rss, 1), "added_mb": round(rss - prev, 1)})
        prev = rss
    return out


def _bare_plugin(directory: str) -> None:
    """The least a grpc.aio device plugin does (child process): serve, register, stream."""
    import asyncio

    import grpc

    from kubedevice._api import dp, dp_grpc

    listing = dp.ListAndWatchResponse(
        devices=[dp.Device(ID=f"bare-{i}", health="Healthy") for i in range(4)]
    )

    class Plugin(dp_grpc.DevicePluginServicer):  # type: ignore[misc]
        async def GetDevicePluginOptions(self, request: Any, context: Any) -> Any:
            return dp.DevicePluginOptions()

        async def ListAndWatch(self, request: Any, context: Any) -> Any:
            await context.write(listing)
            await asyncio.Event().wait()

    async def main() -> None:
        server = grpc.aio.server()
        dp_grpc.add_DevicePluginServicer_to_server(Plugin(), server)
        server.add_insecure_port(f"unix:{directory}/bare.sock")
        await server.start()
        async with grpc.aio.insecure_channel(f"unix:{directory}/kubelet.sock") as channel:
            await dp_grpc.RegistrationStub(channel).Register(
                dp.RegisterRequest(
                    version="v1beta1", endpoint="bare.sock", resource_name="example.com/bare"
                )
            )
        await server.wait_for_termination()

    asyncio.run(main())


def _generic_config(root: Path, devices: int) -> Path:
    return write_generic_config(root, "mem", (f"dev{i:04d}" for i in range(devices)))


def _targets(processes: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The RSS goals (MB) next to this run's figures."""
    bare = processes["bare-grpc-aio-plugin"]["rss_mb"]
    measured = {
        "gpu-plugin-fake-rss_mb": (processes["gpu-plugin-fake-8"]["rss_mb"], 50.0),
        "generic-plugin-1000-rss_mb": (processes["generic-plugin-1000"]["rss_mb"], 46.0),
        "sdk-example-over-bare-aio-rss_mb": (
            round(processes["sdk-example"]["rss_mb"] - bare, 1),
            3.0,
        ),
    }
    return {
        name: {"measured": value, "at_most": goal, "met": value <= goal}
        for name, (value, goal) in measured.items()
    }


def _measure(root: Path, name: str, cmd: list[str], resource: str, count: int) -> dict[str, Any]:
    d = root / name / "device-plugins"
    d.mkdir(parents=True)
    env = {**os.environ, "DP_DEVICE_PLUGIN_DIR": str(d)}
    emu = start_emulator(d, env)
    plugin: subprocess.Popen[bytes] | None = None
    try:
        plugin = subprocess.Popen(cmd, env=env, stderr=subprocess.DEVNULL)
        wait_allocatable(env, resource, count, 60)
        time.sleep(1.0)  # let start-up garbage settle before reading the steady state
        return {"devices": count, **memory_mb(plugin.pid, ("Rss", "Pss", "Anonymous"))}
    finally:
        for proc in (plugin, emu):
            if proc is not None:
                proc.terminate()
                proc.wait(10)


def main() -> None:
    if sys.argv[1:2] == ["--bare-plugin"]:
        _bare_plugin(os.environ["DP_DEVICE_PLUGIN_DIR"])
        return
    compileall.compile_dir(ROOT / "src" / "kubedevice", quiet=1)
    root = Path(tempfile.mkdtemp(prefix="kdmem-", dir="/tmp"))
    try:
        processes = {
            "bare-grpc-aio-plugin": _measure(
                root, "bare", [PY, __file__, "--bare-plugin"], "example.com/bare", 4
            ),
            "sdk-example": _measure(
                root,
                "sdk",
                [PY, str(ROOT / "examples/minimal.py")],
                "example.com/counter",
                4,
            ),
        }
        for n in (1, 1000):
            sub = root / f"g{n}"
            sub.mkdir()
            cfg = _generic_config(sub, n)
            processes[f"generic-plugin-{n}"] = _measure(
                root, f"generic{n}", [KUBEDEVICE, "run", "--config", str(cfg)], "example.com/mem", n
            )
        gpu_root = root / "gpu-host"
        gpu_root.mkdir()
        processes["gpu-plugin-fake-8"] = _measure(
            root, "gpu", gpu_plugin_command(gpu_root), "nvidia.com/gpu", 8
        )
        result = {
            "bench": "memory",
            "python": sys.version.split()[0],
            "cpu_model": cpu_model(),
            "targets": _targets(processes),
            "imports": _imports(),
            "processes": processes,
        }
        print(json.dumps(result, indent=2))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

"""End-to-end check of the GPU plugin on a real NVIDIA GPU; prints one JSON object.

Run it as ``scripts/gpu-check`` on a machine with an NVIDIA driver, ``nvidia-ml-py`` and
``torch`` (CUDA build) installed next to kubedevice (``pip install -e '.[nvidia]' torch``).
No cluster is needed: the kubelet emulator runs in this process and
``kubedevice nvidia run --nvml real`` as a real process against it. Steps:

1. NVML answers (timed); the GPUs' UUIDs as NVML lists them.
2. The plugin starts with the real NVML and registers ``nvidia.com/gpu`` (timed).
3. A pod asking for ``nvidia.com/gpu: 1`` is admitted (Allocate timed).
4. The device nodes in the Allocate response exist; the allocated ID is a UUID NVML lists.
5. A CUDA process started with the container's view (``CUDA_VISIBLE_DEVICES=<UUID>``) sees
   exactly one GPU, the allocated one; an unknown UUID makes it see none.
6. While that process computes, a metrics scrape shows the GPU's utilization above 0 and
   the pod's namespace/pod/container labels.
7. The plugin's resident memory while serving, then SIGTERM -> exit (timed, exit 0).

Without NVML (no ``nvidia-ml-py``, no driver) it prints one line and exits 2. Any failed
check exits 1 with the JSON saying which. Nothing is changed on the host except temp files.

``--nvml fake:MACHINE`` rehearses the same steps without a GPU (the fake NVML backend, its
``/dev`` and ``/sys`` trees under the temp dir, a utilization sample instead of the CUDA
process, whose steps are skipped); the tests run it that way.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
GPU = "nvidia.com/gpu"
STEP_TIMEOUT_S = 30.0

# The CUDA process: picks its GPUs from CUDA_VISIBLE_DEVICES like a container's process,
# reports what it sees, then keeps the GPU busy until told to stop (stdin closed).
CUDA_CHILD = r"""
import json, sys, threading, torch
n = torch.cuda.device_count()
uuids = []
for i in range(n):
    u = getattr(torch.cuda.get_device_properties(i), "uuid", None)
    uuids.append(None if u is None else str(u))
print(json.dumps({"count": n, "uuids": uuids}), flush=True)
if n and sys.argv[1:] == ["work"]:
    done = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
    a = torch.randn(4096, 4096, device="cuda")
    print(json.dumps({"busy": True}), flush=True)
    while not done.is_set():
        for _ in range(20):
            a = (a @ a).clamp_(-1, 1)
        torch.cuda.synchronize()
"""


@dataclass(frozen=True)
class Target:
    """What the plugin runs on: the real NVML, or a fake machine with its own trees."""

    nvml: str = "real"
    dev_root: Path | None = None
    sys_root: Path | None = None
    control: Path | None = None

    def host_path(self, path: str) -> str:
        """Where a ``/dev/...`` path of an Allocate response is on this machine."""
        if self.dev_root is None:
            return path
        return str(self.dev_root / path.removeprefix("/dev/"))


def _fake_target(nvml: str, work: Path) -> tuple[Target, float, list[str]]:
    """A fake machine's trees under ``work``; its NVML init time and UUIDs."""
    from kubedevice.nvidia.fake import FakeNvml, write_fake_dev, write_fake_sysfs

    fake = FakeNvml.from_file(nvml.removeprefix("fake:"))
    t0 = time.monotonic()
    fake.init()
    init_s = time.monotonic() - t0
    uuids = [g.uuid for g in fake.gpus()]
    write_fake_dev(fake, work / "dev")
    write_fake_sysfs(fake, work / "sys")
    fake.close()
    target = Target(nvml, work / "dev", work / "sys", work / "nvml.sock")
    return target, init_s, uuids


def _fail_no_nvml(why: str) -> None:
    print(
        f"gpu-check: NVML is not available here ({why}); it needs an NVIDIA GPU and driver, "
        "and nvidia-ml-py",
        file=sys.stderr,
    )
    raise SystemExit(2)


def _nvml() -> tuple[float, list[str]]:
    """Initialise NVML; return the time it took and the GPUs' UUIDs (exit 2 without NVML)."""
    try:
        import pynvml
    except ImportError:
        _fail_no_nvml("the Python module pynvml (nvidia-ml-py) is not installed")
    t0 = time.monotonic()
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        _fail_no_nvml(f"nvmlInit failed: {exc}")
    init_s = time.monotonic() - t0
    try:
        uuids = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            uuid = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i))
            uuids.append(uuid.decode() if isinstance(uuid, bytes) else str(uuid))
    finally:
        pynvml.nvmlShutdown()
    if not uuids:
        _fail_no_nvml("NVML lists no GPU")
    return init_s, uuids


def _rss_mb(pid: int) -> float | None:
    """The resident set of a process in MB (from /proc), ``None`` if it cannot be read."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return None


def _all_exist(target: Target, paths: list[str]) -> bool:
    return all(os.path.exists(target.host_path(p)) for p in paths)


def _uuid_matches(torch_uuid: str | None, nvml_uuid: str) -> bool:
    """torch prints a UUID without NVML's ``GPU-`` prefix."""
    if torch_uuid is None:
        return False
    return nvml_uuid.removeprefix("GPU-").lower() == torch_uuid.removeprefix("GPU-").lower()


async def _cuda_view(visible: str, *, work: bool) -> tuple[asyncio.subprocess.Process, Any]:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": visible}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        CUDA_CHILD,
        *(["work"] if work else []),
        env=env,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    async with asyncio.timeout(120):  # the first CUDA context can take a while
        line = await proc.stdout.readline()
    if not line:
        await proc.wait()
        raise RuntimeError(f"the CUDA process exited with {proc.returncode} before reporting")
    return proc, json.loads(line)


async def _check(result: dict[str, Any], nvml_uuids: list[str], target: Target, work: Path) -> None:
    from kubedevice.demo.generic import free_port
    from kubedevice.kubelet import Emulator
    from kubedevice.kubelet.types import RegistrationEvent, RpcEvent

    checks: dict[str, bool] = result["checks"]
    timings: dict[str, float] = result["timings_ms"]
    dp_dir = work / "kubelet" / "device-plugins"
    dp_dir.mkdir(parents=True)
    port = free_port()
    log_path = work / "plugin.log"
    plugin: asyncio.subprocess.Process | None = None
    emu = Emulator(dp_dir, control_socket=False)
    await emu.start()
    try:
        t0 = time.monotonic()
        args = ["--nvml", target.nvml]
        for flag, root in (("--dev-root", target.dev_root), ("--sys-root", target.sys_root)):
            if root is not None:
                args += [flag, str(root)]
        env = dict(os.environ)
        if target.control is not None:
            env["KUBEDEVICE_FAKE_NVML_CONTROL"] = str(target.control)
        with log_path.open("wb") as log_file:
            plugin = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "kubedevice", "nvidia", "run", *args,
                "--device-plugin-dir", str(dp_dir),
                "--cdi-dir", str(work / "cdi"),
                "--features-dir", str(work / "features.d"),
                "--pod-resources-socket", str(emu.pod_resources_socket),
                "--metrics-address", f"127.0.0.1:{port}",
                stdout=log_file, stderr=log_file, env=env,
            )  # fmt: skip
        await emu.wait_until(
            lambda: any(isinstance(e, RegistrationEvent) and e.ok for e in emu.events),
            STEP_TIMEOUT_S,
        )
        reg = next(e for e in emu.events if isinstance(e, RegistrationEvent) and e.ok)
        timings["start_to_registered"] = (reg.t - t0) * 1000
        status = await emu.wait_for_resource(
            GPU, allocatable=len(nvml_uuids), timeout=STEP_TIMEOUT_S
        )
        checks["every_nvml_gpu_advertised"] = sorted(d.id for d in status.devices) == sorted(
            nvml_uuids
        )

        manifest = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "gpu-check", "namespace": "default"},
            "spec": {
                "containers": [
                    {"name": "cuda", "image": "cuda", "resources": {"limits": {GPU: "1"}}}
                ]
            },
        }
        t_pod = time.monotonic()
        pod = await emu.apply_pod(manifest)
        timings["pod_admitted"] = (time.monotonic() - t_pod) * 1000
        allocs = [
            e
            for e in emu.events
            if isinstance(e, RpcEvent) and e.rpc == "Allocate" and e.t >= t_pod
        ]
        if allocs:
            timings["allocate"] = allocs[0].duration_s * 1000
        container = pod.container("cuda")
        (uuid,) = container.devices[GPU]
        result["allocated"] = uuid
        checks["pod_admitted"] = True
        checks["uuid_known_to_nvml"] = uuid in nvml_uuids
        nodes = [d.host_path for d in container.runtime.devices]
        result["device_nodes"] = nodes
        checks["device_nodes_exist"] = bool(nodes) and _all_exist(target, nodes)
        checks["env_names_the_gpu"] = container.runtime.envs.get("NVIDIA_VISIBLE_DEVICES") == uuid

        if target.control is None:
            await _cuda_checks(result, uuid, port)
        else:  # rehearsal: the fake reports the load a CUDA process would cause
            from kubedevice.nvidia.fake import send_control

            result["cuda"] = "skipped: fake NVML"
            send_control(
                target.control, {"op": "sample", "uuid": uuid, "values": {"utilization_gpu": 55}}
            )
            await _metrics_checks(result, uuid, port)
        result["plugin_rss_mb"] = _rss_mb(plugin.pid)
        t_term = time.monotonic()
        plugin.terminate()
        async with asyncio.timeout(15):
            checks["plugin_clean_exit"] = await plugin.wait() == 0
        timings["sigterm_to_exit"] = (time.monotonic() - t_term) * 1000
    finally:
        if plugin is not None and plugin.returncode is None:
            plugin.kill()
            await plugin.wait()
        await emu.stop()
        if not all(checks.values()):
            with contextlib.suppress(OSError):
                result["plugin_log_tail"] = log_path.read_text(errors="replace")[-1500:]


async def _cuda_checks(result: dict[str, Any], uuid: str, port: int) -> None:
    """The allocated GPU as a container's CUDA process sees it, and metrics while it runs."""
    checks: dict[str, bool] = result["checks"]
    nobody, seen = await _cuda_view("GPU-00000000-0000-0000-0000-000000000000", work=False)
    await nobody.wait()
    checks["unknown_uuid_sees_no_gpu"] = seen["count"] == 0
    proc, seen = await _cuda_view(uuid, work=True)
    try:
        result["cuda_uuids"] = seen["uuids"]
        checks["cuda_sees_exactly_one_gpu"] = seen["count"] == 1
        checks["cuda_gpu_is_the_allocated_one"] = bool(seen["uuids"]) and _uuid_matches(
            seen["uuids"][0], uuid
        )
        assert proc.stdout is not None
        async with asyncio.timeout(60):
            busy = json.loads(await proc.stdout.readline())
        checks["cuda_workload_running"] = bool(busy.get("busy"))
        await _metrics_checks(result, uuid, port)
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        async with asyncio.timeout(30):
            await proc.wait()


async def _metrics_checks(result: dict[str, Any], uuid: str, port: int) -> None:
    """A scrape shows the GPU busy and labelled with the pod holding it."""
    from kubedevice.demo.generic import scrape

    checks: dict[str, bool] = result["checks"]
    # NVML's utilization is an average over its last sample period: scrape until it shows
    # the load (bounded), as a monitoring system would.
    url = f"http://127.0.0.1:{port}/metrics"
    line = ""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        text = await asyncio.to_thread(scrape, url)
        line = next(
            (
                x
                for x in text.splitlines()
                if x.startswith("kubedevice_nvidia_gpu_utilization_percent{")
                and f'uuid="{uuid}"' in x
            ),
            "",
        )
        if line and float(line.rsplit(" ", 1)[1]) > 0:
            break
        await asyncio.sleep(1.1)  # NVML and the collector sample at most once a second
    result["metrics_line"] = line
    checks["metrics_utilization_above_0"] = bool(line) and float(line.rsplit(" ", 1)[1]) > 0
    checks["metrics_carry_pod_labels"] = all(
        f'{k}="{v}"' in line
        for k, v in (("namespace", "default"), ("pod", "gpu-check"), ("container", "cuda"))
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--nvml",
        default="real",
        help="'real' (default) or 'fake:MACHINE' to rehearse without a GPU",
    )
    args = parser.parse_args(argv)
    if str(ROOT / "src") not in sys.path and (ROOT / "src" / "kubedevice").is_dir():
        sys.path.insert(0, str(ROOT / "src"))  # run from a checkout without installing
        os.environ["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH")) if p
        )
    work = Path(tempfile.mkdtemp(prefix="kd-gpu-check-", dir="/tmp"))
    try:
        if args.nvml.startswith("fake:"):
            from kubedevice.errors import KubeDeviceError

            try:
                target, init_s, uuids = _fake_target(args.nvml, work)
            except KubeDeviceError as exc:
                _fail_no_nvml(str(exc))
        else:
            target = Target()
            init_s, uuids = _nvml()
            try:
                import torch  # noqa: F401  (checked here: the CUDA child needs it)
            except ImportError:
                print("gpu-check: torch is not installed (pip install torch)", file=sys.stderr)
                raise SystemExit(2) from None
        result: dict[str, Any] = {
            "python": sys.version.split()[0],
            "nvml": args.nvml,
            "nvml_gpus": uuids,
            "timings_ms": {"nvml_init": init_s * 1000},
            "checks": {},
        }
        error = None
        try:
            asyncio.run(_check(result, uuids, target, work))
        except Exception as exc:  # report what failed in the JSON, not as a traceback
            error = f"{type(exc).__name__}: {exc}"
    finally:
        shutil.rmtree(work, ignore_errors=True)
    ok = error is None and bool(result["checks"]) and all(result["checks"].values())
    result["ok"] = ok
    if error is not None:
        result["error"] = error
    result["timings_ms"] = {k: round(v, 1) for k, v in result["timings_ms"].items()}
    print(json.dumps(result, indent=2))
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()

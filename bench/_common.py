"""Helpers the bench scripts share: paths, the machine description, child processes, figures.

Imported by the scripts in this folder as ``_common`` (a script's own folder is first on
``sys.path`` when it is run as ``python bench/bench_x.py``); not a benchmark itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
KUBEDEVICE = str(Path(PY).parent / "kubedevice")


def cpu_model() -> str:
    """``"<count> x <model name>"`` of this machine's CPUs, from /proc/cpuinfo."""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return f"{os.cpu_count()} x {line.split(':', 1)[1].strip()}"
    return f"{os.cpu_count()} CPUs"


def in_private_mount_namespace() -> None:
    """Re-exec this script as root in a private mount namespace with a tmpfs on the kubelet's
    device-plugin directory (as scripts/e2e does for the end-to-end tier), so a real kubelet
    started by the script touches no other kubelet's; returns at once when already there."""
    if os.environ.get("KUBEDEVICE_E2E_IN_NS"):
        return
    dp = "/var/lib/kubelet/device-plugins"
    os.makedirs(dp, exist_ok=True)
    env = {**os.environ, "KUBEDEVICE_E2E_IN_NS": "1"}
    script = 'mount -t tmpfs -o mode=0755 tmpfs "$1" && shift && exec "$@"'
    argv = ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", dp]
    os.execvpe("unshare", [*argv, sys.executable, *sys.argv], env)


@contextlib.contextmanager
def e2e_cluster(script: str, *, keep_logs: bool = False) -> Iterator[Any]:
    """The end-to-end tier's cluster (``tests/e2e/cluster.py``: etcd, kube-apiserver,
    kube-scheduler, kube-controller-manager, a real kubelet with kd-fakecri) for the bench
    ``script``: it needs root and re-runs itself in a private mount namespace first
    (:func:`in_private_mount_namespace`). Stopped afterwards; its logs are kept (their
    folder on stderr) when the bench fails or with ``keep_logs``."""
    if os.geteuid() != 0:
        raise SystemExit(f"{script} needs root (it runs a real kubelet)")
    in_private_mount_namespace()
    if str(ROOT / "tests") not in sys.path:
        sys.path.insert(0, str(ROOT / "tests"))
    from e2e.cluster import Cluster, find_binaries

    bin_dir = find_binaries(ROOT)
    if bin_dir is None:
        raise SystemExit("no Kubernetes binaries (see tests/e2e/README.md)")
    workdir = Path(tempfile.mkdtemp(prefix="kdb-", dir="/tmp"))
    cluster = Cluster.start(bin_dir, workdir)
    try:
        yield cluster
    except BaseException:
        cluster.stop()
        print(f"failed; logs kept in {workdir / 'logs'}", file=sys.stderr)
        raise
    cluster.stop()
    if keep_logs:
        print(f"logs in {workdir / 'logs'}", file=sys.stderr)
    else:
        shutil.rmtree(workdir, ignore_errors=True)


def pct(samples: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``samples``: the nearest rank, no interpolation."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``predicate`` until it holds (child process start-up, not what is measured)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.05)  # start-up of child processes; not part of what is measured


def spawn_ready(
    args: list[str], what: str, env: Mapping[str, str] | None = None
) -> subprocess.Popen[str]:
    """Start a child that prints ``READY`` once it serves; return it when it has."""
    proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != "READY":
        proc.kill()
        proc.wait()
        raise RuntimeError(f"{what} did not start")
    return proc


def terminate_all(procs: Iterable[subprocess.Popen[Any]]) -> None:
    """SIGTERM every process, then wait up to 10 s for each (killing one that lingers)."""
    procs = list(procs)
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def start_emulator(plugin_dir: Path, env: Mapping[str, str]) -> subprocess.Popen[str]:
    """``kubedevice kubelet`` on ``plugin_dir`` (``env`` names it), once its socket exists."""
    emu = subprocess.Popen([KUBEDEVICE, "kubelet"], env=env, stderr=subprocess.DEVNULL, text=True)
    try:
        wait_for(lambda: (plugin_dir / "kubelet.sock").is_socket(), 30, "the emulator")
    except BaseException:
        emu.kill()
        emu.wait()
        raise
    return emu


def wait_allocatable(env: Mapping[str, str], resource: str, count: int, timeout: float) -> None:
    """Block until the emulator ``env`` names shows ``count`` allocatable ``resource``."""
    subprocess.run(
        [
            KUBEDEVICE,
            "node",
            "--wait-for",
            resource,
            "--allocatable",
            str(count),
            "--timeout",
            str(timeout),
        ],
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
    )


def write_generic_config(root: Path, name: str, devices: Iterable[str]) -> Path:
    """A fake /dev tree with ``/dev/<name>/<device>`` nodes and a generic config for them.

    The resource is ``example.com/<name>``; no hardware is needed.
    """
    from kubedevice.generic import FakeHost

    host = FakeHost(root / "host")
    for device in devices:
        host.add_char_device(f"/dev/{name}/{device}")
    cfg = root / "generic.yaml"
    cfg.write_text(
        f"version: v1\ndevRoot: {host.dev_root}\nsysRoot: {host.sys_root}\n"
        f"resources:\n  - name: example.com/{name}\n    groups:\n"
        f"      - paths:\n          - path: /dev/{name}/*\n"
    )
    return cfg


async def stop_process(proc: asyncio.subprocess.Process) -> None:
    """SIGTERM ``proc`` and wait up to 10 s, then kill it."""
    if proc.returncode is None:
        proc.terminate()
        try:
            async with asyncio.timeout(10):
                await proc.wait()
        except TimeoutError:
            proc.kill()
            await proc.wait()


async def measure_idle_cpu_ms(ps: Any, seconds: float) -> float:
    """CPU milliseconds (user + system) the ``psutil.Process`` ``ps`` uses in ``seconds``."""
    cpu0 = ps.cpu_times()
    await asyncio.sleep(seconds)  # measuring idle time is the point here
    cpu1 = ps.cpu_times()
    return float(((cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)) * 1000)


def serve_bare(servicer: Any, sock: str, *, aio: bool, options: Sequence[Any] = ()) -> None:
    """Serve a generated ``DevicePluginServicer`` on ``sock``, print READY, block until killed.

    For the bare grpcio baselines the SDK is compared with (run in a child process):
    ``aio`` picks ``grpc.aio`` over grpcio's thread-pool server.
    """
    import grpc

    from kubedevice._api import dp_grpc

    if not aio:
        from concurrent import futures

        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), options=options)
        dp_grpc.add_DevicePluginServicer_to_server(servicer, server)
        server.add_insecure_port(f"unix:{sock}")
        server.start()
        print("READY", flush=True)
        server.wait_for_termination()
        return

    async def main() -> None:
        server = grpc.aio.server(options=options)
        dp_grpc.add_DevicePluginServicer_to_server(servicer, server)
        server.add_insecure_port(f"unix:{sock}")
        await server.start()
        print("READY", flush=True)
        await server.wait_for_termination()

    asyncio.run(main())


def gpu_plugin_command(root: Path) -> list[str]:
    """``kubedevice nvidia run`` on the fake 8-GPU box, with its /dev and /sys under ``root``."""
    from kubedevice.nvidia.fake import FakeNvml, write_fake_dev, write_fake_sysfs

    nvml = FakeNvml.from_file("dgx-8gpu")
    write_fake_dev(nvml, root / "dev")
    write_fake_sysfs(nvml, root / "sys")
    nvml.close()
    return [
        KUBEDEVICE,
        "nvidia",
        "run",
        "--nvml",
        "fake:dgx-8gpu",
        "--dev-root",
        str(root / "dev"),
        "--sys-root",
        str(root / "sys"),
        "--features-dir",
        str(root / "features.d"),
        "--cdi-dir",
        str(root / "cdi"),
        "--pod-resources-socket",
        str(root / "none.sock"),
    ]


def cpu_ns_and_wakeups(pid: int) -> tuple[int, int, int]:
    """(CPU ns, voluntary context switches, threads) summed over the live threads of ``pid``
    (``/proc/PID/task/*/schedstat``: nanoseconds, so short runs are not rounded to ticks)."""
    cpu = wakeups = threads = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            cpu += int((task / "schedstat").read_text().split()[0])
            for line in (task / "status").read_text().splitlines():
                if line.startswith("voluntary_ctxt_switches:"):
                    wakeups += int(line.split()[1])
            threads += 1
        except (FileNotFoundError, ProcessLookupError):
            continue
    return cpu, wakeups, threads


def memory_mb(pid: int, keys: Iterable[str] = ("Rss", "Pss")) -> dict[str, float]:
    """``smaps_rollup``'s ``keys`` of ``pid`` in MB (``rss_mb``, ``pss_mb``, ...)."""
    wanted = set(keys)
    out: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in wanted:
            out[key.lower() + "_mb"] = round(int(value.split()[0]) / 1024, 1)
    return out

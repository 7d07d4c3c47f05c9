"""End-to-end check of MPS behind the GPU DRA driver's memory shares; prints one JSON object.

Run it as ``scripts/gpu-mps-check`` as root on a machine with an NVIDIA GPU (compute mode
Default, MIG off: it changes no GPU setting), ``nvidia-ml-py``, ``nvidia-cuda-mps-control``
in the driver root and the Kubernetes binaries ``etcd``, ``kube-apiserver``, ``kubelet``,
``kd-fakecri`` and ``kube-scheduler`` in ``--k8s-bin DIR`` (or ``$KUBEDEVICE_K8S_BIN``).
It runs like ``scripts/gpu-dra-check`` (its cluster, in a private mount namespace) plus
the real scheduler, and ``kubedevice nvidia dra --mps``:

1. The first GPU is published with ``memory`` and ``compute`` capacities; no MPS control
   daemon runs yet.
2. Four claims of ``20Gi`` (less where the GPU holds less: a quarter of it) and
   ``compute: 25`` each, and a pod each: the scheduler gives all four a share of the GPU;
   the daemon runs from the first prepare, one for the four.
3. Each pod's CDI spec: the pipe directory mount, ``CUDA_MPS_PIPE_DIRECTORY``,
   ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=<its share in MiB>M`` and
   ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25``.
4. A fifth claim asking for more memory than is left stays Pending (Unschedulable).
5. Four CUDA processes at once, each with one pod's env (the pipe directory as the host
   sees it): each allocates 1 GiB blocks up to its share and gets out-of-memory past it,
   and each is still running and using its memory after the others' out-of-memory (torch,
   else the CUDA driver API through ctypes).
6. Compute: a compute-bound loop (torch matrix products) with one pod's env reaches 25 %
   (within +-10 % of that) of the throughput of the same loop with no SM limit.
7. The pods deleted: every claim unprepared, and the daemon gone after the last.

On ``--nvml fake:MACHINE`` (``one-gpu-80gib`` by default) the same flow runs on the fake NVML
and its MPS control daemon stand-in: steps 5 and 6 become a client of the stand-in that
reports the limits it was given, and the JSON's ``not_checked`` says what needs the GPU
(out-of-memory past a share, the SM percentage).

Exit status: 0 when every check passed, 1 when one failed, 2 without NVML; the JSON also goes
to ``$OUT/gpu-mps-check.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_dra_check as base  # the sibling script: its cluster and helpers

NAME = "gpu-mps-check"
DRIVER = base.DRIVER
NODE = base.NODE
NS = base.NS
RES = "/apis/resource.k8s.io/v1"
GIB = 1 << 30
PIPE = "/run/nvidia-mps"
PID_FILE = "nvidia-cuda-mps-control.pid"

# A CUDA client: 1 GiB blocks until out-of-memory (or 4 GiB past its share), then holds them
# until its stdin closes and uses them once more (it still runs beside the others' failures).
MEMORY_CHILD = r"""
import json, sys
share, step = int(sys.argv[1]), 1 << 30
blocks, err = [], None
try:
    import torch
    while len(blocks) * step < share + 4 * step:
        blocks.append(torch.empty(step, dtype=torch.uint8, device="cuda"))
    torch.cuda.synchronize()
except ImportError:
    import ctypes
    cuda = ctypes.CDLL("libcuda.so.1")
    ctx, dev = ctypes.c_void_p(), ctypes.c_int()
    assert cuda.cuInit(0) == 0 and cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
    assert cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev) == 0
    torch = None
    while len(blocks) * step < share + 4 * step:
        ptr = ctypes.c_uint64()
        rc = cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(step))
        if rc != 0:
            err = f"CUDA driver error {rc} (2 is CUDA_ERROR_OUT_OF_MEMORY)"
            break
        blocks.append(ptr)
except RuntimeError as exc:
    err = str(exc).splitlines()[0]
print(json.dumps({"allocated": len(blocks) * step, "error": err}), flush=True)
sys.stdin.read()
if torch is not None:
    for b in blocks:
        b.fill_(1)
    torch.cuda.synchronize()
print(json.dumps({"still_running": True}), flush=True)
"""

# A compute-bound loop: matrix products per second over 3 s.
COMPUTE_CHILD = r"""
import json, time, torch
a = torch.randn(4096, 4096, device="cuda")
b = torch.randn(4096, 4096, device="cuda")
for _ in range(3):
    a @ b
torch.cuda.synchronize()
n, t0 = 0, time.monotonic()
while time.monotonic() - t0 < 3.0:
    for _ in range(8):
        a @ b
    torch.cuda.synchronize()
    n += 8
print(json.dumps({"per_s": n / (time.monotonic() - t0)}), flush=True)
"""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--nvml", default="real", help="'real' or 'fake:MACHINE' to rehearse")
    parser.add_argument("--k8s-bin", default=None, help="[default: $KUBEDEVICE_K8S_BIN]")
    parser.add_argument("--deadline", type=float, default=300.0, help="give up after (s)")
    parser.add_argument("--pod-timeout", type=float, default=100.0, help="per pod (s)")
    parser.add_argument("--logs", action="store_true", help="add log tails to the JSON")
    return parser


def _scheduler(cluster: base.Cluster, option: str | None) -> base.Proc:
    """kube-scheduler beside the cluster (unpacked from ``kube-scheduler.xz`` if need be)."""
    import lzma
    import shutil

    here = cluster.bin_dir / "kube-scheduler"
    if not here.is_file():
        for d in (option, os.environ.get("KUBEDEVICE_K8S_BIN")):
            packed = Path(d or "/nonexistent").resolve() / "kube-scheduler.xz"
            if packed.is_file():
                here = cluster.work / "kube-scheduler"
                with lzma.open(packed) as src, here.open("wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
                here.chmod(0o755)
                break
        else:
            raise base.CheckError("no kube-scheduler (or kube-scheduler.xz) in --k8s-bin")
    assert cluster.admin_kubeconfig is not None
    kc = str(cluster.admin_kubeconfig)
    return cluster.proc(
        "kube-scheduler",
        [str(here), f"--kubeconfig={kc}", f"--authentication-kubeconfig={kc}",
         f"--authorization-kubeconfig={kc}", "--leader-elect=false",
         "--bind-address=127.0.0.1", f"--secure-port={base.free_port()}", "--v=1"],
    )  # fmt: skip


def _claim(name: str, cls: str, capacity: dict[str, str]) -> dict[str, Any]:
    exactly = {"deviceClassName": cls, "allocationMode": "ExactCount", "count": 1,
               "capacity": {"requests": capacity}}  # fmt: skip
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
    }


def _pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 0,
            # no node controller lifts the kubelet's not-ready taint in this cluster
            "tolerations": [{"operator": "Exists"}],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
            "containers": [
                {"name": "cuda", "image": "registry.k8s.io/pause:3.10",
                 "resources": {"claims": [{"name": "gpu"}]}}
            ],
        },
    }  # fmt: skip


def _daemon(root: Path) -> int | None:
    """The pid of the live control daemon under the driver's MPS root, if any."""
    from kubedevice.nvidia.mps import running_daemons

    return next(iter(running_daemons(root)), None)


def _edits(cdi_dir: Path, claim_uid: str) -> dict[str, Any]:
    for spec in base.cdi_specs(cdi_dir).values():
        for d in spec.get("devices") or []:
            if d["name"].startswith(claim_uid):
                return dict(d.get("containerEdits") or {})
    return {}


def _client_env(edits: dict[str, Any]) -> dict[str, str]:
    """A host process's env as the pod's container has it (the pipe dir as the host sees it)."""
    env = dict(e.split("=", 1) for e in edits.get("env") or [])
    for m in edits.get("mounts") or []:
        if m["containerPath"] == env.get("CUDA_MPS_PIPE_DIRECTORY"):
            env["CUDA_MPS_PIPE_DIRECTORY"] = m["hostPath"]
    return {**os.environ, **env}


def run_check(args: argparse.Namespace, work: Path, report: base.Report) -> None:
    nvml: str = args.nvml
    fake = nvml.startswith("fake:")
    base.preflight()
    gpus = base.fake_gpus(nvml, work) if fake else base.real_gpus()
    gpu = gpus[0]
    cluster = base.Cluster(base.find_binaries(args.k8s_bin, work), work)
    cdi_dir = work / "cdi"
    root = cluster.kubelet_root / "plugins" / DRIVER / "mps"
    driver: base.Proc | None = None
    try:
        cluster.start()
        api = cluster.api
        assert api is not None
        assert cluster.admin_kubeconfig is not None
        scheduler = _scheduler(cluster, args.k8s_bin)
        argv = [sys.executable, "-m", "kubedevice", "--log-level", "debug", "nvidia", "dra",
                "--mps", "--nvml", nvml, "--driver-name", DRIVER, "--node-name", NODE,
                "--kubelet-dir", str(cluster.kubelet_root), "--cdi-dir", str(cdi_dir),
                "--kubeconfig", str(cluster.admin_kubeconfig)]  # fmt: skip
        if fake:
            argv += ["--dev-root", str(work / "dev"), "--sys-root", str(work / "sys")]
        t0 = time.monotonic()
        driver = cluster.proc("driver", argv, env=dict(os.environ))
        procs = [driver, scheduler]

        def published(slices: dict[str, Any]) -> dict[str, Any] | None:
            driver.check()
            for s in slices.values():
                for d in (s.get("spec") or {}).get("devices") or []:
                    if d["name"] == f"gpu-{gpu.minor}":
                        return dict(d)
            return None

        device = api.wait(f"{RES}/resourceslices", published, base.STEP_S, "the GPU published")
        report.time("driver_start_to_slice", t0)
        capacity = device.get("capacity") or {}
        policy = (capacity.get("memory") or {}).get("requestPolicy") or {}
        most = base.quantity((policy.get("validRange") or {}).get("max", "")) or 0
        report.check("published_with_memory_and_compute", "compute" in capacity and most > 0,
                     {"capacity": sorted(capacity), "memory_max": most})  # fmt: skip
        report.check("no_daemon_before_the_first_share", _daemon(root) is None, str(root))
        base.poll("the kubelet to register the driver",
                  lambda: base.REGISTERED in driver.log.read_text(errors="replace"),
                  base.STEP_S, procs)  # fmt: skip
        share = min(20 * GIB, most // 4 // GIB * GIB)
        report.facts["share_bytes"] = share
        api.call("POST", f"{RES}/deviceclasses", {
            "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": NAME},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
        })  # fmt: skip
        pods = [f"share-{i}" for i in range(1, 5)]
        uids = {}
        pids = set()
        for pod in pods:  # one at a time: the scheduler's view of the shares settles
            memory = f"{share // GIB}Gi"
            made = api.call("POST", f"{RES}/namespaces/{NS}/resourceclaims",
                            _claim(pod, NAME, {"memory": memory, "compute": "25"}))  # fmt: skip
            uids[pod] = made["metadata"]["uid"]
            api.call("POST", f"/api/v1/namespaces/{NS}/pods", _pod(pod))
            api.wait(
                f"/api/v1/namespaces/{NS}/pods?fieldSelector=metadata.name%3D{pod}",
                lambda ps, p=pod: (ps.get(p) or {}).get("status", {}).get("phase") == "Running",
                args.pod_timeout,
                f"{pod} Running",
            )
            pids.add(_daemon(root))
        report.check("four_shares_running", True, pods)
        report.check("one_daemon_from_the_first_prepare", len(pids) == 1 and None not in pids,
                     sorted(map(str, pids)))  # fmt: skip
        envs = {}
        for pod in pods:
            edits = _edits(cdi_dir, uids[pod])
            env = dict(e.split("=", 1) for e in edits.get("env") or [])
            mounts = {m["containerPath"]: m["hostPath"] for m in edits.get("mounts") or []}
            want = {"CUDA_MPS_PIPE_DIRECTORY": PIPE,
                    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={share >> 20}M",
                    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25"}  # fmt: skip
            got = {k: env.get(k) for k in want}
            report.check(f"{pod}.env", got == want, got)
            report.check(f"{pod}.pipe_dir_mounted", Path(mounts.get(PIPE, "/nonexistent"),
                         PID_FILE).is_file(), mounts.get(PIPE))  # fmt: skip
            envs[pod] = _client_env(edits)
        # 4. a fifth claim asking for more than is left waits
        left = most - 4 * share
        api.call("POST", f"{RES}/namespaces/{NS}/resourceclaims",
                 _claim("fifth", NAME, {"memory": f"{(left + GIB) // GIB}Gi"}))  # fmt: skip
        api.call("POST", f"/api/v1/namespaces/{NS}/pods", _pod("fifth"))

        def unschedulable(ps: dict[str, Any]) -> bool:
            conds = (ps.get("fifth") or {}).get("status", {}).get("conditions") or []
            return any(c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable"
                       for c in conds)  # fmt: skip

        api.wait(f"/api/v1/namespaces/{NS}/pods?fieldSelector=metadata.name%3Dfifth",
                 unschedulable, base.STEP_S, "the fifth pod Unschedulable")  # fmt: skip
        report.check("fifth_claim_pending", True, {"asked_gib": (left + GIB) // GIB})
        # 5 and 6: the processes
        if fake:
            _fake_clients(report, envs, share)
        else:
            _memory(report, envs, share)
            _compute(report, envs[pods[0]], root)
        # 7. every pod deleted: unprepared, the daemon gone
        for pod in [*pods, "fifth"]:
            api.call("DELETE", f"/api/v1/namespaces/{NS}/pods/{pod}")
        base.poll("every claim unprepared", lambda: not base.cdi_specs(cdi_dir), base.STEP_S,
                  procs)  # fmt: skip
        base.poll("the daemon gone", lambda: _daemon(root) is None, base.STEP_S, procs)
        report.check("daemon_gone_after_the_last_pod", True, str(root))
        report.check("driver_clean_exit", driver.stop() == 0, "SIGTERM")
    finally:
        if driver is not None and driver.alive():
            driver.stop()
        if args.logs or not all(c["ok"] for c in report.checks):
            shown = ("driver", "kubelet", "kube-scheduler")
            report.facts["logs"] = {
                p.name: base.tail(p.log, 25) for p in cluster.procs if p.name in shown
            }
        cluster.stop()


def _fake_clients(report: base.Report, envs: dict[str, dict[str, str]], share: int) -> None:
    """The fake: each pod's env as a client of the stand-in, which reports what it got."""
    stand_in = Path(base.ROOT, "src/kubedevice/nvidia/fake/mps.py")
    for pod, env in envs.items():
        out = subprocess.run([sys.executable, "-S", str(stand_in), "client"], env=env,
                             capture_output=True, text=True, timeout=30, check=False)  # fmt: skip
        got = json.loads(out.stdout or "{}")
        report.check(f"{pod}.client_limits_seen_by_the_daemon",
                     got.get("pinnedMemLimit") == f"0={share >> 20}M"
                     and got.get("activeThreadPercentage") == "25", got)  # fmt: skip
    report.facts["not_checked"] = [
        "out-of-memory past each share (needs a real GPU and MPS server)",
        "the others keep running after one's out-of-memory (needs a real GPU)",
        "the SM percentage's throughput within +-10 % (needs a real GPU and torch)",
    ]


def _memory(report: base.Report, envs: dict[str, dict[str, str]], share: int) -> None:
    """Four clients at once: each up to its share, out-of-memory past it, all still running."""
    procs = {
        pod: subprocess.Popen([sys.executable, "-c", MEMORY_CHILD, str(share)], env=env,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for pod, env in envs.items()
    }  # fmt: skip
    first = {pod: json.loads(p.stdout.readline() or "{}") for pod, p in procs.items() if p.stdout}
    for p in procs.values():
        if p.stdin:
            p.stdin.close()
    later = {pod: json.loads(p.stdout.readline() or "{}") for pod, p in procs.items() if p.stdout}
    for p in procs.values():
        p.wait(timeout=60)
    for pod, got in first.items():
        allocated, error = got.get("allocated", 0), got.get("error") or ""
        oom = "out of memory" in error.lower() or "error 2 " in error
        report.check(f"{pod}.allocates_up_to_its_share", share - 3 * GIB <= allocated <= share,
                     got)  # fmt: skip
        report.check(f"{pod}.out_of_memory_past_its_share", oom, got)
        report.check(f"{pod}.still_running_beside_the_others",
                     later[pod].get("still_running") is True, later[pod])  # fmt: skip


def _compute(report: base.Report, env: dict[str, str], root: Path) -> None:
    """The loop at 25 % of the SMs against the same loop with no limit (same daemon)."""
    probe = subprocess.run([sys.executable, "-c", "import torch"], capture_output=True,
                           check=False)  # fmt: skip
    if probe.returncode != 0:
        report.facts["not_checked"] = ["the SM percentage: torch is not importable"]
        return
    free = {k: v for k, v in env.items() if k != "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"}
    rates = {}
    for name, e in (("limited_25", env), ("unlimited", free)):
        out = subprocess.run([sys.executable, "-c", COMPUTE_CHILD], env=e, capture_output=True,
                             text=True, timeout=120, check=False)  # fmt: skip
        rates[name] = json.loads(out.stdout or "{}").get("per_s", 0.0)
    ratio = rates["limited_25"] / rates["unlimited"] if rates["unlimited"] else 0.0
    report.check("sm_percentage_within_10_percent", 0.9 * 0.25 <= ratio <= 1.1 * 0.25,
                 {"rates": rates, "ratio": round(ratio, 3), "share": 0.25})  # fmt: skip


THIS = base.Script(NAME, __file__, _parser, run_check)

if __name__ == "__main__":
    base.main(script=THIS)

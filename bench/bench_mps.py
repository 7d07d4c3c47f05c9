"""MPS behind GPU memory shares (``dra.mps``): what the MPS control daemon costs the prepare.

The GPU DRA driver's hooks in this process (``GpuDraDriver.prepare`` / ``unprepare`` /
``restore``, as the kit calls them; the gRPC and checkpoint overhead of a call is in
``bench/bench_shares.py``) on the fake machine ``one-gpu-80gib`` with the fake's MPS control
daemon stand-in, a real process started with ``-d`` and stopped with ``quit`` as
``nvidia-cuda-mps-control`` is (so the figures are the driver's side: fork, exec, pid file,
pidfd; a real daemon's own start-up, 75 ms on an H200, comes on top):

* ``first_share_prepare``: the GPU's first share, the daemon started (``--rounds`` times);
* ``further_share_prepare``: a share beside a running daemon;
* ``last_unprepare``: the GPU's last share unprepared, the daemon stopped;
* ``restart_with_4_shares``: a new driver taking over 4 prepared shares (``restore`` and the
  first device list): the daemon adopted, its pid unchanged.

With ``--host-cgroup-root /sys/fs/cgroup`` (root, on a host whose cgroups can be written)
each daemon is also moved into a cgroup of its own, as the chart's DaemonSets do so that it
outlives the driver's container; ``own_cgroup`` says whether it was.

Usage: ``python bench/bench_mps.py [--rounds 20] [--host-cgroup-root DIR]``. Prints one
JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import cpu_model, pct

from kubedevice.dra import AllocatedDevice, Claim, ClaimRef
from kubedevice.dra.model.types import PreparedClaim
from kubedevice.nvidia import hostcgroup
from kubedevice.nvidia.config import Config
from kubedevice.nvidia.dra import GpuDraDriver
from kubedevice.nvidia.fake import FakeNvml, write_fake_dev, write_fake_sysfs

MACHINE = "one-gpu-80gib"


def _claim(uid: str) -> Claim:
    share = AllocatedDevice(
        request="gpu", pool="node", name="gpu-0", device=None, share_id=f"s-{uid}",
        consumed_capacity={"memory": "20Gi", "compute": "25"},
    )  # fmt: skip
    return Claim(ref=ClaimRef("default", f"c-{uid}", uid), devices=(share,))


async def _prepare(driver: GpuDraDriver, uid: str) -> tuple[PreparedClaim, float]:
    claim = _claim(uid)
    t = time.perf_counter()
    prepared = await driver.prepare(claim)
    took = time.perf_counter() - t
    held = PreparedClaim(
        claim.ref,
        devices=(("gpu", "node", "gpu-0"),),
        share_ids=(f"s-{uid}",),
        data=tuple(dict(p.data) for p in prepared),
    )
    return held, took


async def bench(rounds: int, cgroups: str | None = None) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="kd-bm-", dir="/tmp"))
    nvml = FakeNvml.from_file(MACHINE)
    write_fake_dev(nvml, work / "dev")
    write_fake_sysfs(nvml, work / "sys")
    config = Config(version="v1").with_overrides(
        dev_root=str(work / "dev"), sys_root=str(work / "sys"), host_cgroup_root=cgroups
    )
    config = config.with_mps()
    root = work / "mps"
    first, further, last = [], [], []
    try:
        driver = GpuDraDriver(config, nvml, mps_root=root)
        gen = driver.devices()
        await anext(gen)
        assert driver.mps is not None
        uuid = driver.gpu_devices[0].gpu.uuid
        for i in range(rounds):
            a, t_first = await _prepare(driver, f"a{i}")
            b, t_further = await _prepare(driver, f"b{i}")
            first.append(t_first)
            further.append(t_further)
            await driver.unprepare(a)
            t = time.perf_counter()
            await driver.unprepare(b)
            last.append(time.perf_counter() - t)
            assert driver.mps.pid(uuid) is None
        held = [(await _prepare(driver, f"h{i}"))[0] for i in range(4)]
        pid = driver.mps.pid(uuid)
        assert pid is not None
        own = hostcgroup.member(pid, driver.mps.cgroup(uuid))
        await gen.aclose()
        t = time.perf_counter()
        second = GpuDraDriver(config, nvml, mps_root=root)
        await second.restore(held)
        gen = second.devices()
        await anext(gen)
        restart = time.perf_counter() - t
        assert second.mps is not None
        adopted = second.mps.pid(uuid)
        for claim in held:
            await second.unprepare(claim)
        await gen.aclose()
    finally:
        nvml.close()
        shutil.rmtree(work, ignore_errors=True)

    def ms(samples: list[float]) -> dict[str, float]:
        return {
            "p50_ms": round(pct(samples, 0.5) * 1000, 2),
            "p90_ms": round(pct(samples, 0.9) * 1000, 2),
            "max_ms": round(max(samples) * 1000, 2),
        }

    return {
        "machine": f"{cpu_model()}, {platform.python_implementation()} {platform.python_version()}",
        "gpu": f"fake {MACHINE}, the fake's MPS control daemon stand-in",
        "rounds": rounds,
        "host_cgroup_root": cgroups,
        "own_cgroup": own,
        "first_share_prepare": ms(first),
        "further_share_prepare": ms(further),
        "last_unprepare": ms(last),
        "restart_with_4_shares": {
            "ms": round(restart * 1000, 2),
            "daemon_pid_before": pid,
            "daemon_pid_after": adopted,
            "pid_unchanged": pid == adopted,
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--host-cgroup-root", default=None, metavar="DIR")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(bench(args.rounds, args.host_cgroup_root)), indent=2))
    sys.stdout.flush()


if __name__ == "__main__":
    main()

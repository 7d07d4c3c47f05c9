"""A hook that never returns, in a driver run as a real process: a SIGTERM ends the process
once the stop grace is over (the claims lock goes with it), whether the hook is a plain
``def`` in its thread or an ``async def`` on the loop."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import grpc
import pytest

import kubedevice.dra as dra
from dra import clients
from dra.api import Api
from dra.conftest import create_claim, result
from dra.fakes import DRIVER, FakeDriver, gpus, server, wait_for_path

pytestmark = pytest.mark.timeout(60)

TESTS = Path(__file__).resolve().parents[1]
GRACE = 0.5


@pytest.mark.parametrize("stuck", ["sync", "async"])
async def test_a_sigterm_ends_the_driver_soon_after_the_grace_with_a_hook_stuck(
    kdir: Path, kubeconfig: Path, node_name: str, api: Api, stuck: str
) -> None:
    claim = create_claim(
        api,
        "default",
        f"stuck-{stuck}-{node_name}",
        results=[result("gpu", DRIVER, node_name, "gpu-0")],
    )
    ref = ("default", claim["metadata"]["name"], claim["metadata"]["uid"])
    state = kdir / "state"
    argv = [
        sys.executable, "-m", "dra.stuck_driver", "--state", str(state), "--stuck", stuck,
        "--node-name", node_name, "--kubeconfig", str(kubeconfig), "--kubelet-dir", str(kdir),
        "--cdi-dir", str(kdir / "cdi"), "--no-health", "--stop-grace", str(GRACE),
    ]  # fmt: skip
    (kdir / "plugins" / DRIVER).mkdir(parents=True, exist_ok=True)
    with (kdir / "driver.log").open("w") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=TESTS)
    try:
        await wait_for_path(kdir / "plugins_registry" / f"{DRIVER}-reg.sock", timeout=30)
        sock = kdir / "plugins" / DRIVER / "dra.sock"
        call = asyncio.ensure_future(clients.prepare(sock, [ref], timeout=1))
        await wait_for_path(state / "entered")
        with pytest.raises(grpc.aio.AioRpcError):
            await call
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        try:
            code = await asyncio.to_thread(proc.wait, 10)
        except subprocess.TimeoutExpired:
            code = None
        took = time.monotonic() - sent
        print(f"\n{stuck} hook stuck: SIGTERM -> exit {code} in {took:.2f} s")
        assert code is not None, f"still running 10 s after SIGTERM ({stuck} hook stuck)"
        assert took < GRACE + 3
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    print((kdir / "driver.log").read_text()[-1500:])


class _StuckSome(FakeDriver):
    """Plain-``def`` hooks; the prepare of a claim named ``stuck-*`` waits at ``gate``."""

    def __init__(self, devices: Sequence[dra.Device]) -> None:
        super().__init__(devices)
        self.gate = threading.Event()
        self.entered = 0
        self._count = threading.Lock()

    def prepare(self, claim: dra.Claim) -> Sequence[dra.PreparedDevice]:  # type: ignore[override]
        if claim.ref.name.startswith("stuck-"):
            with self._count:
                self.entered += 1
            self.gate.wait(60)
        return [
            dra.PreparedDevice(d, d.device.edits if d.device else None, {}) for d in claim.devices
        ]

    def unprepare(self, claim: dra.PreparedClaim) -> None:  # type: ignore[override]
        pass


async def test_hooks_stuck_in_their_threads_do_not_hold_the_other_claims(
    kdir: Path, kubeconfig: Path, node_name: str, api: Api
) -> None:
    """As many stuck plain-``def`` hooks as the loop's default executor has threads (six on
    two cores): another claim is still prepared (its checkpoint write waited behind them)."""
    stuck = min(32, (os.cpu_count() or 1) + 4)
    driver = _StuckSome(gpus(stuck + 1))
    refs = []
    for i in range(stuck + 1):
        name = f"{'stuck' if i < stuck else 'free'}-{i}-{node_name}"
        claim = create_claim(
            api, "default", name, results=[result("gpu", DRIVER, node_name, f"gpu-{i}")]
        )
        refs.append(("default", name, claim["metadata"]["uid"]))
    async with server(driver, kdir, kubeconfig, node_name) as srv:
        sock = srv.settings.dra_socket
        try:
            calls = [
                asyncio.ensure_future(clients.prepare(sock, [r], timeout=1)) for r in refs[:-1]
            ]
            await asyncio.wait(calls)
            assert driver.entered == stuck
            started = time.monotonic()
            answer = await clients.prepare(sock, [refs[-1]], timeout=5)
            took = time.monotonic() - started
            print(f"\n{stuck} hooks stuck: another claim prepared in {took:.3f} s")
            assert answer.claims[refs[-1][2]].error == ""
        finally:
            driver.gate.set()

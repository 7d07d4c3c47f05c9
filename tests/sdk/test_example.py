"""examples/minimal.py as a real subprocess: registers, allocates, exits 0 on SIGTERM."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

import grpc
from kubelet_double import KubeletDouble

from kubedevice._api import dp, dp_grpc

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "minimal.py"


async def test_minimal_example_runs_and_stops_on_sigterm(
    sock_dir: Path, kubelet: KubeletDouble
) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(EXAMPLE),
        "--device-plugin-dir",
        str(sock_dir),
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        (reg,) = await kubelet.wait_registrations(1, timeout=30)
        assert reg.request.resource_name == "example.com/counter"
        assert [i for i, _ in reg.first_list] == [f"counter-{i}" for i in range(4)]
        sock = sock_dir / reg.request.endpoint
        async with grpc.aio.insecure_channel(f"unix://{sock}") as channel:
            req = dp.AllocateRequest()
            req.container_requests.add(devices_ids=["counter-1", "counter-3"])
            resp = await dp_grpc.DevicePluginStub(channel).Allocate(req)
        assert dict(resp.container_responses[0].envs) == {"COUNTER": "1,3"}
        # The double records the Register before the plugin reads the reply: wait for the
        # plugin to say it is registered, so that SIGTERM does not race it.
        seen = b""
        assert proc.stderr is not None
        while b"registered with the kubelet" not in seen:
            line = await asyncio.wait_for(proc.stderr.readline(), 30)
            assert line, seen.decode()
            seen += line
        proc.send_signal(signal.SIGTERM)
        _, stderr = await asyncio.wait_for(proc.communicate(), 30)
        assert proc.returncode == 0, (seen + stderr).decode()
        assert not sock.exists()
        assert b"stopped" in stderr
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_minimal_example_uses_env_dir(sock_dir: Path, kubelet: KubeletDouble) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(EXAMPLE),
        env={
            "DP_DEVICE_PLUGIN_DIR": str(sock_dir),
            "PATH": "/usr/bin:/bin",
            "PYTHONFAULTHANDLER": "1",
        },
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        await kubelet.wait_registrations(1, timeout=30)
        proc.send_signal(signal.SIGINT)
        try:
            _, err = await asyncio.wait_for(proc.communicate(), 10)
        except TimeoutError:
            proc.send_signal(signal.SIGABRT)  # PYTHONFAULTHANDLER dumps the stacks
            _, err = await proc.communicate()
            raise AssertionError(f"did not stop on SIGINT: {err.decode()}") from None
        assert proc.returncode == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()

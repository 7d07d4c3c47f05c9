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


async def _lines_until(stream: asyncio.StreamReader, needle: str, seen: list[str]) -> None:
    while not any(needle in line for line in seen):
        line = await asyncio.wait_for(stream.readline(), 30)
        assert line, "".join(seen)
        seen.append(line.decode())


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
        seen: list[str] = []
        assert proc.stderr is not None
        await _lines_until(proc.stderr, "registered with the kubelet", seen)
        proc.send_signal(signal.SIGTERM)
        _, stderr = await asyncio.wait_for(proc.communicate(), 30)
        assert proc.returncode == 0, "".join(seen) + stderr.decode()
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


ALL_HOOKS = EXAMPLE.parent / "all_hooks.py"


async def test_all_hooks_example_json_logs_of_the_whole_process(
    sock_dir: Path, kubelet: KubeletDouble
) -> None:
    """examples/all_hooks.py: its own option, every hook, and its own logger in JSON."""
    import json
    import os

    env = {**os.environ, "KUBEDEVICE_LOG_FORMAT": "json", "KUBEDEVICE_LOG_LEVEL": "info"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(ALL_HOOKS),
        "--device-plugin-dir",
        str(sock_dir),
        "--count",
        "3",
        env=env,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stderr is not None
    seen: list[str] = []
    try:
        (reg,) = await kubelet.wait_registrations(1, timeout=30)
        assert reg.request.resource_name == "example.com/gadget"
        assert [i for i, _ in reg.first_list] == ["gadget-0", "gadget-1", "gadget-2"]
        assert reg.options.pre_start_required
        assert reg.options.get_preferred_allocation_available
        sock = sock_dir / reg.request.endpoint
        async with grpc.aio.insecure_channel(f"unix://{sock}") as channel:
            stub = dp_grpc.DevicePluginStub(channel)
            req = dp.AllocateRequest()
            req.container_requests.add(devices_ids=["gadget-0", "gadget-2"])
            resp = (await stub.Allocate(req)).container_responses[0]
            pref = dp.PreferredAllocationRequest()
            pref.container_requests.add(
                available_deviceIDs=["gadget-0", "gadget-1", "gadget-2"],
                must_include_deviceIDs=["gadget-1"],
                allocation_size=2,
            )
            chosen = (await stub.GetPreferredAllocation(pref)).container_responses[0]
            await stub.PreStartContainer(dp.PreStartContainerRequest(devices_ids=["gadget-1"]))
        # Several devices: values of one key joined with "," in request order, each once.
        assert dict(resp.envs) == {"GADGET": "0,2", "GADGET_DRIVER": "v2", "GADGET_COUNT": "2"}
        assert dict(resp.annotations) == {"example.com/gadgets": "gadget-0,gadget-2"}
        assert [d.container_path for d in resp.devices] == ["/dev/gadget0", "/dev/gadget2"]
        assert chosen.deviceIDs[0] == "gadget-1"
        assert len(chosen.deviceIDs) == 2
        await _lines_until(proc.stderr, "preparing gadget-1", seen)
        records = [json.loads(line) for line in seen]  # every line is JSON
        ours = [(r["logger"], r["msg"]) for r in records if r["logger"] == "gadget"]
        assert ours == [("gadget", "offering 3 gadgets"), ("gadget", "preparing gadget-1")]
        assert any(r["logger"].startswith("kubedevice.") for r in records)
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.communicate(), 30)
        assert proc.returncode == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_all_hooks_example_help_and_a_bad_environment() -> None:
    import os

    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(ALL_HOOKS), "--help", stdout=asyncio.subprocess.PIPE
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 30)
    text = out.decode()
    assert proc.returncode == 0
    for word in (
        "--count",
        "KUBEDEVICE_LOG_LEVEL",
        "KUBEDEVICE_LOG_FORMAT",
        "DP_DEVICE_PLUGIN_DIR",
    ):
        assert word in text
    env = {**os.environ, "KUBEDEVICE_LOG_LEVEL": "loud"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(ALL_HOOKS), env=env, stderr=asyncio.subprocess.PIPE
    )
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 2
    assert err.decode().strip().splitlines()[-1] == (
        "error: KUBEDEVICE_LOG_LEVEL='loud' is not one of debug, info, warning, error"
    )

"""Hostile requests over a real socket: huge ID lists, bytes that are not protobuf."""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from kubelet_double import KubeletDouble
from sdk_helpers import StaticPlugin

import kubedevice
from kubedevice._api import dp, dp_grpc

RES = "example.com/dev"


class _PreStart(StaticPlugin):
    async def pre_start(self, devices: object) -> None:
        return None


async def test_allocate_with_many_unknown_ids_lists_only_the_first_ones(
    kubelet: KubeletDouble,
    server: kubedevice.PluginServer,
    stub_for: Callable[[str], dp_grpc.DevicePluginStub],
    caplog: pytest.LogCaptureFixture,
) -> None:
    await server.add(_PreStart([kubedevice.Device(id="d0")]))
    await server.wait_registered(RES, timeout=10)
    stub = stub_for(RES)
    ids = [f"unknown-device-{i:06d}" for i in range(100_000)]
    req = dp.AllocateRequest()
    req.container_requests.add(devices_ids=ids)
    caplog.set_level(logging.WARNING, logger="kubedevice")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Allocate(req)
    assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT  # not RESOURCE_EXHAUSTED
    details = err.value.details() or ""
    assert "unknown device IDs (first 20 of 100000): 'unknown-device-000000'," in details
    assert "'unknown-device-000019'" in details
    assert "'unknown-device-000020'" not in details
    assert len(details) < 1000
    assert max(len(r.getMessage()) for r in caplog.records) < 1000
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.PreStartContainer(dp.PreStartContainerRequest(devices_ids=ids))
    assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "(first 20 of 100000)" in (err.value.details() or "")
    # A short list is still given whole.
    req = dp.AllocateRequest()
    req.container_requests.add(devices_ids=["x", "y"])
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Allocate(req)
    assert err.value.details() == "container request 0 names unknown device IDs: 'x', 'y'"


_METHODS = [
    ("GetDevicePluginOptions", False),
    ("ListAndWatch", True),
    ("Allocate", False),
    ("GetPreferredAllocation", False),
    ("PreStartContainer", False),
]


async def _call(channel: grpc.aio.Channel, path: str, data: bytes, *, streaming: bool) -> None:
    if streaming:
        async for _ in channel.unary_stream(path)(data, timeout=10):
            pass
    else:
        await channel.unary_unary(path)(data, timeout=10)


@pytest.mark.parametrize(("method", "streaming"), _METHODS)
async def test_a_request_that_is_not_protobuf_is_invalid_argument(
    kubelet: KubeletDouble, server: kubedevice.PluginServer, method: str, streaming: bool
) -> None:
    plugin = _PreStart([kubedevice.Device(id="d0")])
    plugin.advertise_preferred_allocation = True  # type: ignore[misc]
    await server.add(plugin)
    await server.wait_registered(RES, timeout=10)
    path = f"/v1beta1.DevicePlugin/{method}"
    garbage = b"\x0a\xff"  # field 1, length-delimited, with a truncated length
    async with grpc.aio.insecure_channel(f"unix://{server.socket_path(RES)}") as channel:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await _call(channel, path, garbage, streaming=streaming)
        assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT, err.value
        assert "not a valid" in (err.value.details() or "")
        # The daemon stays up: a well-formed call on the same channel still works.
        opts = await dp_grpc.DevicePluginStub(channel).GetDevicePluginOptions(dp.Empty())
    assert opts.pre_start_required


EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "minimal.py"


@pytest.mark.parametrize("address", ["127.0.0.1:99999", "127.0.0.1:-1", "nonsense", "[::1]:x"])
async def test_bad_metrics_address_exits_2_with_one_line(sock_dir: Path, address: str) -> None:
    with pytest.raises(kubedevice.ConfigError, match="metrics address"):
        kubedevice.PluginServer(sock_dir, metrics_address=address)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(EXAMPLE),
        "--device-plugin-dir",
        str(sock_dir),
        "--metrics-address",
        address,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    text = err.decode()
    assert proc.returncode == 2, text
    assert "Traceback" not in text
    assert "metrics address" in text
    assert address in text
    assert list(sock_dir.iterdir()) == []

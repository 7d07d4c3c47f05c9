"""Dial device plugin sockets read-only: live or stale, and the plugin's options; bounded.

Each socket is first connected to plainly (a refused connection means a stale socket file,
nothing listening), then asked ``GetDevicePluginOptions``, within one deadline. Nothing is
sent that changes a plugin's state: no Allocate, no PreStartContainer, no Register.

A ``ListAndWatch`` stream is opened only when asked (``stream=True``): plugins built on the
upstream Go stub (``pkg/kubelet/cm/devicemanager/plugin/v1beta1``), NVIDIA's among them, feed
every stream from one shared update channel and never end a stream whose client went away,
so a stream of ours left behind takes every other update meant for the kubelet's stream.
"""

from __future__ import annotations

import asyncio
import errno
import socket
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc import aio

from kubedevice._api import HEALTHY, KUBELET_MAX_RECV_MESSAGE_BYTES, dp, dp_grpc

__all__ = ["DeviceInfo", "PluginProbe", "bounded", "numa_counts", "probe_socket", "unix_state"]


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """One device from the plugin's first ListAndWatch message."""

    id: str
    health: str
    numa: tuple[int, ...]


@dataclass(slots=True)
class PluginProbe:
    """What one plugin socket answered (or why it did not)."""

    socket: str  # base name in the device plugin dir
    #: ok | stale (nothing listening) | no-answer (accepts, never replies) | error
    state: str
    detail: str = ""
    pre_start_required: bool | None = None
    get_preferred_allocation_available: bool | None = None
    #: The first ListAndWatch list; ``None`` when no stream was opened (the default).
    devices: list[DeviceInfo] | None = None
    seconds: float = 0.0
    #: The resource this socket serves, inferred from the kubelet's view (sockets carry no name).
    resource: str | None = None

    @property
    def health(self) -> Counter[str]:
        """Device count per health string."""
        return Counter(d.health for d in self.devices or ())

    @property
    def unhealthy(self) -> list[str]:
        """IDs of devices that are not ``Healthy``."""
        return [d.id for d in self.devices or () if d.health != HEALTHY]

    @property
    def numa(self) -> dict[str, int]:
        """Device count per NUMA node ("none" for devices without topology)."""
        return numa_counts(d.numa for d in self.devices or ())


def numa_counts(nodes_per_device: Iterable[tuple[int, ...]]) -> dict[str, int]:
    """Device count per NUMA node ("none" for a device without topology), sorted."""
    counts: Counter[str] = Counter()
    for nodes in nodes_per_device:
        for node in nodes or ("none",):
            counts[str(node)] += 1
    return dict(sorted(counts.items()))


def _connect_state(path: str) -> tuple[str, str]:
    """Plain connect (blocking, on a worker thread): ok, stale or error with a reason."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(1.0)
    try:
        s.connect(path)
    except ConnectionRefusedError:
        return "stale", "nothing is listening: a stale socket file (its process is gone)"
    except PermissionError:
        return "error", "permission denied (run as root, like the kubelet)"
    except BlockingIOError:  # a Unix socket with a timeout answers EAGAIN at once
        return "no-answer", "its accept backlog is full: it does not accept connections"
    except TimeoutError:
        return "no-answer", "connect timed out (backlog full?)"
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return "error", "the socket file disappeared"
        return "error", f"cannot connect: {exc.strerror or exc}"
    finally:
        s.close()
    return "ok", ""


async def unix_state(path: Path) -> tuple[str, str]:
    """Whether ``path`` accepts connections (``ok``), refuses them (``stale``), or fails."""
    return await asyncio.to_thread(_connect_state, str(path))


async def probe_socket(path: Path, timeout: float, *, stream: bool = False) -> PluginProbe:  # noqa: ASYNC109
    """Probe one plugin socket; never takes (much) longer than ``timeout`` seconds.

    ``stream``: also read the first ListAndWatch message (see the module's note on why
    this is off by default).
    """
    start = time.monotonic()
    result = PluginProbe(socket=path.name, state="ok")
    state, detail = await unix_state(path)
    if state != "ok":
        result.state, result.detail = state, detail
        result.seconds = time.monotonic() - start
        return result
    deadline = start + timeout
    options = [
        ("grpc.max_receive_message_length", KUBELET_MAX_RECV_MESSAGE_BYTES),
        ("grpc.enable_retries", 0),
    ]
    stage = "GetDevicePluginOptions"
    try:
        async with aio.insecure_channel(f"unix://{path}", options=options) as channel:
            stub = dp_grpc.DevicePluginStub(channel)
            opts = await stub.GetDevicePluginOptions(
                dp.Empty(), timeout=max(0.01, deadline - time.monotonic())
            )
            result.pre_start_required = opts.pre_start_required
            result.get_preferred_allocation_available = opts.get_preferred_allocation_available
            if not stream:
                result.seconds = time.monotonic() - start
                return result
            stage = "ListAndWatch"
            call = stub.ListAndWatch(dp.Empty(), timeout=max(0.01, deadline - time.monotonic()))
            try:
                first = await call.read()
            finally:
                call.cancel()
            if first is aio.EOF:
                result.state, result.detail = "error", "ListAndWatch ended without a message"
            else:
                assert isinstance(first, dp.ListAndWatchResponse)
                result.devices = [
                    DeviceInfo(
                        d.ID,
                        d.health,
                        tuple(n.ID for n in d.topology.nodes) if d.HasField("topology") else (),
                    )
                    for d in first.devices
                ]
    except aio.AioRpcError as exc:
        code = exc.code()
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            result.state = "no-answer"
            result.detail = f"accepts connections but {stage} got no answer within {timeout:g} s"
        elif code == grpc.StatusCode.RESOURCE_EXHAUSTED:
            result.state = "error"
            result.detail = f"{stage}: message larger than the kubelet's 4 MiB limit"
        else:
            result.state = "error"
            result.detail = f"{stage}: {code.name}: {exc.details() or ''}".rstrip(": ")
    except Exception as exc:  # a broken peer must not stop the other probes
        result.state, result.detail = "error", f"{stage}: {type(exc).__name__}: {exc}"
    result.seconds = time.monotonic() - start
    return result


async def bounded(limit_s: float, path: Path, *, stream: bool = False) -> PluginProbe:
    """``probe_socket`` with a hard outer bound (a last guard against any hang)."""
    try:
        async with asyncio.timeout(limit_s + 1.0):
            return await probe_socket(path, limit_s, stream=stream)
    except TimeoutError:
        return PluginProbe(path.name, "no-answer", f"no answer within {limit_s:g} s")

"""The kubelet's side of a DRA driver's sockets: the plugin watcher and the DRA calls.

:class:`PluginWatcher` watches ``plugins_registry/`` (inotify) as the kubelet's plugin
watcher does: each socket that appears gets ``GetInfo`` and ``NotifyRegistrationStatus``
(refused with the reason when the info is not a DRA driver's). :class:`DraClient` calls
``NodePrepareResources`` / ``NodeUnprepareResources`` in v1 or v1beta1 with the kubelet's
deadline, and opens ``NodeWatchResources`` streams. Built on ``kubedevice._api`` only;
answers come back as plain values, protobuf stays here.
"""

from __future__ import annotations

import asyncio
import contextlib
import stat
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import grpc
from grpc import aio

from kubedevice._api.dra.v1 import api_pb2 as v1, api_pb2_grpc as v1_grpc
from kubedevice._api.dra.v1beta1 import api_pb2 as v1beta1, api_pb2_grpc as v1beta1_grpc
from kubedevice._api.drahealth.v1alpha1 import api_pb2 as hpb, api_pb2_grpc as hpb_grpc
from kubedevice._api.pluginregistration.v1 import api_pb2 as reg, api_pb2_grpc as reg_grpc
from kubedevice.conformance.probe import rpc_error_text as rpc_text

__all__ = [
    "CLAIM_CALL_S",
    "HEALTH_SERVICE",
    "V1",
    "V1BETA1",
    "Answer",
    "Call",
    "CallLog",
    "ClaimRef",
    "DeviceAnswer",
    "DraClient",
    "PluginWatcher",
    "Registration",
    "rpc_text",
]

#: The kubelet's deadline for one NodePrepareResources / NodeUnprepareResources call.
CLAIM_CALL_S: Final = 45.0
#: The plugin watcher's deadline for GetInfo, once connected (the kubelet's operation
#: generator: one second).
GET_INFO_S: Final = 1.0
#: How long the plugin watcher tries to connect to a registration socket (the kubelet's
#: dialTimeoutDuration, a blocking dial): :func:`register` tries for this long.
DIAL_S: Final = 10.0
#: One connection attempt (a fresh channel each: one whose first attempt failed would wait
#: out gRPC's reconnect backoff).
_CONNECT_S: Final = 1.0
V1: Final = "v1.DRAPlugin"
V1BETA1: Final = "v1beta1.DRAPlugin"
HEALTH_SERVICE: Final = "v1alpha1.DRAResourceHealth"
DRA_TYPE: Final = "DRAPlugin"

ClaimRef = tuple[str, str, str]  # namespace, name, uid


def _channel(path: Path) -> aio.Channel:
    return aio.insecure_channel(
        f"unix://{path}",
        options=[("grpc.default_authority", "localhost"), ("grpc.use_local_subchannel_pool", 1)],
    )


@dataclass(frozen=True)
class Registration:
    """One registration attempt by the kit's plugin watcher."""

    socket: Path
    t: float
    info: reg.PluginInfo | None = None
    error: str = ""
    notified: bool = False

    @property
    def ok(self) -> bool:
        """GetInfo answered a DRA driver and the successful notification was taken."""
        return self.info is not None and not self.error and self.notified


def judge_info(info: reg.PluginInfo) -> str:
    """Why the kubelet would refuse ``info`` ("" when it would register it)."""
    if info.type != DRA_TYPE:
        return f"type {info.type!r} is not {DRA_TYPE}"
    if not ({V1, V1BETA1} & set(info.supported_versions)):
        return f"no DRA service in supported_versions {list(info.supported_versions)}"
    if not info.name:
        return "empty driver name"
    return ""


async def get_info(socket: Path, limit: float = GET_INFO_S) -> reg.PluginInfo:
    """GetInfo on a registration socket: connected (one attempt, TimeoutError when not
    within a second), then answered within ``limit``: the kubelet's deadline counts from
    the connection, not from the dial."""
    async with _channel(socket) as ch:
        await asyncio.wait_for(ch.channel_ready(), _CONNECT_S)
        return await reg_grpc.RegistrationStub(ch).GetInfo(reg.InfoRequest(), timeout=limit)


async def notify(socket: Path, registered: bool, error: str = "", limit: float = 10.0) -> None:
    """NotifyRegistrationStatus on a registration socket."""
    async with _channel(socket) as ch:
        await reg_grpc.RegistrationStub(ch).NotifyRegistrationStatus(
            reg.RegistrationStatus(plugin_registered=registered, error=error), timeout=limit
        )


async def register(socket: Path, *, attempts_for: float = DIAL_S) -> Registration:
    """GetInfo (retried each 0.2 s for ``attempts_for`` s, as the kubelet's dial and its
    reconciler do), then the notification the kubelet would send."""
    t = time.monotonic()
    deadline = t + attempts_for
    while True:
        try:
            info = await get_info(socket)
            break
        except (aio.AioRpcError, OSError, TimeoutError) as exc:
            if time.monotonic() >= deadline:
                why = f"no connection in {attempts_for:.0f} s" \
                    if isinstance(exc, TimeoutError) else rpc_text(exc)  # fmt: skip
                return Registration(socket, t, error=f"GetInfo: {why}")
            await asyncio.sleep(0.2)  # the plugin watcher's reconciler retries on its own tick
    why = judge_info(info)
    try:
        await notify(socket, not why, why)
    except (aio.AioRpcError, OSError) as exc:
        return Registration(socket, t, info, why or f"Notify: {rpc_text(exc)}", False)
    return Registration(socket, t, info, why, True)


class PluginWatcher:
    """Registers every socket that appears in ``registry`` (inotify); records each attempt."""

    def __init__(self, registry: Path, on_change: Callable[[], None]) -> None:
        self.registry = registry
        self.registrations: list[Registration] = []
        self._on_change = on_change
        self._task: asyncio.Task[None] | None = None
        self._pending: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        """Start watching (sockets already there are registered too)."""
        self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        """Stop watching and cancel registrations under way."""
        for task in [self._task, *self._pending]:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    def rescan(self) -> None:
        """A kubelet restart: every socket in the directory is registered again."""
        for path in sorted(self.registry.iterdir()):
            self._spawn(path)

    def _spawn(self, path: Path) -> None:
        if path.name.startswith("."):
            # as the kubelet's plugin watcher: a driver may bind a hidden name and rename it
            # into place; the hidden one is gone by the time a notification would reach it
            return
        try:
            if not stat.S_ISSOCK(path.lstat().st_mode):
                return
        except OSError:
            return
        task = asyncio.ensure_future(self._register(path))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _register(self, path: Path) -> None:
        self.registrations.append(await register(path))
        self._on_change()

    async def _run(self) -> None:
        from asyncinotify import Inotify, Mask  # Linux only; the DRA kit runs where drivers do

        with Inotify() as ino:
            ino.add_watch(self.registry, Mask.CREATE | Mask.MOVED_TO)
            self.rescan()
            async for event in ino:
                if event.name is not None:
                    self._spawn(self.registry / str(event.name))

    def ok(self, since: float = 0.0) -> list[Registration]:
        """Successful registrations at or after ``since``."""
        return [r for r in self.registrations if r.ok and r.t >= since]


@dataclass(frozen=True)
class DeviceAnswer:
    """One device of a NodePrepareResources answer."""

    request_names: tuple[str, ...]
    pool: str
    device: str
    cdi_ids: tuple[str, ...]
    share_id: str | None = None


@dataclass(frozen=True)
class Answer:
    """One claim's answer: its devices, or its error."""

    devices: tuple[DeviceAnswer, ...] = ()
    error: str = ""

    def key(self) -> tuple[Any, ...]:
        """What two answers must share to be "the same" (devices in any order)."""
        return (self.error, tuple(sorted(self.devices, key=repr)))


@dataclass(frozen=True)
class Call:
    """One claim call: which, how many claims, how long, its error ("" for none), its deadline."""

    rpc: str
    claims: int
    seconds: float
    error: str
    limit: float


@dataclass
class CallLog:
    """Every claim call the kit made: (rpc, seconds, outcome) for the cost and deadline cases."""

    calls: list[Call] = field(default_factory=list)


class DraClient:
    """The kubelet's DRA calls on one driver endpoint."""

    def __init__(self, endpoint: Path, log: CallLog) -> None:
        self.endpoint = endpoint
        self.log = log

    async def prepare(
        self, claims: Sequence[ClaimRef], *, version: str = V1, limit: float = CLAIM_CALL_S
    ) -> dict[str, Answer]:
        """NodePrepareResources; answers by claim UID. gRPC errors propagate."""
        response = await self._call("prepare", claims, version, limit)
        return {
            uid: Answer(
                tuple(
                    DeviceAnswer(
                        tuple(d.request_names),
                        d.pool_name,
                        d.device_name,
                        tuple(d.cdi_device_ids),
                        _share_id(d),
                    )
                    for d in answer.devices
                ),
                answer.error,
            )
            for uid, answer in response.claims.items()
        }

    async def unprepare(
        self, claims: Sequence[ClaimRef], *, version: str = V1, limit: float = CLAIM_CALL_S
    ) -> dict[str, str]:
        """NodeUnprepareResources; the error of each claim by UID ("" for none)."""
        response = await self._call("unprepare", claims, version, limit)
        return {uid: answer.error for uid, answer in response.claims.items()}

    async def _call(self, rpc: str, claims: Sequence[ClaimRef], version: str, limit: float) -> Any:
        """One NodePrepareResources ("prepare") or NodeUnprepareResources call, timed."""
        pb, stub_cls = (v1, v1_grpc) if version == V1 else (v1beta1, v1beta1_grpc)
        refs = [pb.Claim(namespace=n, name=m, uid=u) for n, m, u in claims]
        async with _channel(self.endpoint) as ch:
            stub = stub_cls.DRAPluginStub(ch)
            if rpc == "prepare":
                call = stub.NodePrepareResources(
                    pb.NodePrepareResourcesRequest(claims=refs), timeout=limit
                )
            else:
                call = stub.NodeUnprepareResources(
                    pb.NodeUnprepareResourcesRequest(claims=refs), timeout=limit
                )
            return await self._timed(rpc, len(claims), limit, call)

    async def _timed(self, rpc: str, n: int, limit: float, call: Any) -> Any:
        t = time.monotonic()
        try:
            answer = await call
        except BaseException as exc:
            self.log.calls.append(Call(rpc, n, time.monotonic() - t, rpc_text(exc), limit))
            raise
        self.log.calls.append(Call(rpc, n, time.monotonic() - t, "", limit))
        return answer


def _share_id(device: Any) -> str | None:
    """The device's share ID (v1 only; None when unset)."""
    if "share_id" not in device.DESCRIPTOR.fields_by_name or not device.HasField("share_id"):
        return None
    return str(device.share_id)


class HealthStream:
    """One NodeWatchResources stream: ``next()`` gives each message as {(pool, device): health}."""

    def __init__(self, endpoint: Path) -> None:
        self._channel = _channel(endpoint)
        self._call = hpb_grpc.DRAResourceHealthStub(self._channel).NodeWatchResources(
            hpb.NodeWatchResourcesRequest()
        )

    async def next(self, limit: float) -> dict[tuple[str, str], str]:
        """The next message (TimeoutError, or EOFError when the stream ended)."""
        msg = await asyncio.wait_for(self._call.read(), limit)
        if msg is grpc.aio.EOF or not isinstance(msg, hpb.NodeWatchResourcesResponse):
            raise EOFError("the health stream ended")
        return {
            (d.device.pool_name, d.device.device_name): hpb.HealthStatus.Name(d.health)
            for d in msg.devices
        }

    async def close(self) -> None:
        """Cancel the stream and close its channel."""
        self._call.cancel()
        await self._channel.close()

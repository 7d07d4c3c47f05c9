"""One connection to one device plugin: dial, typed RPC wrappers, the ListAndWatch reader.

Mirrors the kubelet's ``client.go``/``endpoint.go``: a grpc.aio channel to the plugin's
socket (4 MiB receive limit, authority ``localhost``), the ListAndWatch reader task that
feeds every message to the manager, and typed wrappers for the other RPCs. Protobuf types
are converted here and never leave this module.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.message import DecodeError
from grpc import aio

from kubedevice._api import (
    DIAL_TIMEOUT_S,
    KUBELET_MAX_RECV_MESSAGE_BYTES,
    PRESTART_TIMEOUT_S,
    dp,
    dp_grpc,
)
from kubedevice.errors import PluginRpcError
from kubedevice.kubelet.events import EventLog
from kubedevice.kubelet.types import (
    AllocateResult,
    ContainerAllocation,
    DeviceSpec,
    DeviceStatus,
    Mount,
    PluginOptions,
    RpcEvent,
)

__all__ = [
    "DeviceStream",
    "DialError",
    "PluginEndpoint",
    "allocation_decodes",
    "allocation_from_bytes",
    "allocation_from_pb",
    "devices_from_pb",
    "dial",
]

log = logging.getLogger(__name__)

MessageCallback = Callable[["PluginEndpoint", tuple[DeviceStatus, ...]], None]
EndCallback = Callable[["PluginEndpoint", str], None]


class DialError(Exception):
    """Dialing a plugin socket failed; the text is what the kubelet would report."""


def devices_from_pb(msg: dp.ListAndWatchResponse) -> tuple[DeviceStatus, ...]:
    """Typed devices of one ListAndWatch message (duplicate IDs collapse, last wins)."""
    out: dict[str, DeviceStatus] = {}
    for d in msg.devices:
        numa = tuple(n.ID for n in d.topology.nodes) if d.HasField("topology") else ()
        out[d.ID] = DeviceStatus(id=d.ID, health=d.health, numa=numa)
    return tuple(out.values())


def allocation_from_pb(r: dp.ContainerAllocateResponse) -> ContainerAllocation:
    """Typed view of one ContainerAllocateResponse."""
    return ContainerAllocation(
        envs=dict(r.envs),
        mounts=tuple(Mount(m.container_path, m.host_path, m.read_only) for m in r.mounts),
        devices=tuple(DeviceSpec(d.container_path, d.host_path, d.permissions) for d in r.devices),
        annotations=dict(r.annotations),
        cdi_devices=tuple(c.name for c in r.cdi_devices),
    )


def allocation_from_bytes(raw: bytes) -> ContainerAllocation:
    """Typed view of a protobuf-encoded ContainerAllocateResponse (checkpoint ``AllocResp``)."""
    return allocation_from_pb(dp.ContainerAllocateResponse.FromString(raw))


def allocation_decodes(raw: bytes | None) -> bool:
    """True if ``raw`` (a checkpoint ``AllocResp``) decodes as a ContainerAllocateResponse."""
    try:
        dp.ContainerAllocateResponse.FromString(raw or b"")
    except DecodeError:
        return False
    return True


def _options_from_pb(o: dp.DevicePluginOptions) -> PluginOptions:
    return PluginOptions(
        pre_start_required=o.pre_start_required,
        get_preferred_allocation_available=o.get_preferred_allocation_available,
    )


def _channel(socket_path: Path) -> aio.Channel:
    return aio.insecure_channel(
        f"unix://{socket_path}",
        options=[
            ("grpc.max_receive_message_length", KUBELET_MAX_RECV_MESSAGE_BYTES),
            ("grpc.default_authority", "localhost"),
            ("grpc.use_local_subchannel_pool", 1),
        ],
    )


async def dial(socket_path: Path, timeout: float = DIAL_TIMEOUT_S) -> aio.Channel:  # noqa: ASYNC109
    """Blocking dial like the kubelet's (``failed to dial device plugin: ...`` on failure)."""
    channel = _channel(socket_path)
    try:
        await asyncio.wait_for(channel.channel_ready(), timeout)
    except TimeoutError:
        await channel.close()
        raise DialError("failed to dial device plugin: context deadline exceeded") from None
    except BaseException:
        await channel.close()
        raise
    return channel


def _status(err: grpc.RpcError) -> tuple[str, str]:
    code = err.code() if isinstance(err, aio.AioRpcError) else None
    details = err.details() if isinstance(err, aio.AioRpcError) else str(err)
    return (code.name if code is not None else "UNKNOWN"), (details or "")


def go_error_text(err: BaseException) -> str:
    """An RPC error as grpc-go prints it: ``rpc error: code = X desc = Y``."""
    if isinstance(err, PluginRpcError):
        code = "".join(p.capitalize() for p in err.code.split("_"))
        code = {"Deadlineexceeded": "DeadlineExceeded"}.get(code, code)
        return f"rpc error: code = {code} desc = {err.details}"
    return str(err)


class DeviceStream:
    """An independent ListAndWatch stream: ``async for devices in stream`` yields snapshots."""

    def __init__(self, call: Any) -> None:
        self._call = call

    def __aiter__(self) -> AsyncIterator[tuple[DeviceStatus, ...]]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[tuple[DeviceStatus, ...]]:
        try:
            async for msg in self._call:
                yield devices_from_pb(msg)
        except asyncio.CancelledError:
            raise
        except grpc.RpcError as exc:
            if self._call.cancelled():
                return
            code, details = _status(exc)
            raise PluginRpcError("ListAndWatch", "", code, details) from exc

    async def next(self, timeout: float = 5.0) -> tuple[DeviceStatus, ...]:  # noqa: ASYNC109
        """The next snapshot; ``StopAsyncIteration`` at stream end, ``TimeoutError`` on timeout."""
        it = self._call.__aiter__()
        try:
            msg = await asyncio.wait_for(it.__anext__(), timeout)
        except grpc.RpcError as exc:
            code, details = _status(exc)
            raise PluginRpcError("ListAndWatch", "", code, details) from exc
        return devices_from_pb(msg)

    def cancel(self) -> None:
        """Cancel the stream (the plugin sees its context cancelled)."""
        self._call.cancel()

    async def __aenter__(self) -> DeviceStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.cancel()


class PluginEndpoint:
    """A connected plugin: typed RPC wrappers plus the kubelet's ListAndWatch reader.

    The wrappers are what the conformance kit drives; each call is recorded as an
    ``RpcEvent``. Errors come back as ``PluginRpcError`` with the gRPC status name.
    """

    def __init__(
        self,
        resource: str,
        socket_path: Path,
        channel: aio.Channel,
        options: PluginOptions,
        events: EventLog,
    ) -> None:
        self.resource = resource
        self.socket_path = socket_path
        self.options = options
        self._channel = channel
        self._stub = dp_grpc.DevicePluginStub(channel)
        self._events = events
        self._reader: asyncio.Task[None] | None = None
        self._reader_call: Any = None
        self._closed = False
        self._stopped = False
        #: RPCs in flight: call number -> (rpc name, monotonic start)
        self.pending: dict[int, tuple[str, float]] = {}
        self._calls = 0

    # ------------------------------------------------------------------ lifecycle

    @property
    def connected(self) -> bool:
        """True while the reader's ListAndWatch stream is open."""
        return self._reader is not None and not self._reader.done()

    def start_reader(self, on_message: MessageCallback, on_end: EndCallback) -> None:
        """Open the kubelet's ListAndWatch stream and feed each message to ``on_message``."""
        self._reader_call = self._stub.ListAndWatch(dp.Empty())
        self._events.append(
            RpcEvent(t=time.monotonic(), rpc="ListAndWatch", resource=self.resource)
        )
        self._reader = asyncio.get_running_loop().create_task(
            self._read(self._reader_call, on_message, on_end),
            name=f"listandwatch:{self.resource}:{self.socket_path.name}",
        )

    async def _read(self, call: Any, on_message: MessageCallback, on_end: EndCallback) -> None:
        reason = "stream returned"
        try:
            async for msg in call:
                on_message(self, devices_from_pb(msg))
        except asyncio.CancelledError:
            reason = "cancelled"
        except grpc.RpcError as exc:
            code, details = _status(exc)
            reason = f"{code}: {details}"
        except Exception as exc:  # a bug in a callback must not kill the loop silently
            log.exception("ListAndWatch reader failed", extra={"resource": self.resource})
            reason = f"reader error: {exc}"
        on_end(self, reason)

    @property
    def stopped(self) -> bool:
        """True once the kubelet side dropped this endpoint; its RPC wrappers then fail."""
        return self._stopped or self._closed

    def mark_stopped(self) -> None:
        """Make every later RPC fail with ``endpoint ... has been stopped`` (close follows)."""
        self._stopped = True

    def kill_stream(self) -> None:
        """Cancel the reader's stream, as if the kubelet dropped it."""
        if self._reader_call is not None:
            self._reader_call.cancel()

    async def close(self) -> None:
        """Cancel the reader and close the channel (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self.kill_stream()
        await self._channel.close()
        if self._reader is not None and self._reader is not asyncio.current_task():
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader

    # ------------------------------------------------------------------ RPCs

    def _stopped_error(self, rpc: str) -> PluginRpcError:
        # the kubelet's errEndpointStopped ("endpoint %v has been stopped")
        return PluginRpcError(
            rpc, self.resource, "UNAVAILABLE", f"endpoint {self.socket_path} has been stopped"
        )

    async def _call(self, rpc: str, make: Callable[[], Awaitable[Any]]) -> Any:
        start = time.monotonic()
        err: PluginRpcError | None = None
        cause: BaseException | None = None
        if self.stopped:
            err = self._stopped_error(rpc)
        else:
            self._calls += 1
            number = self._calls
            self.pending[number] = (rpc, start)
            try:
                out = await make()
            except aio.UsageError as exc:  # the channel was closed while the call started
                err, cause = self._stopped_error(rpc), exc
            except asyncio.CancelledError as exc:
                # grpc ends a call in flight with CancelledError when its channel closes
                # (the plugin's stream ended): that is this endpoint stopping, not our task
                # being cancelled, which must still propagate.
                task = asyncio.current_task()
                if not self.stopped or (task is not None and task.cancelling()):
                    raise
                err, cause = self._stopped_error(rpc), exc
            except grpc.RpcError as exc:
                code, details = _status(exc)
                err, cause = PluginRpcError(rpc, self.resource, code, details), exc
            finally:
                self.pending.pop(number, None)
        self._events.append(
            RpcEvent(
                t=start,
                rpc=rpc,
                resource=self.resource,
                error=None if err is None else str(err),
                duration_s=time.monotonic() - start,
            )
        )
        if err is not None:
            raise err from cause
        return out

    async def get_options(self) -> PluginOptions:
        """Call GetDevicePluginOptions now (``options`` keeps the registration-time answer)."""
        resp = await self._call(
            "GetDevicePluginOptions", lambda: self._stub.GetDevicePluginOptions(dp.Empty())
        )
        return _options_from_pb(resp)

    async def allocate(self, ids: Sequence[str], *more: Sequence[str]) -> AllocateResult:
        """Allocate with one ContainerAllocateRequest per argument; all responses, typed."""
        req = dp.AllocateRequest()
        for group in (ids, *more):
            req.container_requests.add().devices_ids.extend(group)
        resp = await self._call("Allocate", lambda: self._stub.Allocate(req))
        return AllocateResult(tuple(allocation_from_pb(r) for r in resp.container_responses))

    async def allocate_raw(self, ids: Sequence[str]) -> bytes | None:
        """Allocate as the kubelet does; element 0 re-encoded, or None if the list is empty."""
        req = dp.AllocateRequest()
        req.container_requests.add().devices_ids.extend(ids)
        resp = await self._call("Allocate", lambda: self._stub.Allocate(req))
        if not resp.container_responses:
            return None
        data: bytes = resp.container_responses[0].SerializeToString(deterministic=True)
        return data

    async def get_preferred_allocation(
        self, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> tuple[str, ...]:
        """GetPreferredAllocation with one container request; element 0's device IDs."""
        req = dp.PreferredAllocationRequest()
        c = req.container_requests.add()
        c.available_deviceIDs.extend(available)
        c.must_include_deviceIDs.extend(must_include)
        c.allocation_size = size
        resp = await self._call(
            "GetPreferredAllocation", lambda: self._stub.GetPreferredAllocation(req)
        )
        if not resp.container_responses:
            return ()
        return tuple(resp.container_responses[0].deviceIDs)

    async def pre_start(
        self,
        ids: Sequence[str],
        timeout: float = PRESTART_TIMEOUT_S,  # noqa: ASYNC109
    ) -> None:
        """PreStartContainer with the kubelet's 30 s deadline."""
        req = dp.PreStartContainerRequest(devices_ids=list(ids))
        await self._call(
            "PreStartContainer", lambda: self._stub.PreStartContainer(req, timeout=timeout)
        )

    def list_and_watch(self) -> DeviceStream:
        """Open a NEW ListAndWatch stream, independent of the kubelet's reader.

        ``PluginRpcError`` (UNAVAILABLE) if this endpoint has been stopped.
        """
        if self.stopped:
            raise self._stopped_error("ListAndWatch")
        self._events.append(
            RpcEvent(t=time.monotonic(), rpc="ListAndWatch", resource=self.resource)
        )
        return DeviceStream(self._stub.ListAndWatch(dp.Empty()))

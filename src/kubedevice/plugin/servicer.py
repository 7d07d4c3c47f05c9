"""The ``v1beta1.DevicePlugin`` service of one plugin, and the device table it serves.

:class:`DeviceTable` holds the current snapshot, encoded once per change, and wakes every
``ListAndWatch`` stream; each stream sends the newest list when it is ready, so bursts
coalesce and a slow stream never holds up the others. :func:`make_handler` turns a
plugin's hooks into gRPC handlers; protobuf types stay inside this module.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

import grpc

from kubedevice._api import KUBELET_MAX_RECV_MESSAGE_BYTES, dp
from kubedevice.errors import AllocationError
from kubedevice.plugin.hooks import async_hook
from kubedevice.plugin.policy import default_preferred_allocation, enforce_preferred_invariants
from kubedevice.plugin.types import DEFAULT, ContainerAllocation, Device, Health

if TYPE_CHECKING:
    from kubedevice.plugin.base import DevicePlugin
    from kubedevice.plugin.metrics import PluginMetrics

__all__ = ["HOOK_ERRORS", "SERVICE_NAME", "DeviceTable", "encode_devices", "make_handler"]

log = logging.getLogger(__name__)

#: ``v1beta1.DevicePlugin``, taken from the generated descriptor so it cannot drift.
SERVICE_NAME = dp.DESCRIPTOR.services_by_name["DevicePlugin"].full_name

#: What a failing hook may raise without taking the daemon down. SystemExit too: a library
#: called inside a hook may raise it, and it would end the event loop with the sockets
#: left behind. A cancellation is never caught.
HOOK_ERRORS: tuple[type[BaseException], ...] = (Exception, SystemExit, KeyboardInterrupt)

_HEALTH_WIRE = {Health.HEALTHY: "Healthy", Health.UNHEALTHY: "Unhealthy"}


def encode_devices(devices: Sequence[Device]) -> bytes:
    """Encode a full device list as a serialized ``ListAndWatchResponse``.

    Args:
        devices: The snapshot.

    Returns:
        The wire bytes (built with ``devices.add``, the fastest way with upb).
    """
    resp = dp.ListAndWatchResponse()
    add = resp.devices.add
    wire = _HEALTH_WIRE
    for dev in devices:
        if dev.numa_nodes:
            msg = add(ID=dev.id, health=wire[dev.health])
            nodes = msg.topology.nodes
            for node in dev.numa_nodes:
                nodes.add(ID=node)
        else:
            add(ID=dev.id, health=wire[dev.health])
    return resp.SerializeToString()


class DeviceTable:
    """The current devices of one resource and the fan-out to its ListAndWatch streams.

    Args:
        resource: Resource name (for logs and metrics).
        metrics: Where to report device counts and open streams, or ``None``.
        max_message_bytes: Largest list the kubelet accepts; larger ones are refused.
    """

    def __init__(
        self,
        resource: str,
        metrics: PluginMetrics | None = None,
        max_message_bytes: int = KUBELET_MAX_RECV_MESSAGE_BYTES,
    ) -> None:
        self.resource = resource
        self.by_id: dict[str, Device] = {}
        self.snapshot: tuple[Device, ...] | None = None
        self.encoded: bytes | None = None
        self.generation = 0
        self.open_streams = 0
        #: Streams opened so far; the n-th stream has the id n.
        self.streams_served = 0
        #: Ids of the streams open now.
        self.open_ids: set[int] = set()
        self.closed = False
        self.max_message_bytes = max_message_bytes
        #: Called with the stream's id when a stream ends.
        self.on_stream_closed: Callable[[int], None] | None = None
        self._metrics = metrics
        self._changed = asyncio.Event()
        self._first = asyncio.Event()

    def publish(self, snapshot: Sequence[Device]) -> bool:
        """Make ``snapshot`` the current list and wake the streams if the list changed.

        A snapshot that is not iterable, has a non-``Device`` item or a duplicate ID is
        refused (logged); one
        whose encoding exceeds the kubelet's limit updates the table but is not sent.

        Args:
            snapshot: The complete device list.

        Returns:
            True if the streams were woken with a new list.
        """
        extra = {"resource": self.resource}
        try:
            devices = tuple(snapshot)  # an iterator would be used up by the checks below
        except TypeError:
            log.error(
                "refused a device snapshot: %r is not a sequence of devices", snapshot, extra=extra
            )
            return False
        by_id: dict[str, Device] = {}
        for dev in devices:
            if not isinstance(dev, Device):
                log.error(
                    "refused a device snapshot: %r is not a kubedevice.Device", dev, extra=extra
                )
                return False
            if dev.id in by_id:
                log.error("refused a device snapshot: duplicate device ID %r", dev.id, extra=extra)
                return False
            by_id[dev.id] = dev
        self.by_id = by_id
        self.snapshot = devices
        if self._metrics is not None:
            healthy = sum(1 for d in self.snapshot if d.health is Health.HEALTHY)
            self._metrics.devices(self.resource, healthy, len(self.snapshot) - healthy)
        data = encode_devices(self.snapshot)
        if len(data) > self.max_message_bytes:
            log.error(
                "NOT sending the device list: %d devices encode to %d bytes, over the kubelet's "
                "limit of %d bytes per ListAndWatch message (shorten the IDs or split the "
                "resource); the kubelet keeps the previous list",
                len(self.snapshot),
                len(data),
                self.max_message_bytes,
                extra=extra,
            )
            return False
        self._first.set()
        if data == self.encoded:
            return False
        self.encoded = data
        self.generation += 1
        self._wake()
        return True

    def close(self) -> None:
        """End every stream (they return normally) and refuse new ones."""
        self.closed = True
        self._wake()

    def _wake(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def wait_first(self) -> None:
        """Return once a first list can be sent."""
        await self._first.wait()

    async def stream(self, write: Callable[[bytes], Awaitable[None]]) -> None:
        """Serve one ListAndWatch stream: the current list at once, then every change.

        Args:
            write: Sends one encoded message (``context.write``).
        """
        self.open_streams += 1
        self.streams_served += 1
        sid = self.streams_served
        self.open_ids.add(sid)
        if self._metrics is not None:
            self._metrics.streams(self.resource, self.open_streams)
        last = 0
        try:
            while not self.closed:
                data = self.encoded
                if self.generation == last or data is None:
                    await self._changed.wait()
                    continue
                last = self.generation
                await write(data)
        finally:
            self.open_streams -= 1
            self.open_ids.discard(sid)
            if self._metrics is not None:
                self._metrics.streams(self.resource, self.open_streams)
            log.debug("ListAndWatch stream closed", extra={"resource": self.resource})
            if self.on_stream_closed is not None:
                self.on_stream_closed(sid)


async def _abort(
    context: grpc.aio.ServicerContext[Any, Any], code: grpc.StatusCode, msg: str
) -> NoReturn:
    await context.abort(code, msg)
    raise AssertionError("unreachable")  # pragma: no cover


#: At most this many IDs are named in an error (a status must fit gRPC's metadata limit).
MAX_IDS_IN_ERROR = 20


def _ids_label(what: str, ids: Sequence[str]) -> str:
    """``"<what> device IDs: 'a', 'b'"``, naming only the first :data:`MAX_IDS_IN_ERROR`.

    Without the cap, a request with a few hundred bad IDs gets a status too large for
    gRPC's metadata (the caller then sees RESOURCE_EXHAUSTED) and a megabyte log line.
    """
    shown = ", ".join(repr(i[:100]) for i in ids[:MAX_IDS_IN_ERROR])
    if len(ids) > MAX_IDS_IN_ERROR:
        return f"{what} device IDs (first {MAX_IDS_IN_ERROR} of {len(ids)}): {shown}, ..."
    return f"{what} device IDs: {shown}"


def _check_request(table: DeviceTable, ids: Sequence[str], index: int) -> str | list[Device]:
    """Return the devices for ``ids``, or the INVALID_ARGUMENT message."""
    by_id = table.by_id
    devices = [by_id.get(i) for i in ids]  # the usual request: known, distinct, healthy
    if (
        devices
        and None not in devices
        and all(d.health is Health.HEALTHY for d in devices)  # type: ignore[union-attr]
        and len(set(ids)) == len(ids)
    ):
        return devices  # type: ignore[return-value]
    if not ids:
        return f"container request {index} names no devices"
    seen: set[str] = set()
    dups: list[str] = []
    for dev_id in ids:
        if dev_id in seen and dev_id not in dups:
            dups.append(dev_id)
        seen.add(dev_id)
    if dups:
        return f"container request {index} names {_ids_label('duplicate', dups)}"
    unknown = [i for i in ids if i not in by_id]
    if unknown:
        return f"container request {index} names {_ids_label('unknown', unknown)}"
    unhealthy = [i for i in ids if by_id[i].health is not Health.HEALTHY]
    return f"container request {index} names {_ids_label('unhealthy', unhealthy)}"


def _fill_response(cresp: Any, alloc: ContainerAllocation) -> None:
    if alloc.envs:
        cresp.envs.update(alloc.envs)
    for mount in alloc.mounts:
        cresp.mounts.add(
            container_path=mount.container_path,
            host_path=mount.host_path,
            read_only=mount.read_only,
        )
    for spec in alloc.device_specs:
        cresp.devices.add(
            container_path=spec.container_path,
            host_path=spec.host_path,
            permissions=spec.permissions,
        )
    if alloc.annotations:
        cresp.annotations.update(alloc.annotations)
    for name in alloc.cdi_devices:
        cresp.cdi_devices.add(name=name)


def _framed(cresp: Any) -> bytes:
    """One ``ContainerAllocateResponse`` as it sits inside an ``AllocateResponse`` on the wire.

    ``container_responses`` is field 1 (length-delimited): tag byte 0x0a, the length as a
    varint, the message. An AllocateResponse is these pieces back to back, so a response
    can be put together from cached pieces without building a message.
    """
    body: bytes = cresp.SerializeToString()
    size = len(body)
    head = bytearray(b"\x0a")
    while size >= 0x80:
        head.append((size & 0x7F) | 0x80)
        size >>= 7
    head.append(size)
    return bytes(head) + body


#: Most default responses kept per plugin (one per distinct ID list asked for).
MAX_CACHED_RESPONSES = 4096


def _base_allocate() -> Any:
    from kubedevice.plugin.base import DevicePlugin

    return DevicePlugin.allocate


class _Servicer:
    """The five DevicePlugin RPCs of one plugin (bound to its table)."""

    def __init__(
        self, plugin: DevicePlugin, table: DeviceTable, metrics: PluginMetrics | None
    ) -> None:
        self.plugin = plugin
        self.table = table
        self.metrics = metrics
        self.resource = table.resource
        self.options = plugin.options()
        self._extra = {"resource": self.resource}
        # async def hooks as they are; plain functions run in a worker thread.
        self._allocate_hook = async_hook(plugin.allocate)
        #: The plugin keeps the base class's allocate(): every answer is DEFAULT.
        self._always_default = getattr(plugin.allocate, "__func__", None) is _base_allocate()
        #: Framed default responses by ID list, valid for one device table (``by_id``):
        #: the default response is a function of the (frozen) devices alone.
        self._default_cache: dict[tuple[str, ...], bytes] = {}
        self._cache_table: dict[str, Device] | None = None
        self._preferred_hook = async_hook(plugin.preferred_allocation)
        self._pre_start_hook = async_hook(plugin.pre_start)

    async def get_options(
        self, request: dp.Empty, context: grpc.aio.ServicerContext[Any, Any]
    ) -> dp.DevicePluginOptions:
        return dp.DevicePluginOptions(
            pre_start_required=self.options.pre_start_required,
            get_preferred_allocation_available=self.options.get_preferred_allocation_available,
        )

    async def list_and_watch(
        self, request: dp.Empty, context: grpc.aio.ServicerContext[Any, Any]
    ) -> None:
        log.debug("ListAndWatch stream opened", extra=self._extra)
        await self.table.stream(context.write)

    async def allocate(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        """Allocate: the serialized ``AllocateResponse`` (the handler sends bytes as they are)."""
        if type(request) is _Undecodable:
            await _abort_undecodable(context, request)
        if self.metrics is None:
            result = await self._allocate(request)
        else:
            start = time.perf_counter()
            result = await self._allocate(request)
            self.metrics.allocated(
                self.resource,
                time.perf_counter() - start,
                None if isinstance(result, bytes) else result[0].name,
            )
        if isinstance(result, bytes):
            return result
        await _abort(context, *result)

    async def _allocate(self, request: dp.AllocateRequest) -> bytes | tuple[grpc.StatusCode, str]:
        if not request.container_requests:
            return grpc.StatusCode.INVALID_ARGUMENT, "Allocate request has no container requests"
        table = self.table.by_id
        if self._cache_table is not table:
            self._default_cache.clear()
            self._cache_table = table
        pieces: list[bytes] = []
        for index, creq in enumerate(request.container_requests):
            ids = tuple(creq.devices_ids)
            cached = self._default_cache.get(ids) if self._always_default else None
            if cached is not None:
                pieces.append(cached)
                continue
            checked = _check_request(self.table, ids, index)
            if isinstance(checked, str):
                log.warning("Allocate refused: %s", checked, extra=self._extra)
                return grpc.StatusCode.INVALID_ARGUMENT, checked
            try:
                result = DEFAULT if self._always_default else await self._allocate_hook(checked)
                if result is DEFAULT:
                    cached = self._default_cache.get(ids)
                    if cached is not None:
                        pieces.append(cached)
                        continue
                    result = ContainerAllocation.merge(checked)
                    default = True
                elif not isinstance(result, ContainerAllocation):
                    raise TypeError(
                        f"allocate() returned {type(result).__name__}, expected "
                        "ContainerAllocation or kubedevice.DEFAULT"
                    )
                else:
                    default = False
            except AllocationError as exc:  # the hook refuses the request: the caller's fault
                log.warning("Allocate refused: %s", exc, extra=self._extra)
                return grpc.StatusCode.INVALID_ARGUMENT, str(exc)
            except HOOK_ERRORS as exc:
                log.exception("allocate hook failed", extra=self._extra)
                return grpc.StatusCode.INTERNAL, f"allocate hook failed: {exc!r}"
            cresp = dp.ContainerAllocateResponse()
            _fill_response(cresp, result)
            piece = _framed(cresp)
            if default:
                if len(self._default_cache) >= MAX_CACHED_RESPONSES:
                    self._default_cache.clear()
                self._default_cache[ids] = piece
            pieces.append(piece)
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    async def get_preferred_allocation(
        self, request: dp.PreferredAllocationRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> dp.PreferredAllocationResponse:
        if not self.options.get_preferred_allocation_available:
            await _abort(
                context,
                grpc.StatusCode.UNIMPLEMENTED,
                "GetPreferredAllocation is not advertised by this plugin",
            )
        by_id = self.table.by_id
        resp = dp.PreferredAllocationResponse()
        for creq in request.container_requests:
            available_ids = list(creq.available_deviceIDs)
            must_ids = list(creq.must_include_deviceIDs)
            size = creq.allocation_size
            available = [by_id[i] for i in available_ids if i in by_id]
            must = [by_id[i] for i in must_ids if i in by_id]
            fallback = default_preferred_allocation(available, must, size)
            try:
                answer = list(await self._preferred_hook(available, must, size))
                if not all(isinstance(i, str) for i in answer):
                    raise TypeError(
                        f"preferred_allocation() must return device IDs, got {answer!r}"
                    )
            except HOOK_ERRORS:
                log.exception(
                    "preferred_allocation hook failed; answering with the default policy",
                    extra=self._extra,
                )
                answer = fallback
            chosen = enforce_preferred_invariants(answer, available_ids, must_ids, size, fallback)
            if chosen != answer:
                log.warning(
                    "preferred_allocation hook answer %r broke the invariants (must include %r, "
                    "size %d, only offered IDs); answering %r",
                    answer,
                    must_ids,
                    size,
                    chosen,
                    extra=self._extra,
                )
            resp.container_responses.add(deviceIDs=chosen)
        return resp

    async def pre_start_container(
        self, request: dp.PreStartContainerRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> dp.PreStartContainerResponse:
        if not self.options.pre_start_required:
            await _abort(
                context,
                grpc.StatusCode.UNIMPLEMENTED,
                "PreStartContainer is not advertised by this plugin",
            )
        by_id = self.table.by_id
        unknown = [i for i in request.devices_ids if i not in by_id]
        if unknown:
            await _abort(
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                f"PreStartContainer names {_ids_label('unknown', unknown)}",
            )
        try:
            await self._pre_start_hook([by_id[i] for i in request.devices_ids])
        except HOOK_ERRORS as exc:
            log.exception("pre_start hook failed", extra=self._extra)
            await _abort(context, grpc.StatusCode.INTERNAL, f"pre_start hook failed: {exc!r}")
        return dp.PreStartContainerResponse()


def _identity(data: bytes) -> bytes:
    """ListAndWatch messages are encoded once per snapshot and the same bytes go to every
    stream, and Allocate answers from cached pieces of its response; that is why this
    handler table is built here rather than by the generated
    ``add_DevicePluginServicer_to_server`` (which would re-encode each time). Every method
    of the table is called over a real socket by ``tests/sdk``."""
    return data


class _Undecodable:
    """What a request that is not valid protobuf decodes to; answered INVALID_ARGUMENT."""

    __slots__ = ("message", "reason")

    def __init__(self, message: str, reason: str) -> None:
        self.message = message
        self.reason = reason


def _parser(message_type: Any) -> Callable[[bytes], Any]:
    """A request deserializer that never raises (grpcio would answer UNKNOWN)."""
    from_string = message_type.FromString
    name = message_type.DESCRIPTOR.full_name

    def parse(data: bytes) -> Any:
        try:
            return from_string(data)
        except Exception as exc:  # DecodeError, or anything else a parser may raise
            return _Undecodable(name, str(exc)[:200])

    return parse


async def _abort_undecodable(
    context: grpc.aio.ServicerContext[Any, Any], request: _Undecodable
) -> NoReturn:
    await _abort(
        context,
        grpc.StatusCode.INVALID_ARGUMENT,
        f"the request is not a valid {request.message} protobuf message: {request.reason}",
    )


def _decoded(method: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """Wrap an RPC method: an undecodable request gets INVALID_ARGUMENT, not UNKNOWN."""

    async def call(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        if type(request) is _Undecodable:
            await _abort_undecodable(context, request)
        return await method(request, context)

    return call


def make_handler(
    plugin: DevicePlugin, table: DeviceTable, metrics: PluginMetrics | None = None
) -> grpc.GenericRpcHandler:
    """Build the ``v1beta1.DevicePlugin`` handler serving ``plugin`` from ``table``.

    Args:
        plugin: The plugin whose hooks answer the RPCs.
        table: Its device table.
        metrics: Where to record Allocate calls, or ``None``.

    Returns:
        A handler for ``grpc.aio.Server.add_generic_rpc_handlers``.
    """
    svc = _Servicer(plugin, table, metrics)
    return grpc.method_handlers_generic_handler(
        SERVICE_NAME,
        {
            "GetDevicePluginOptions": grpc.unary_unary_rpc_method_handler(
                _decoded(svc.get_options),
                request_deserializer=_parser(dp.Empty),
                response_serializer=dp.DevicePluginOptions.SerializeToString,
            ),
            "ListAndWatch": grpc.unary_stream_rpc_method_handler(
                _decoded(svc.list_and_watch),
                request_deserializer=_parser(dp.Empty),
                response_serializer=_identity,
            ),
            "Allocate": grpc.unary_unary_rpc_method_handler(
                svc.allocate,  # checks for an undecodable request itself (one call less)
                request_deserializer=_parser(dp.AllocateRequest),
                response_serializer=_identity,  # it answers the serialized response
            ),
            "GetPreferredAllocation": grpc.unary_unary_rpc_method_handler(
                _decoded(svc.get_preferred_allocation),
                request_deserializer=_parser(dp.PreferredAllocationRequest),
                response_serializer=dp.PreferredAllocationResponse.SerializeToString,
            ),
            "PreStartContainer": grpc.unary_unary_rpc_method_handler(
                _decoded(svc.pre_start_container),
                request_deserializer=_parser(dp.PreStartContainerRequest),
                response_serializer=dp.PreStartContainerResponse.SerializeToString,
            ),
        },
    )

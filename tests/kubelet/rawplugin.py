"""A small, configurable device plugin written on raw grpc.aio + ``kubedevice._api`` only.

Independent of the SDK (``kubedevice.plugin``) on purpose, so that the emulator and the SDK
never check each other with shared code. Used by the emulator tests, the benchmark (as a
subprocess: ``python tests/kubelet/rawplugin.py --dir D --resource R --count N``) and, if
useful, the conformance kit's tests.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from grpc import aio

from kubedevice._api import dp, dp_grpc

__all__ = ["Dev", "RawPlugin", "devs"]


@dataclass(frozen=True)
class Dev:
    """A device: id, health string, NUMA nodes (empty = no topology)."""

    id: str
    health: str = "Healthy"
    numa: tuple[int, ...] = ()


def devs(
    n: int,
    prefix: str = "d",
    health: str = "Healthy",
    numa: Callable[[int], tuple[int, ...]] | None = None,
) -> list[Dev]:
    """``n`` devices ``d0 .. d<n-1>``."""
    return [Dev(f"{prefix}{i}", health, numa(i) if numa else ()) for i in range(n)]


AllocFn = Callable[[list[str]], dp.ContainerAllocateResponse | None]


@dataclass
class Calls:
    """Every request the plugin received (as plain Python values)."""

    options: int = 0
    list_and_watch: int = 0
    allocate: list[list[list[str]]] = field(default_factory=list)
    preferred: list[tuple[list[str], list[str], int]] = field(default_factory=list)
    pre_start: list[list[str]] = field(default_factory=list)
    #: (rpc, seconds left before the caller's deadline or None) for every unary call
    deadlines: list[tuple[str, float | None]] = field(default_factory=list)


class RawPlugin(dp_grpc.DevicePluginServicer):
    """A DevicePlugin servicer + server + Register client.

    Attributes to tweak between calls: ``devices`` (then ``push()``), ``options``,
    ``allocate_fn`` (return a ContainerAllocateResponse, or None for an empty response;
    raise to fail), ``allocate_error`` / ``preferred_error`` / ``pre_start_error`` (status
    details; the RPC then fails with UNKNOWN), ``preferred_fn``.
    """

    def __init__(
        self,
        socket_dir: Path,
        resource: str = "example.com/foo",
        devices: Sequence[Dev] = (),
        *,
        name: str | None = None,
        pre_start_required: bool = False,
        preferred_available: bool = False,
    ) -> None:
        self.socket_dir = Path(socket_dir)
        self.resource = resource
        self.endpoint = name or f"{resource.replace('/', '_')}.sock"
        self.socket_path = self.socket_dir / self.endpoint
        self.devices: list[Dev] = list(devices)
        self.options = dp.DevicePluginOptions(
            pre_start_required=pre_start_required,
            get_preferred_allocation_available=preferred_available,
        )
        self.calls = Calls()
        self.allocate_fn: AllocFn | None = None
        self.allocate_error: str | None = None
        self.preferred_fn: Callable[[list[str], list[str], int], list[str]] | None = None
        self.preferred_error: str | None = None
        self.pre_start_error: str | None = None
        #: (entered, release): Allocate sets ``entered`` then waits for ``release``
        self.allocate_gate: tuple[asyncio.Event, asyncio.Event] | None = None
        self.options_error: str | None = None
        self.print_sent = False
        self._queues: list[asyncio.Queue[dp.ListAndWatchResponse | None]] = []
        self._server: aio.Server | None = None
        self.stream_opened = asyncio.Event()
        self.stream_closed = asyncio.Event()

    # ------------------------------------------------------------------ servicer

    async def GetDevicePluginOptions(
        self, request: dp.Empty, context: Any
    ) -> dp.DevicePluginOptions:
        self.calls.options += 1
        if self.options_error:
            await context.abort(grpc.StatusCode.UNKNOWN, self.options_error)
        return self.options

    def _snapshot(self) -> dp.ListAndWatchResponse:
        msg = dp.ListAndWatchResponse()
        for d in self.devices:
            dev = msg.devices.add(ID=d.id, health=d.health)
            for n in d.numa:
                dev.topology.nodes.add(ID=n)
        return msg

    async def ListAndWatch(self, request: dp.Empty, context: Any) -> Any:
        self.calls.list_and_watch += 1
        q: asyncio.Queue[dp.ListAndWatchResponse | None] = asyncio.Queue()
        self._queues.append(q)
        q.put_nowait(self._snapshot())
        self.stream_opened.set()
        try:
            while (msg := await q.get()) is not None:
                if self.print_sent:
                    print(f"SENT {time.monotonic():.9f}", flush=True)
                yield msg
        finally:
            self._queues.remove(q)
            self.stream_closed.set()

    async def GetPreferredAllocation(
        self, request: dp.PreferredAllocationRequest, context: Any
    ) -> dp.PreferredAllocationResponse:
        c = request.container_requests[0]
        self.calls.deadlines.append(("GetPreferredAllocation", context.time_remaining()))
        args = (list(c.available_deviceIDs), list(c.must_include_deviceIDs), c.allocation_size)
        self.calls.preferred.append(args)
        if self.preferred_error:
            await context.abort(grpc.StatusCode.UNKNOWN, self.preferred_error)
        ids = self.preferred_fn(*args) if self.preferred_fn else []
        resp = dp.PreferredAllocationResponse()
        resp.container_responses.add().deviceIDs.extend(ids)
        return resp

    async def Allocate(self, request: dp.AllocateRequest, context: Any) -> dp.AllocateResponse:
        groups = [list(c.devices_ids) for c in request.container_requests]
        self.calls.deadlines.append(("Allocate", context.time_remaining()))
        self.calls.allocate.append(groups)
        if self.allocate_gate is not None:
            entered, release = self.allocate_gate
            entered.set()
            await release.wait()
        if self.allocate_error:
            await context.abort(grpc.StatusCode.UNKNOWN, self.allocate_error)
        resp = dp.AllocateResponse()
        for ids in groups:
            if self.allocate_fn is not None:
                r = self.allocate_fn(ids)
                if r is None:
                    return dp.AllocateResponse()
                resp.container_responses.append(r)
            else:
                resp.container_responses.add(envs={"DEVICES": ",".join(ids)})
        return resp

    async def PreStartContainer(
        self, request: dp.PreStartContainerRequest, context: Any
    ) -> dp.PreStartContainerResponse:
        self.calls.pre_start.append(list(request.devices_ids))
        self.calls.deadlines.append(("PreStartContainer", context.time_remaining()))
        if self.pre_start_error:
            await context.abort(grpc.StatusCode.UNKNOWN, self.pre_start_error)
        return dp.PreStartContainerResponse()

    # ------------------------------------------------------------------ control

    def push(self) -> None:
        """Send the current ``devices`` to every open ListAndWatch stream."""
        for q in self._queues:
            q.put_nowait(self._snapshot())

    def end_streams(self) -> None:
        """Make every open ListAndWatch stream return (the plugin 'ends' it)."""
        self.stream_closed.clear()
        for q in self._queues:
            q.put_nowait(None)

    async def serve(self) -> None:
        """Serve DevicePlugin on ``socket_path``."""
        self.socket_dir.mkdir(parents=True, exist_ok=True)
        server = aio.server()
        dp_grpc.add_DevicePluginServicer_to_server(self, server)
        server.add_insecure_port(f"unix://{self.socket_path}")
        await server.start()
        self._server = server

    async def register(
        self,
        *,
        version: str = "v1beta1",
        resource: str | None = None,
        endpoint: str | None = None,
        kubelet_socket: Path | None = None,
    ) -> None:
        """Call Register on the kubelet socket (raises grpc.RpcError on refusal)."""
        sock = kubelet_socket or self.socket_dir / "kubelet.sock"
        async with aio.insecure_channel(f"unix://{sock}") as ch:
            stub = dp_grpc.RegistrationStub(ch)
            await stub.Register(
                dp.RegisterRequest(
                    version=version,
                    endpoint=endpoint if endpoint is not None else self.endpoint,
                    resource_name=resource if resource is not None else self.resource,
                    options=self.options,
                ),
                timeout=15,
            )

    async def start(self) -> RawPlugin:
        """Serve, then register."""
        await self.serve()
        await self.register()
        return self

    async def stop(self) -> None:
        """Stop the server (open streams end) and remove the socket."""
        self.end_streams()
        if self._server is not None:
            await self._server.stop(None)
            self._server = None
        if self.socket_path.is_socket():
            self.socket_path.unlink()


async def _main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dir", required=True, type=Path)
    ap.add_argument("--resource", default="example.com/foo")
    ap.add_argument("--count", type=int, default=4)
    ap.add_argument("--prefix", default="d")
    ap.add_argument("--numa", type=int, default=0, help="spread devices over N NUMA nodes")
    ap.add_argument("--name", default=None)
    ap.add_argument("--print-sent", action="store_true", help="print SENT <monotonic> per message")
    args = ap.parse_args()
    numa = (lambda i: (i % args.numa,)) if args.numa else None
    p = RawPlugin(args.dir, args.resource, devs(args.count, args.prefix, numa=numa), name=args.name)
    p.print_sent = args.print_sent
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await p.start()
    print("READY", flush=True)
    await stop.wait()
    await p.stop()


if __name__ == "__main__":
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    asyncio.run(_main())

"""PodResources ``v1`` server (List, GetAllocatableResources, Get) on its own socket.

Reports devices as the kubelet does (contract.md#podresources): one ``ContainerDevices`` per
(device, NUMA node) with a single id and a single-node topology; a device without topology
yields one element without topology. Regular init containers are omitted from pods;
sidecars and app containers are listed. Unary calls are rate-limited like the kubelet's
(token bucket, 100 QPS, burst 10; excess ⇒ RESOURCE_EXHAUSTED ``rejected by rate limit``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from pathlib import Path

import grpc
from grpc import aio

from kubedevice._api import NODE_WITHOUT_TOPOLOGY, pr, pr_grpc
from kubedevice.kubelet.manager import DeviceManager
from kubedevice.kubelet.pods import PodSpec
from kubedevice.kubelet.sockets import serve_grpc, stop_grpc

__all__ = ["PodResourcesServer"]


class _TokenBucket:
    def __init__(self, qps: float, burst: int) -> None:
        self.qps = qps
        self.burst = burst
        self.tokens = float(burst)
        self.last = time.monotonic()

    def allow(self) -> bool:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.last) * self.qps)
        self.last = now
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        return False


def _device_elements(resource: str, by_numa: dict[int, list[str]]) -> Iterable[pr.ContainerDevices]:
    for numa in sorted(by_numa):
        for dev in sorted(by_numa[numa]):
            cd = pr.ContainerDevices(resource_name=resource, device_ids=[dev])
            if numa != NODE_WITHOUT_TOPOLOGY:
                cd.topology.nodes.add(ID=numa)
            yield cd


class _Servicer(pr_grpc.PodResourcesListerServicer):
    def __init__(self, server: PodResourcesServer) -> None:
        self._s = server

    async def List(
        self, request: pr.ListPodResourcesRequest, context: aio.ServicerContext[object, object]
    ) -> pr.ListPodResourcesResponse:
        await self._s.limit(context)
        return pr.ListPodResourcesResponse(
            pod_resources=[self._s.pod_resources(p) for p in self._s.pods()]
        )

    async def GetAllocatableResources(
        self, request: pr.AllocatableResourcesRequest, context: aio.ServicerContext[object, object]
    ) -> pr.AllocatableResourcesResponse:
        await self._s.limit(context)
        out = pr.AllocatableResourcesResponse()
        m = self._s.manager
        for name in sorted(m.resources):
            r = m.resources[name]
            for dev_id in sorted(r.healthy):
                d = r.devices.get(dev_id)
                numa = d.numa if d is not None and d.numa else (NODE_WITHOUT_TOPOLOGY,)
                out.devices.extend(_device_elements(name, {n: [dev_id] for n in numa}))
        return out

    async def Get(
        self, request: pr.GetPodResourcesRequest, context: aio.ServicerContext[object, object]
    ) -> pr.GetPodResourcesResponse:
        await self._s.limit(context)
        for p in self._s.pods():
            if p.name == request.pod_name and p.namespace == request.pod_namespace:
                return pr.GetPodResourcesResponse(pod_resources=self._s.pod_resources(p))
        await context.abort(
            grpc.StatusCode.UNKNOWN,
            f"pod {request.pod_name} in namespace {request.pod_namespace} not found",
        )
        raise AssertionError("unreachable")


class PodResourcesServer:
    """Serves ``v1.PodResourcesLister`` on ``socket_path`` (mode 0600)."""

    def __init__(
        self,
        socket_path: Path,
        manager: DeviceManager,
        pods: Callable[[], list[PodSpec]],
        *,
        qps: float = 100.0,
        burst: int = 10,
    ) -> None:
        self.socket_path = socket_path
        self.manager = manager
        self.pods = pods
        self._bucket = _TokenBucket(qps, burst)
        self._server: aio.Server | None = None

    async def limit(self, context: aio.ServicerContext[object, object]) -> None:
        """Abort with RESOURCE_EXHAUSTED when over the kubelet's rate limit."""
        if not self._bucket.allow():
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "rejected by rate limit")

    def pod_resources(self, p: PodSpec) -> pr.PodResources:
        """One pod as PodResources reports it."""
        out = pr.PodResources(name=p.name, namespace=p.namespace)
        for c in p.containers:
            if c.kind == "init":
                continue
            cr = out.containers.add(name=c.name)
            for res, a in sorted(self.manager.container_devices(p.uid, c.name).items()):
                cr.devices.extend(_device_elements(res, a.by_numa))
        return out

    async def start(self) -> None:
        """Bind and serve (removes a stale socket first)."""
        self._server = await serve_grpc(
            self.socket_path,
            lambda server: pr_grpc.add_PodResourcesListerServicer_to_server(
                _Servicer(self), server
            ),
        )

    async def stop(self) -> None:
        """Stop serving and remove the socket."""
        server, self._server = self._server, None
        await stop_grpc(server, self.socket_path)

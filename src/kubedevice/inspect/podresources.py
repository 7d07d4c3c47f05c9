"""Read the kubelet's PodResources v1 API: who holds which device, and what is allocatable."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc import aio

from kubedevice._api import pr, pr_grpc
from kubedevice.inspect.probe import numa_counts

__all__ = ["AssignedDevices", "PodResourcesView", "read_pod_resources"]


@dataclass(frozen=True, slots=True)
class AssignedDevices:
    """One container's devices of one resource, as PodResources ``List`` reports them."""

    namespace: str
    pod: str
    container: str
    resource: str
    device_ids: tuple[str, ...]


@dataclass(slots=True)
class PodResourcesView:
    """The answers of ``List`` and ``GetAllocatableResources`` (or why they are missing)."""

    socket: Path
    assigned: list[AssignedDevices] = field(default_factory=list)
    #: resource -> allocatable device IDs: the kubelet's healthy devices, those in use
    #: included (``None``: the call failed or is not served)
    allocatable: dict[str, list[str]] | None = None
    #: resource -> device count per NUMA node ("none": no topology), from the same answer
    allocatable_numa: dict[str, dict[str, int]] = field(default_factory=dict)
    list_error: str | None = None
    allocatable_error: str | None = None
    seconds: float = 0.0

    def owner(self, resource: str) -> dict[str, AssignedDevices]:
        """Device ID -> the container holding it, for ``resource``."""
        return {d: a for a in self.assigned if a.resource == resource for d in a.device_ids}


def _error(rpc: str, exc: aio.AioRpcError, timeout: float) -> str:
    code = exc.code()
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return f"{rpc}: no answer within {timeout:g} s"
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return f"{rpc}: not served by this kubelet (UNIMPLEMENTED)"
    return f"{rpc}: {code.name}: {exc.details() or ''}".rstrip(": ")


async def read_pod_resources(socket: Path, timeout: float) -> PodResourcesView:  # noqa: ASYNC109
    """Call ``List`` and ``GetAllocatableResources`` on ``socket``, each bounded by ``timeout``.

    A ``List`` that gets no answer in time is not followed by ``GetAllocatableResources``
    (a server that does not answer one will not answer the other): the whole read then
    takes ``timeout``, and each error names the configured timeout.
    """
    start = time.monotonic()
    view = PodResourcesView(socket)
    options = [("grpc.max_receive_message_length", 16 * 1024 * 1024), ("grpc.enable_retries", 0)]
    async with aio.insecure_channel(f"unix://{socket}", options=options) as channel:
        stub = pr_grpc.PodResourcesListerStub(channel)
        try:
            listed = await stub.List(pr.ListPodResourcesRequest(), timeout=timeout)
            for pod in listed.pod_resources:
                for c in pod.containers:
                    by_resource: dict[str, list[str]] = {}
                    for d in c.devices:
                        by_resource.setdefault(d.resource_name, []).extend(d.device_ids)
                    for resource, ids in by_resource.items():
                        view.assigned.append(
                            AssignedDevices(
                                pod.namespace, pod.name, c.name, resource, tuple(dict.fromkeys(ids))
                            )
                        )
        except aio.AioRpcError as exc:
            view.list_error = _error("List", exc, timeout)
            if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                view.allocatable_error = "GetAllocatableResources: not asked (List got no answer)"
                view.seconds = time.monotonic() - start
                return view
        try:
            alloc = await stub.GetAllocatableResources(
                pr.AllocatableResourcesRequest(), timeout=timeout
            )
            per_resource: dict[str, dict[str, set[int]]] = {}
            for d in alloc.devices:  # a device on two NUMA nodes may be listed twice
                nodes = {n.ID for n in d.topology.nodes} if d.HasField("topology") else set()
                for i in d.device_ids:
                    per_resource.setdefault(d.resource_name, {}).setdefault(i, set()).update(nodes)
            view.allocatable = {k: list(v) for k, v in per_resource.items()}
            view.allocatable_numa = {
                k: numa_counts(tuple(sorted(n)) for n in v.values())
                for k, v in per_resource.items()
            }
        except aio.AioRpcError as exc:
            view.allocatable_error = _error("GetAllocatableResources", exc, timeout)
    view.seconds = time.monotonic() - start
    return view

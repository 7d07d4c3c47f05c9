"""The DRA kubelet-plugin services v1 and v1beta1, answered by one :class:`ClaimService`.

v1beta1 has the same messages (less ``Device.share_id``), so its requests are read as v1 and
the answers re-encoded. A bug of ours in a call is ``INTERNAL``; the daemon stays up.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any, TypeVar

import grpc

from kubedevice._api.dra.v1 import api_pb2 as v1, api_pb2_grpc as v1_grpc
from kubedevice._api.dra.v1beta1 import api_pb2 as v1beta1, api_pb2_grpc as v1beta1_grpc
from kubedevice.dra.node.service import ClaimService

__all__ = ["V1Servicer", "V1beta1Servicer"]

log = logging.getLogger(__name__)

_T = TypeVar("_T")


async def _guarded(context: grpc.aio.ServicerContext[Any, Any], call: Awaitable[_T]) -> _T:
    try:
        return await call
    except Exception as exc:  # a bug of ours: INTERNAL, the daemon stays up
        log.exception("DRA call failed")
        await context.abort(grpc.StatusCode.INTERNAL, f"{type(exc).__name__}: {exc}")
        raise  # unreachable: abort raises


def _deadline(context: Any) -> float | None:
    """The call's deadline on the loop's clock (``None``: the caller set none)."""
    left = context.time_remaining()
    return None if left is None else asyncio.get_running_loop().time() + left


class V1Servicer(v1_grpc.DRAPluginServicer):
    """``k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin``."""

    def __init__(self, service: ClaimService) -> None:
        self.service = service

    async def NodePrepareResources(
        self, request: v1.NodePrepareResourcesRequest, context: Any
    ) -> v1.NodePrepareResourcesResponse:
        return await _guarded(context, self.service.prepare(request, _deadline(context)))

    async def NodeUnprepareResources(
        self, request: v1.NodeUnprepareResourcesRequest, context: Any
    ) -> v1.NodeUnprepareResourcesResponse:
        return await _guarded(context, self.service.unprepare(request))


class V1beta1Servicer(v1beta1_grpc.DRAPluginServicer):
    """``k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin``: the v1 handler, re-encoded."""

    def __init__(self, service: ClaimService) -> None:
        self.service = service

    async def NodePrepareResources(
        self, request: v1beta1.NodePrepareResourcesRequest, context: Any
    ) -> v1beta1.NodePrepareResourcesResponse:
        converted = v1.NodePrepareResourcesRequest.FromString(request.SerializeToString())
        answer = await _guarded(context, self.service.prepare(converted, _deadline(context)))
        for claim in answer.claims.values():
            for device in claim.devices:
                device.ClearField("share_id")  # not in v1beta1
        return v1beta1.NodePrepareResourcesResponse.FromString(answer.SerializeToString())

    async def NodeUnprepareResources(
        self, request: v1beta1.NodeUnprepareResourcesRequest, context: Any
    ) -> v1beta1.NodeUnprepareResourcesResponse:
        converted = v1.NodeUnprepareResourcesRequest.FromString(request.SerializeToString())
        answer = await _guarded(context, self.service.unprepare(converted))
        return v1beta1.NodeUnprepareResourcesResponse.FromString(answer.SerializeToString())

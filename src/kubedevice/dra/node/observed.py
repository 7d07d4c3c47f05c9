"""The kubelet's calls to a DRA servicer (``v1`` or ``v1beta1``), observed on their way out.

:class:`ObservedServicer` wraps a servicer: each ``NodePrepareResources`` and
``NodeUnprepareResources`` is counted and timed by :class:`~kubedevice.dra.node.metrics.DraMetrics`
(when metrics are served), and the claims a prepare answered without an error are handed to
the :class:`~kubedevice.dra.api.status.ClaimStatusWriter` (when claim status is written),
which is also told when each call begins and ends (its writes give way to the calls).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kubedevice.dra.api.status import ClaimStatusWriter
    from kubedevice.dra.node.metrics import DraMetrics

__all__ = ["ObservedServicer"]


class ObservedServicer:
    """A DRA servicer whose calls are measured and whose prepared claims are reported.

    Args:
        inner: The servicer (``V1Servicer`` or ``V1beta1Servicer``).
        metrics: Counts and times the calls; ``None``: not measured.
        status: Told of each call and of the claims a prepare call prepared; ``None``: no
            claim status is written.
    """

    def __init__(
        self,
        inner: Any,
        metrics: DraMetrics | None = None,
        status: ClaimStatusWriter | None = None,
    ) -> None:
        self._inner = inner
        self._metrics = metrics
        self._status = status

    async def NodePrepareResources(self, request: Any, context: Any) -> Any:
        status = self._status
        if status is not None:
            status.call_started()
        try:
            call = self._inner.NodePrepareResources(request, context)
            if self._metrics is not None:
                answer = await self._metrics.measure("prepare", len(request.claims), call)
            else:
                answer = await call
            if status is not None:
                status.prepared([uid for uid, result in answer.claims.items() if not result.error])
            return answer
        finally:
            if status is not None:
                status.call_ended()

    async def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        status = self._status
        if status is not None:
            status.call_started()
        try:
            call = self._inner.NodeUnprepareResources(request, context)
            if self._metrics is not None:
                return await self._metrics.measure("unprepare", len(request.claims), call)
            return await call
        finally:
            if status is not None:
                status.call_ended()

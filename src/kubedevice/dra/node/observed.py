"""The kubelet's calls to a DRA servicer (``v1`` or ``v1beta1``), observed on their way out.

:class:`ObservedServicer` wraps a servicer: each ``NodePrepareResources`` and
``NodeUnprepareResources`` is counted and timed by :class:`~kubedevice.dra.node.metrics.DraMetrics`
(when metrics are served), and the claims a prepare answered without an error are handed to
the :class:`~kubedevice.dra.api.status.ClaimStatusWriter` (when claim status is written).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kubedevice.dra.node.metrics import DraMetrics

__all__ = ["ObservedServicer"]


class ObservedServicer:
    """A DRA servicer whose calls are measured and whose prepared claims are reported.

    Args:
        inner: The servicer (``V1Servicer`` or ``V1beta1Servicer``).
        metrics: Counts and times the calls; ``None``: not measured.
        prepared: Called with the UIDs of the claims a prepare call prepared.
    """

    def __init__(
        self,
        inner: Any,
        metrics: DraMetrics | None = None,
        prepared: Callable[[Iterable[str]], None] | None = None,
    ) -> None:
        self._inner = inner
        self._metrics = metrics
        self._prepared = prepared

    async def NodePrepareResources(self, request: Any, context: Any) -> Any:
        call = self._inner.NodePrepareResources(request, context)
        if self._metrics is not None:
            answer = await self._metrics.measure("prepare", len(request.claims), call)
        else:
            answer = await call
        if self._prepared is not None:
            self._prepared([uid for uid, result in answer.claims.items() if not result.error])
        return answer

    async def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        call = self._inner.NodeUnprepareResources(request, context)
        if self._metrics is not None:
            return await self._metrics.measure("unprepare", len(request.claims), call)
        return await call

"""A DRA driver's HTTP endpoint: Prometheus ``/metrics``, ``/healthz`` and ``/readyz``.

Served on ``--metrics-address`` (``HOST:PORT``) by the driver's own event loop, so an
answer also says the loop is not stuck; at most 64 connections at once, 5 s to send the
request (:mod:`kubedevice.plugin.statushttp`). ``prometheus_client`` is imported only when a
driver serves it; the metrics live in a registry of their own.

- ``/healthz``: 200 while the DRA socket is served and no background job has failed
  (the liveness probe); 503 otherwise, with the reason.
- ``/readyz``: 200 once the kubelet has registered the driver (the readiness probe).
- ``/metrics``: ``kubedevice_dra_requests_total`` (labels ``operation``: prepare or
  unprepare, ``result``: ok or error; one per claim), ``kubedevice_dra_request_seconds``
  (histogram per kubelet call), ``kubedevice_dra_requests_in_flight`` (claims),
  ``kubedevice_dra_errors_total`` (``operation``, ``kind``: ``claim``, an error answered
  for one claim; ``rpc``, a call that failed as a whole), ``kubedevice_dra_prepared_claims``,
  ``kubedevice_dra_prepared_devices``, ``kubedevice_dra_devices`` (``health``),
  ``kubedevice_dra_slice_writes_total``, ``kubedevice_dra_registrations_total`` and
  ``kubedevice_dra_health_streams``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Final, Protocol

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from kubedevice.dra.model.types import Device
    from kubedevice.dra.state.checkpoint import Checkpoint

__all__ = ["DraMetrics", "ServerState", "StatusEndpoint"]

log = logging.getLogger(__name__)

_BUCKETS: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class ServerState(Protocol):
    """What the metrics read of a running driver at each scrape (the ``DriverServer``)."""

    @property
    def checkpoint(self) -> Checkpoint: ...
    @property
    def devices(self) -> Mapping[str, Device]: ...
    @property
    def slice_writes(self) -> int: ...
    @property
    def registrations(self) -> int: ...
    @property
    def health_streams(self) -> int: ...


class _ClaimsAnswer(Protocol):
    @property
    def claims(self) -> Any: ...


class DraMetrics:
    """The request metrics (counted by :class:`~kubedevice.dra.node.observed.ObservedServicer`)
    and, read when scraped, the server's state.

    Args:
        server: The driver's server (its checkpoint, devices, publisher, registration).
        registry: Where to register; a fresh ``CollectorRegistry`` when ``None``.
    """

    def __init__(self, server: ServerState, registry: CollectorRegistry | None = None) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.server = server
        self.registry: CollectorRegistry = registry or CollectorRegistry(auto_describe=True)
        reg = self.registry
        self.requests = Counter(
            "kubedevice_dra_requests",
            "Claims the kubelet asked to prepare or unprepare, by result.",
            ["operation", "result"],
            registry=reg,
        )
        self.seconds = Histogram(
            "kubedevice_dra_request_seconds",
            "Time to answer one NodePrepareResources or NodeUnprepareResources call.",
            ["operation"],
            buckets=_BUCKETS,
            registry=reg,
        )
        self.in_flight = Gauge(
            "kubedevice_dra_requests_in_flight",
            "Claims being prepared or unprepared now.",
            ["operation"],
            registry=reg,
        )
        self.errors = Counter(
            "kubedevice_dra_errors",
            "Failures: kind claim (one claim's error answer) or rpc (the whole call failed).",
            ["operation", "kind"],
            registry=reg,
        )
        for op in ("prepare", "unprepare"):  # every series exists from the start
            for result in ("ok", "error"):
                self.requests.labels(op, result)
            for kind in ("claim", "rpc"):
                self.errors.labels(op, kind)
            self.seconds.labels(op)
            self.in_flight.labels(op)
        reg.register(_StateCollector(server))

    async def measure(
        self, operation: str, claims: int, call: Awaitable[_ClaimsAnswer]
    ) -> _ClaimsAnswer:
        """Await ``call`` (one kubelet call about ``claims`` claims), counting its answer."""
        gauge = self.in_flight.labels(operation)
        gauge.inc(claims)
        start = time.perf_counter()
        try:
            answer = await call
        except BaseException:
            self.errors.labels(operation, "rpc").inc()
            self.requests.labels(operation, "error").inc(claims)
            raise
        finally:
            gauge.dec(claims)
            self.seconds.labels(operation).observe(time.perf_counter() - start)
        failed = sum(1 for result in answer.claims.values() if result.error)
        self.requests.labels(operation, "ok").inc(len(answer.claims) - failed)
        if failed:
            self.requests.labels(operation, "error").inc(failed)
            self.errors.labels(operation, "claim").inc(failed)
        return answer


class _StateCollector:
    """What the server knows, read at each scrape."""

    def __init__(self, server: ServerState) -> None:
        self.server = server

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        s = self.server
        claims = list(s.checkpoint.claims.values())
        yield GaugeMetricFamily(
            "kubedevice_dra_prepared_claims", "Claims prepared on this node.", len(claims)
        )
        yield GaugeMetricFamily(
            "kubedevice_dra_prepared_devices",
            "Devices of the claims prepared on this node.",
            sum(len(c.devices) for c in claims),
        )
        devices = GaugeMetricFamily(
            "kubedevice_dra_devices", "The driver's devices, by health.", labels=["health"]
        )
        by_health: dict[str, int] = {"Healthy": 0, "Unhealthy": 0, "Unknown": 0}
        for device in s.devices.values():
            by_health[str(device.health)] += 1
        for health, count in by_health.items():
            devices.add_metric([health], count)
        yield devices
        yield CounterMetricFamily(
            "kubedevice_dra_slice_writes",
            "ResourceSlices created, replaced or deleted.",
            s.slice_writes,
        )
        yield CounterMetricFamily(
            "kubedevice_dra_registrations",
            "Times the kubelet registered the driver.",
            s.registrations,
        )
        yield GaugeMetricFamily(
            "kubedevice_dra_health_streams", "Open health streams.", s.health_streams
        )


class StatusEndpoint:
    """The HTTP server of ``/metrics``, ``/healthz`` and ``/readyz`` on the event loop, with
    bounded connections (:mod:`kubedevice.plugin.statushttp`).

    Args:
        address: ``HOST:PORT`` (``:PORT`` is every address; port 0 picks a free one).
        metrics: The metrics to expose.
        live: ``None`` when live, else why not.
        ready: ``None`` when ready, else why not.
    """

    def __init__(
        self,
        address: str,
        metrics: DraMetrics,
        live: Callable[[], str | None],
        ready: Callable[[], str | None],
    ) -> None:
        from kubedevice.plugin.metrics import parse_metrics_address
        from kubedevice.plugin.statushttp import StatusHttp

        host, port = parse_metrics_address(address)
        self.metrics = metrics
        self._live = live
        self._ready = ready
        self.http = StatusHttp(host, port, self._answer)

    @property
    def host(self) -> str:
        """The address listened on."""
        return self.http.host

    @property
    def port(self) -> int:
        """The port (the bound one once started)."""
        return self.http.port

    async def start(self) -> None:
        """Listen (``port`` is then the bound port).

        Raises:
            OSError: The address cannot be listened on.
        """
        await self.http.start()
        log.info("serving /metrics, /healthz and /readyz on %s:%d", self.host, self.port)

    async def stop(self) -> None:
        """Stop listening and close the connections."""
        await self.http.stop()

    async def _answer(self, path: str) -> tuple[int, str, bytes]:
        if path == "/metrics":
            from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

            return 200, CONTENT_TYPE_LATEST, generate_latest(self.metrics.registry)
        if path in ("/healthz", "/livez", "/readyz"):
            why = self._ready() if path == "/readyz" else self._live()
            if why is None:
                return 200, "text/plain", b"ok\n"
            return 503, "text/plain", f"{why}\n".encode()
        return 404, "text/plain", b"not found: /metrics, /healthz, /readyz\n"

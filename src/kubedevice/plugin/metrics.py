"""Prometheus metrics of one plugin server, in its own registry (never the global one).

``prometheus_client`` is imported only when a :class:`PluginMetrics` is created, so a
plugin that does not ask for metrics does not pay for the import.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from kubedevice.plugin.statushttp import StatusHttp

__all__ = ["PluginMetrics", "parse_metrics_address"]

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0, 5.0)


def parse_metrics_address(address: str) -> tuple[str, int]:
    """Split ``host:port`` (or ``:port``, or ``[v6]:port``) into a host and a port.

    Args:
        address: The address, as given to ``--metrics-address``.

    Returns:
        The host (``0.0.0.0`` when empty) and the port.

    Raises:
        ConfigError: It is not ``HOST:PORT`` with a port 0-65535.
    """
    from kubedevice.errors import ConfigError

    host, sep, port = address.rpartition(":")
    digits = port.lstrip("0") or "0"  # int() of thousands of digits raises, not refuses
    if (
        not sep
        or not port.isdigit()
        or not port.isascii()
        or len(digits) > 5
        or int(digits) > 65535
    ):
        shown = address if len(address) <= 80 else address[:80] + "..."
        raise ConfigError(
            f"metrics address: expected HOST:PORT with a port 0-65535 (got {shown!r})"
        )
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host or "0.0.0.0", int(digits)


class PluginMetrics:
    """The SDK's metrics for every plugin of one server, labelled by ``resource``.

    Metrics: ``kubedevice_plugin_registrations_total``,
    ``kubedevice_plugin_reregistrations_total``, ``kubedevice_plugin_allocate_total``,
    ``kubedevice_plugin_allocate_errors_total`` (label ``code``),
    ``kubedevice_plugin_allocate_seconds`` (histogram), ``kubedevice_plugin_devices``
    (label ``health``) and ``kubedevice_plugin_listandwatch_streams``.

    Args:
        registry: Where to register; a fresh ``CollectorRegistry`` when ``None``.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry: CollectorRegistry = registry or CollectorRegistry(auto_describe=True)
        reg = self.registry
        self._registrations = Counter(
            "kubedevice_plugin_registrations",
            "Successful Register calls to the kubelet.",
            ["resource"],
            registry=reg,
        )
        self._reregistrations = Counter(
            "kubedevice_plugin_reregistrations",
            "Successful Register calls after the first one (kubelet restarts, lost streams).",
            ["resource"],
            registry=reg,
        )
        self._allocations = Counter(
            "kubedevice_plugin_allocate", "Allocate RPCs received.", ["resource"], registry=reg
        )
        self._allocation_errors = Counter(
            "kubedevice_plugin_allocate_errors",
            "Allocate RPCs answered with an error, by gRPC status code.",
            ["resource", "code"],
            registry=reg,
        )
        self._allocate_seconds = Histogram(
            "kubedevice_plugin_allocate_seconds",
            "Time spent answering Allocate.",
            ["resource"],
            buckets=_LATENCY_BUCKETS,
            registry=reg,
        )
        self._devices = Gauge(
            "kubedevice_plugin_devices",
            "Devices in the current snapshot, by health.",
            ["resource", "health"],
            registry=reg,
        )
        self._streams = Gauge(
            "kubedevice_plugin_listandwatch_streams",
            "Open ListAndWatch streams.",
            ["resource"],
            registry=reg,
        )

    def registered(self, resource: str, count: int) -> None:
        """Record the ``count``-th successful registration of ``resource``."""
        self._registrations.labels(resource).inc()
        rereg = self._reregistrations.labels(resource)  # exported as 0 from the first one
        if count > 1:
            rereg.inc()

    def allocated(self, resource: str, seconds: float, error_code: str | None) -> None:
        """Record one Allocate RPC, its duration and its error code (``None`` if OK)."""
        self._allocations.labels(resource).inc()
        self._allocate_seconds.labels(resource).observe(seconds)
        if error_code is not None:
            self._allocation_errors.labels(resource, error_code).inc()

    def devices(self, resource: str, healthy: int, unhealthy: int) -> None:
        """Set the device counts of ``resource``'s current snapshot."""
        self._devices.labels(resource, "Healthy").set(healthy)
        self._devices.labels(resource, "Unhealthy").set(unhealthy)

    def streams(self, resource: str, open_streams: int) -> None:
        """Set the number of open ListAndWatch streams of ``resource``."""
        self._streams.labels(resource).set(open_streams)

    def forget(self, resource: str) -> None:
        """Drop the gauges of a removed resource (counters keep their history)."""
        for gauge, labels in (
            (self._devices, [(resource, "Healthy"), (resource, "Unhealthy")]),
            (self._streams, [(resource,)]),
        ):
            for label in labels:
                with contextlib.suppress(KeyError):
                    gauge.remove(*label)

    async def serve_http(self, address: str) -> StatusHttp:
        """Expose the registry over HTTP on ``address`` (``host:port`` or ``:port``) at
        ``/metrics``, on the running event loop, with bounded connections
        (:mod:`kubedevice.plugin.statushttp`).

        Args:
            address: Where to listen.

        Raises:
            ConfigError: ``address`` is not ``HOST:PORT``.
            OSError: It cannot be listened on.

        Returns:
            The HTTP server (``server_address`` is where it listens); ``await`` its
            ``stop()`` to stop.
        """
        from kubedevice.plugin.statushttp import StatusHttp

        host, port = parse_metrics_address(address)
        http = StatusHttp(host, port, self._answer)
        await http.start()
        return http

    async def _answer(self, path: str) -> tuple[int, str, bytes]:
        if path in ("/metrics", "/"):
            from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

            # in a thread: a collector may block (NVML, the kubelet's PodResources)
            text = await asyncio.to_thread(generate_latest, self.registry)
            return 200, CONTENT_TYPE_LATEST, text
        return 404, "text/plain", b"not found: /metrics\n"

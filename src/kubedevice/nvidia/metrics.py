"""Per-pod GPU metrics: a Prometheus collector reading NVML and the kubelet's PodResources.

Every scrape reports, per GPU, utilization, memory used/total, power, temperature and
health, labelled ``gpu`` (NVML index), ``uuid``, and the ``namespace``/``pod``/
``container`` holding it (empty when none does; one series per holder when replicas of
one GPU are held by several containers), plus a counter of XIDs by code (codes above 255
as ``other``, so the series stay bounded). No separate
exporter is needed.

NVML and PodResources are swept at most once per ``min_interval_s`` (1 s): scrapes in
between are answered from the last sweep. A GPU whose reading fails is reported with
its health only; a value NVML does not support is left out rather than reported as 0.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from pathlib import Path

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kubedevice.errors import NvmlError
from kubedevice.nvidia.backend import GpuInfo, GpuSample, NvmlBackend
from kubedevice.nvidia.podresources import ContainerRef, PodResourcesClient

__all__ = ["MAX_XID_LABEL", "METRIC_PREFIX", "GpuMetrics"]

log = logging.getLogger(__name__)

METRIC_PREFIX = "kubedevice_nvidia_gpu"
#: XID codes up to this are labelled by value (every XID NVIDIA documents is below 200);
#: larger (or negative) codes are counted as ``xid="other"``.
MAX_XID_LABEL = 255
_LABELS = ["gpu", "uuid", "namespace", "pod", "container"]
_NOBODY = ContainerRef("", "", "")


class GpuMetrics(Collector):
    """The GPU collector; registered in ``registry`` when one is given.

    Args:
        backend: An initialised NVML backend.
        gpus: The GPUs to report.
        pod_resources_socket: The kubelet's PodResources socket (``None``: no pod labels).
        resources: Resource names whose devices are GPUs or parts of GPUs.
        device_to_gpu: Maps a device ID of those resources to its GPU's UUID (replica
            ``<uuid>::<n>``, MIG UUID, index ...); ``None`` for an unknown ID.
        registry: Where to register (``None``: the caller registers it).
        min_interval_s: Sweep NVML and PodResources at most this often.
        clock: Monotonic seconds (tests).
    """

    def __init__(
        self,
        backend: NvmlBackend,
        gpus: Sequence[GpuInfo],
        pod_resources_socket: Path | None,
        resources: Collection[str],
        device_to_gpu: Callable[[str], str | None],
        *,
        registry: CollectorRegistry | None = None,
        min_interval_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        pod_resources_timeout_s: float = 2.0,
    ) -> None:
        self._backend = backend
        self._gpus = list(gpus)
        self._resources = list(resources)
        self._device_to_gpu = device_to_gpu
        self._client = (
            PodResourcesClient(pod_resources_socket, timeout_s=pod_resources_timeout_s)
            if pod_resources_socket is not None
            else None
        )
        self._min_interval = min_interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._sweep_lock = threading.Lock()
        self._health: dict[str, bool] = {}
        self._mps_faults: frozenset[str] = frozenset()
        self._xids: dict[tuple[str, str], int] = {}
        self._last_sweep: float | None = None
        self._samples: dict[str, GpuSample | None] = {}
        self._holders: dict[str, list[ContainerRef]] = {}
        self.sweeps = 0  # how many NVML sweeps were made (for tests and debugging)
        self._registry = registry
        if registry is not None:
            registry.register(self)

    # ---- called by the health code and the daemon

    def set_health(self, uuid: str, healthy: bool) -> None:
        """Record a GPU's health (reported as 1/0)."""
        with self._lock:
            self._health[uuid] = healthy

    def set_mps_faults(self, uuids: Collection[str]) -> None:
        """The GPUs whose MPS daemon died (``sharing.mps``): reported unhealthy too, whatever
        NVML says, until the fault clears."""
        with self._lock:
            self._mps_faults = frozenset(uuids)

    def record_xid(self, uuid: str, xid: int) -> None:
        """Count one XID of a GPU (or a MIG device's parent: pass the GPU's UUID).

        Codes up to :data:`MAX_XID_LABEL` are counted by value, others as ``other``: the
        label set stays bounded whatever NVML (or a fake) reports.
        """
        code = str(xid) if 0 <= xid <= MAX_XID_LABEL else "other"
        with self._lock:
            self._xids[(uuid, code)] = self._xids.get((uuid, code), 0) + 1

    def close(self) -> None:
        """Unregister and close the PodResources channel."""
        if self._registry is not None:
            self._registry.unregister(self)
            self._registry = None
        if self._client is not None:
            self._client.close()

    # ---- the collector

    def describe(self) -> Iterable[Metric]:
        """No description up front: the registry must not call collect() at register time."""
        return []

    def collect(self) -> Iterable[Metric]:
        """One scrape: sweep first if the last sweep is older than ``min_interval_s``.

        The sweep runs under its own lock, so set_health()/record_xid() never wait for
        NVML or the kubelet.
        """
        with self._sweep_lock:
            with self._lock:
                now = self._clock()
                due = self._last_sweep is None or now - self._last_sweep >= self._min_interval
                gpus = list(self._gpus)
            if due:
                samples, holders = self._sweep(gpus)
                with self._lock:
                    self._samples = samples
                    if holders is not None:  # else keep the last known pod labels
                        self._holders = holders
                    self._last_sweep = now
        with self._lock:
            gpus = list(self._gpus)
            samples = dict(self._samples)
            by_gpu = {k: list(v) for k, v in self._holders.items()}
            health = dict(self._health)
            health.update(dict.fromkeys(self._mps_faults, False))
            xids = dict(self._xids)
        return self._families(gpus, samples, by_gpu, health, xids)

    def _sweep(
        self, gpus: list[GpuInfo]
    ) -> tuple[dict[str, GpuSample | None], dict[str, list[ContainerRef]] | None]:
        self.sweeps += 1
        samples: dict[str, GpuSample | None] = {}
        for g in gpus:
            try:
                samples[g.uuid] = self._backend.sample(g.uuid)
            except NvmlError as e:
                log.debug("GPU sample failed: %s", e, extra={"uuid": g.uuid})
                samples[g.uuid] = None
        if self._client is None:
            return samples, {}
        found = self._client.holders(self._resources)
        if found is None:
            return samples, None
        by_gpu: dict[str, list[ContainerRef]] = {}
        for (_, dev_id), refs in found.items():
            uuid = self._device_to_gpu(dev_id)
            if uuid is None:
                continue
            lst = by_gpu.setdefault(uuid, [])
            lst.extend(r for r in refs if r not in lst)
        return samples, {u: sorted(refs) for u, refs in by_gpu.items()}

    def _families(
        self,
        gpus: list[GpuInfo],
        samples: dict[str, GpuSample | None],
        holders: dict[str, list[ContainerRef]],
        health: dict[str, bool],
        xids: dict[tuple[str, str], int],
    ) -> list[Metric]:
        def gauge(name: str, doc: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(f"{METRIC_PREFIX}_{name}", doc, labels=_LABELS)

        util = gauge("utilization_percent", "GPU utilization (percent of time a kernel ran)")
        mem_util = gauge("memory_utilization_percent", "GPU memory bandwidth utilization")
        used = gauge("memory_used_bytes", "GPU memory in use")
        total = gauge("memory_total_bytes", "GPU memory in total")
        power = gauge("power_watts", "GPU power draw")
        temp = gauge("temperature_celsius", "GPU temperature")
        healthy = gauge("healthy", "1 when the plugin reports the GPU Healthy, else 0")
        procs = gauge("processes", "Compute processes running on the GPU")
        for g in gpus:
            s = samples.get(g.uuid)
            for ref in holders.get(g.uuid) or [_NOBODY]:
                lv = [str(g.index), g.uuid, ref.namespace, ref.pod, ref.container]
                healthy.add_metric(lv, 1.0 if health.get(g.uuid, True) else 0.0)
                if s is None:
                    continue
                for fam, value in (
                    (util, s.utilization_gpu),
                    (mem_util, s.utilization_memory),
                    (used, s.memory_used),
                    (total, s.memory_total),
                    (power, None if s.power_mw is None else s.power_mw / 1000.0),
                    (temp, s.temperature_c),
                ):
                    if value is not None:
                        fam.add_metric(lv, float(value))
                procs.add_metric(lv, float(len(s.processes)))
        xid = CounterMetricFamily(
            f"{METRIC_PREFIX}_xid_errors",
            "XID errors NVML reported, by code",
            labels=["gpu", "uuid", "xid"],
        )
        index = {g.uuid: str(g.index) for g in gpus}
        for (uuid, code), count in sorted(xids.items()):
            xid.add_metric([index.get(uuid, ""), uuid, code], float(count))
        return [util, mem_util, used, total, power, temp, healthy, procs, xid]

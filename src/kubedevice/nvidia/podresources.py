"""A small client of the kubelet's PodResources v1 API: which container holds which device.

Blocking (it is called from the Prometheus scrape thread), one channel kept open, every
call bounded by a deadline. Only ``List`` is used; the kubelet rate-limits the API (100
queries a second), and the metrics module calls it at most once a second.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

import grpc

from kubedevice._api import pr, pr_grpc

__all__ = ["DEFAULT_POD_RESOURCES_SOCKET", "ContainerRef", "PodResourcesClient"]

log = logging.getLogger(__name__)

DEFAULT_POD_RESOURCES_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")


@dataclass(frozen=True, slots=True, order=True)
class ContainerRef:
    """A container of a pod."""

    namespace: str
    pod: str
    container: str


class PodResourcesClient:
    """``List`` on the kubelet's PodResources socket, reduced to device -> containers."""

    def __init__(
        self,
        socket: Path = DEFAULT_POD_RESOURCES_SOCKET,
        *,
        timeout_s: float = 2.0,
        meanwhile: str = "GPU metrics carry no pod labels until it answers",
    ):
        self.socket = Path(socket).absolute()  # gRPC's unix:// target needs an absolute path
        self.timeout_s = timeout_s
        self.meanwhile = meanwhile
        """What the logged failure says it costs."""
        self._lock = threading.Lock()
        self._channel: grpc.Channel | None = None
        self._stub: pr_grpc.PodResourcesListerStub | None = None
        self._warned = False

    def holders(
        self, resources: Collection[str]
    ) -> dict[tuple[str, str], list[ContainerRef]] | None:
        """``(resource, device_id) -> containers`` for devices of ``resources``.

        Returns ``None`` when the kubelet cannot be asked (no socket, timeout, error):
        the caller decides what to show; the failure is logged once until it recovers.
        """
        wanted = set(resources)
        try:
            with self._lock:
                stub = self._connect()
                resp = stub.List(pr.ListPodResourcesRequest(), timeout=self.timeout_s)
        except grpc.RpcError as e:
            self._fail(f"{e.code().name}: {e.details()}")
            return None
        except (OSError, ValueError) as e:
            self._fail(str(e))
            return None
        if self._warned:
            log.info("PodResources answers again", extra={"socket": str(self.socket)})
            self._warned = False
        out: dict[tuple[str, str], list[ContainerRef]] = {}
        for pod in resp.pod_resources:
            for c in pod.containers:
                ref = ContainerRef(pod.namespace, pod.name, c.name)
                for devs in c.devices:
                    if devs.resource_name not in wanted:
                        continue
                    for dev_id in devs.device_ids:
                        holders = out.setdefault((devs.resource_name, dev_id), [])
                        if ref not in holders:  # one element per NUMA node: dedupe
                            holders.append(ref)
        return out

    def close(self) -> None:
        """Close the channel (a later call opens a new one)."""
        with self._lock:
            if self._channel is not None:
                self._channel.close()
            self._channel = self._stub = None

    def _connect(self) -> pr_grpc.PodResourcesListerStub:
        if self._stub is None:
            self._channel = grpc.insecure_channel(
                f"unix://{self.socket}", options=[("grpc.enable_retries", 0)]
            )
            self._stub = pr_grpc.PodResourcesListerStub(self._channel)
        return self._stub

    def _fail(self, why: str) -> None:
        if not self._warned:
            log.warning(
                "cannot list pod resources: %s; %s",
                why,
                self.meanwhile,
                extra={"socket": str(self.socket)},
            )
            self._warned = True

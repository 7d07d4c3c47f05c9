"""The settings a running driver works with: names checked, every path derived once.

Built by :meth:`kubedevice.dra.DriverOptions.resolved`; the server, the publisher, the
checkpoint and the CDI writer take these, never the raw options.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kubedevice.dra.model.names import dra_socket_path, registration_socket_path
from kubedevice.dra.state.lock import CLAIMS_LOCK_FILE, LOCK_FILE, pod_lock_file

__all__ = ["CHECKPOINT_FILE", "Settings"]

#: The prepared-claim checkpoint, in the driver's plugin dir (``plugins/<driver>/``).
CHECKPOINT_FILE = "checkpoint.json"


@dataclass(frozen=True, slots=True)
class Settings:
    """Resolved driver settings (see :class:`kubedevice.dra.DriverOptions`)."""

    driver_name: str
    node_name: str
    kubelet_dir: Path
    cdi_dir: Path
    kubeconfig: Path | None
    publish: bool
    health: bool
    #: Faults whose taint is ``NoExecute`` (:mod:`kubedevice.dra.model.taints`).
    evict_on: frozenset[str] = frozenset()
    #: ``HOST:PORT`` for ``/metrics``, ``/healthz`` and ``/readyz`` (``None``: not served).
    metrics_address: str | None = None
    #: Write ``status.devices`` of the prepared claims (:mod:`kubedevice.dra.api.status`).
    claim_status: bool = True
    #: The total time of one API call, retries included (:mod:`kubedevice.dra.api.kube`).
    api_timeout: float = 30.0
    #: This instance's pod UID: its sockets are named by it, so that two instances run
    #: side by side in a rolling upgrade (empty: the fixed names, one instance per node).
    pod_uid: str = ""
    #: On stop, how long the calls in flight (their hooks) may still run, in seconds.
    stop_grace: float = 25.0

    @property
    def plugin_dir(self) -> Path:
        """``<kubelet dir>/plugins/<driver>/``: the DRA socket and the checkpoint."""
        return self.dra_socket.parent

    @property
    def dra_socket(self) -> Path:
        """The DRA services' socket (the registration's endpoint)."""
        return dra_socket_path(self.kubelet_dir, self.driver_name, self.pod_uid)

    @property
    def registration_socket(self) -> Path:
        """The Registration service's socket in the kubelet's ``plugins_registry/``."""
        return registration_socket_path(self.kubelet_dir, self.driver_name, self.pod_uid)

    @property
    def lock(self) -> Path:
        """The lock file an instance without a pod UID holds while it runs."""
        return self.plugin_dir / LOCK_FILE

    @property
    def pod_lock(self) -> Path:
        """The lock file an instance with a pod UID holds while it runs (one per pod UID)."""
        return self.plugin_dir / pod_lock_file(self.pod_uid)

    @property
    def claims_lock(self) -> Path:
        """The lock file held around each batch of claim work (every instance)."""
        return self.plugin_dir / CLAIMS_LOCK_FILE

    @property
    def checkpoint(self) -> Path:
        """The prepared-claim checkpoint file."""
        return self.plugin_dir / CHECKPOINT_FILE

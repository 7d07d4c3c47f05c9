"""The state of one DRA conformance run and the helpers every case uses.

``DraContext`` owns the driver's kubelet directory (``plugins_registry/``, ``plugins/``, a
CDI dir), the driver process (started with the command's templates filled in), the kit's
plugin watcher, the view of the API server's slices, the API fixtures, the call log and
the results. :meth:`DraContext.wait` waits on what those report (a registration, a slice
change, the driver's exit), never by polling.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubedevice.conformance.context import fmt
from kubedevice.conformance.dra.catalogue import DRA_CASES_BY_ID
from kubedevice.conformance.dra.cdi import CdiDir
from kubedevice.conformance.dra.fixtures import Fixtures
from kubedevice.conformance.dra.kube import KubeClient
from kubedevice.conformance.dra.kubelet import (
    HEALTH_SERVICE,
    V1,
    V1BETA1,
    Answer,
    CallLog,
    ClaimRef,
    DraClient,
    PluginWatcher,
    Registration,
)
from kubedevice.conformance.dra.slices import PublishedDevice, SliceView
from kubedevice.conformance.process import PluginProcess
from kubedevice.conformance.report import CaseResult, Outcome

__all__ = ["TEMPLATES", "DraContext", "DraOptions", "fmt"]

log = logging.getLogger(__name__)

#: What the command's arguments may name; each is replaced by the run's value.
TEMPLATES = {
    "{node}": "the Node's name",
    "{kubeconfig}": "a kubeconfig for the driver",
    "{kubelet_dir}": "the kubelet's root dir (its plugins_registry/ and plugins/)",
    "{registry_dir}": "<kubelet_dir>/plugins_registry",
    "{plugins_dir}": "<kubelet_dir>/plugins",
    "{cdi_dir}": "the CDI dir",
    "{pod_uid}": "this instance's pod UID (a second instance gets another)",
}

#: Contract limits (seconds); each wait uses min(limit, --timeout) where it is a bound.
START_S = 30.0
FAST_S = 5.0
SIGTERM_S = 30.0
#: Slices back after a deletion: the upstream Go helper waits 30 s before it syncs a pool
#: whose slice was deleted (the kubelet's wipe at unregistration may be under way).
BACK_S = 45.0
#: --timeout of a DRA run (the device-plugin kit's is 30 s).
DRA_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class DraOptions:
    """How a run is made: the driver command and where its API server is."""

    command: tuple[str, ...]
    log_path: Path
    kubeconfig: Path | None = None
    k8s_bin: Path | None = None
    node_name: str | None = None
    driver_name: str | None = None
    timeout: float = DRA_TIMEOUT_S
    quick: bool = False
    claim_config: dict[str, Any] | None = None
    env: tuple[tuple[str, str], ...] = ()
    host_root: Path = Path("/")
    #: Set only for the overlap case: how the driver lets itself be slowed (VAR=VALUE).
    slow_env: tuple[tuple[str, str], ...] = ()


@dataclass
class Instance:
    """One driver process and its pod UID."""

    proc: PluginProcess
    pod_uid: str
    started: float = 0.0


@dataclass
class Learned:
    """What the run learned of the driver."""

    driver: str = ""
    registration: Registration | None = None
    endpoint: Path | None = None
    versions: tuple[str, ...] = ()
    first_slice_s: float | None = None
    idle_cpu: str = ""
    rss: float | None = None
    kept: list[tuple[ClaimRef, Answer]] = field(default_factory=list)
    #: The CDI IDs in the CDI dir before each claim (by UID) was first prepared.
    before: dict[str, set[str]] = field(default_factory=dict)

    @property
    def health(self) -> bool:
        """The driver offers the health stream."""
        return HEALTH_SERVICE in self.versions

    @property
    def version(self) -> str:
        """The DRA service version the kubelet would call (v1 when offered)."""
        return V1 if V1 in self.versions or V1BETA1 not in self.versions else V1BETA1


class DraContext:
    """One run: dirs, driver process, watcher, slices, fixtures, results."""

    def __init__(
        self, opts: DraOptions, root: Path, kube: KubeClient, driver_kubeconfig: Path | None
    ) -> None:
        self.opts = opts
        self.root = root
        self.kubelet_dir = root  # short: socket paths must stay under 108 bytes
        self.registry = self.kubelet_dir / "plugins_registry"
        self.plugins = self.kubelet_dir / "plugins"
        self.cdi = CdiDir(root / "cdi", opts.host_root)
        for d in (self.registry, self.plugins, self.cdi.path):
            d.mkdir(parents=True, mode=0o750)
        self.kube = kube
        self.driver_kubeconfig = driver_kubeconfig
        self.node = opts.node_name or f"kd-conformance-{uuid.uuid4().hex[:8]}"
        self.fixtures = Fixtures(kube, self.node)
        self.calls = CallLog()
        self.results: list[CaseResult] = []
        self.learned = Learned()
        self.audit_log: Path | None = None
        self._changed = asyncio.Event()
        self.watcher = PluginWatcher(self.registry, self.poke)
        self.slices = SliceView(kube, self.poke)
        self.instance = self.new_instance()
        self._exit_watches: list[asyncio.Task[Any]] = []

    # ---- the driver process

    def new_instance(
        self, pod_uid: str | None = None, extra_env: dict[str, str] | None = None
    ) -> Instance:
        """A driver process (not started) with its own pod UID (and ``extra_env``)."""
        pod_uid = pod_uid or str(uuid.uuid4())
        templates = {
            "{node}": self.node,
            "{kubeconfig}": str(self.driver_kubeconfig or ""),
            "{kubelet_dir}": str(self.kubelet_dir),
            "{registry_dir}": str(self.registry),
            "{plugins_dir}": str(self.plugins),
            "{cdi_dir}": str(self.cdi.path),
            "{pod_uid}": pod_uid,
        }
        env = {"NODE_NAME": self.node, **dict(self.opts.env), **(extra_env or {})}
        if self.driver_kubeconfig is not None:
            env["KUBECONFIG"] = str(self.driver_kubeconfig)
        proc = PluginProcess(
            self.opts.command, None, self.opts.log_path, templates=templates, env=env
        )
        return Instance(proc, pod_uid)

    @property
    def proc(self) -> PluginProcess:
        """The current driver process."""
        return self.instance.proc

    async def start(self, instance: Instance | None = None) -> float:
        """Start ``instance`` (default: the current one); the monotonic start time."""
        instance = instance or self.instance
        instance.started = time.monotonic()
        await instance.proc.start()
        self._exit_watches.append(asyncio.ensure_future(self._on_exit(instance.proc)))
        return instance.started

    async def _on_exit(self, proc: PluginProcess) -> None:
        await proc.wait_exit(24 * 3600.0)
        self.poke()

    async def stop_all(self) -> None:
        """Stop every watch task (the processes are stopped by the runner)."""
        for task in self._exit_watches:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def usable(self) -> bool:
        """The driver runs and registered: the cases that call it can run."""
        return self.proc.alive and self.learned.endpoint is not None

    def client(self) -> DraClient:
        """A DRA client on the registered endpoint."""
        assert self.learned.endpoint is not None
        return DraClient(self.learned.endpoint, self.calls)

    # ---- waiting

    def poke(self) -> None:
        """Something changed: wake the waiters."""
        self._changed.set()

    async def wait(self, predicate: Callable[[], object], limit: float) -> bool:
        """Wait up to ``limit`` s for ``predicate()`` (re-checked on every change)."""
        deadline = time.monotonic() + limit
        while True:
            self._changed.clear()
            if predicate():
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), left)

    def cap(self, limit: float) -> float:
        """A contract limit capped by --timeout."""
        return min(limit, self.opts.timeout)

    # ---- results

    def add(
        self, case_id: str, outcome: Outcome, evidence: str, started: float | None = None
    ) -> None:
        """Record one case's outcome (``started``: when the case began, monotonic)."""
        duration = 0.0 if started is None else time.monotonic() - started
        self.results.append(CaseResult(DRA_CASES_BY_ID[case_id], outcome, evidence, None, duration))
        # as each case ends (the table comes at the end): a run stopped halfway still tells
        # how far it got and what failed
        log.info("%s %s: %s", outcome.value.upper(), case_id, evidence)

    def check(self, case_id: str, problem: str, good: str, started: float | None = None) -> None:
        """PASS with ``good`` when ``problem`` is empty, else FAIL with ``problem``."""
        self.add(case_id, Outcome.FAIL if problem else Outcome.PASS, problem or good, started)

    def skip(self, case_ids: Sequence[str], why: str) -> None:
        """Skip each case (unless it already has a result)."""
        done = {r.case.id for r in self.results}
        for case_id in case_ids:
            if case_id not in done:
                self.add(case_id, Outcome.SKIP, why)

    def has(self, case_id: str) -> bool:
        """The case has a result already."""
        return any(r.case.id == case_id for r in self.results)

    # ---- the driver's devices

    def pool_complete(self) -> bool:
        """The driver's slices on the node form complete pools (all slices of a generation)."""
        mine = self.slices.of(self.learned.driver, self.node)
        if not mine:
            return False
        pools: dict[str, list[dict[str, Any]]] = {}
        for s in mine:
            pools.setdefault(str(s["spec"].get("pool", {}).get("name", "")), []).append(s)
        for slices in pools.values():
            top = max(int(s["spec"]["pool"].get("generation", 0)) for s in slices)
            current = [s for s in slices if int(s["spec"]["pool"].get("generation", 0)) == top]
            if len(current) != int(current[0]["spec"]["pool"].get("resourceSliceCount", 0)):
                return False
        return True

    def devices(self) -> list[PublishedDevice]:
        """The driver's published devices on the node."""
        return self.slices.devices(self.learned.driver, self.node)

    def why_no_device(self) -> str:
        """Evidence for a case that found no device to allocate."""
        if not self.devices():
            return "no published device (the driver's slices are gone)"
        return "no free device"

    def device_count(self) -> int:
        """How many devices the driver publishes on the node."""
        return self.slices.device_count(self.learned.driver, self.node)

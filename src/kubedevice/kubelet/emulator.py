"""The emulator's façade: ``Emulator`` wires registration, manager, admission and sockets.

Start-up follows the kubelet (contract.md#kubelet-start-up): read the checkpoint (a corrupt
or foreign one is moved aside and the emulator starts empty), remove every socket directly
in the device-plugin dir (nothing else), restore allocations and stopped resources, then serve
``Registration`` on ``kubelet.sock`` and PodResources next to it. Pods are held in memory
(the emulator plays the API server too); with the control socket enabled they are also
journaled next to it so that they survive a process restart. Every state change wakes
``wait_until`` waiters; nothing polls.

Why this module is over 600 lines: it is the one place where the kubelet's start-up, stop and
pod life cycle are ordered; its parts (registration, manager, admission, checkpoint, sockets)
already live in their own modules, and splitting the ordering itself would hide it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import stat
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from kubedevice._api import CHECKPOINT_FILE, DIAL_TIMEOUT_S, KUBELET_SOCKET
from kubedevice._regular_file import NotRegularFileError, open_regular, read_regular
from kubedevice.errors import AdmissionError, CheckpointError, EmulatorError, ManifestError
from kubedevice.kubelet.admission import POLICIES, SCOPES, Admitter, StartResult
from kubedevice.kubelet.checkpoint import CheckpointWriter, write_atomic
from kubedevice.kubelet.control import CLIENT_GONE, ControlServer, control_socket_path, state_dir
from kubedevice.kubelet.endpoint import PluginEndpoint, allocation_from_bytes
from kubedevice.kubelet.events import EventLog, Notifier
from kubedevice.kubelet.manager import CHECKPOINT_INTERVAL_S, DeviceManager
from kubedevice.kubelet.podresources import PodResourcesServer
from kubedevice.kubelet.pods import ContainerSpec, PodSpec, load_manifests, parse_pod
from kubedevice.kubelet.registration import RegistrationServer
from kubedevice.kubelet.runtime import merge_allocations
from kubedevice.kubelet.types import (
    AdmissionEvent,
    ContainerAllocation,
    ContainerStatus,
    KubeletStartedEvent,
    NodeStatus,
    PodStatus,
    ReadmissionEvent,
    ResourceStatus,
    to_jsonable,
)

__all__ = ["READMIT_AFTER_S", "Emulator"]

log = logging.getLogger(__name__)

#: Seconds from a (re)start to the re-admission of the pods (the kubelet's pod sources sync
#: about a second after it starts).
READMIT_AFTER_S = 1.0
#: A pod journal larger than this is not replayed (each pod is a few hundred bytes).
_MAX_JOURNAL_BYTES = 64 * 1024 * 1024


@dataclass(slots=True)
class _Pod:
    spec: PodSpec
    started: dict[str, StartResult] = field(default_factory=dict)


class Emulator:
    """The kubelet device manager, emulated in-process (async context manager).

    Args:
        device_plugin_dir: the directory plugins put their sockets in (``kubelet.sock`` and
            ``kubelet_internal_checkpoint`` live here too). Give each emulator its own
            directory, ideally a sub-directory (e.g. ``<tmp>/device-plugins``): the
            PodResources socket and the control socket are derived from its parent.
        grace_period_s: how long a disconnected resource is kept (kubelet: 5 min).
        per_socket_clients: key plugin clients by (resource, socket) like the 2026 fix
            (kubernetes PR #135437) instead of by resource name (kubernetes#121994).
        pod_resources_socket: PodResources socket; default ``DIR/../pod-resources/kubelet.sock``.
        control_socket: serve the CLI control socket (``control.control_socket_path``) and
            journal pods next to it.
        dial_timeout_s: the kubelet's dial deadline during Register (10 s).
        pod_resources_qps, pod_resources_burst: the PodResources rate limit (100, 10).
        started_ns: when this kubelet "started" (wall clock, ns; default: now). The
            start-up cleanup removes only sockets older than that, so a plugin started
            together with the emulator keeps its socket; the CLI passes its process start.
        topology_manager_policy: ``none`` (the kubelet's default: no NUMA hint, the whole
            available set is offered to GetPreferredAllocation), ``best-effort``,
            ``restricted`` or ``single-numa-node`` (the last two refuse a pod with
            ``TopologyAffinityError``).
        topology_manager_scope: ``container`` (default) or ``pod``.
        checkpoint_interval_s: device-set changes reach the checkpoint at most this often
            (coalesced; allocations are always written at once).
        readmit_after_s: this long after each (re)start with pods, the pods are admitted
            again as the kubelet does once its pod sources have synced (about a second):
            a pod whose init container holds devices (finished, so not running) is
            rejected with ``UnexpectedAdmissionError`` when that resource has no healthy
            devices by then (its plugin not back yet). ``None``: never.
    """

    def __init__(
        self,
        device_plugin_dir: str | Path,
        *,
        grace_period_s: float = 300.0,
        per_socket_clients: bool = False,
        pod_resources_socket: Path | None = None,
        control_socket: bool = True,
        dial_timeout_s: float = DIAL_TIMEOUT_S,
        pod_resources_qps: float = 100.0,
        pod_resources_burst: int = 10,
        started_ns: int | None = None,
        topology_manager_policy: str = "none",
        topology_manager_scope: str = "container",
        checkpoint_interval_s: float = CHECKPOINT_INTERVAL_S,
        readmit_after_s: float | None = READMIT_AFTER_S,
    ) -> None:
        self.checkpoint_interval_s = checkpoint_interval_s
        self.readmit_after_s = readmit_after_s
        self._readmit: asyncio.Task[None] | None = None
        if topology_manager_policy not in POLICIES:
            raise EmulatorError(f"unknown topology manager policy {topology_manager_policy!r}")
        if topology_manager_scope not in SCOPES:
            raise EmulatorError(f"unknown topology manager scope {topology_manager_scope!r}")
        self.topology_manager_policy = topology_manager_policy
        self.topology_manager_scope = topology_manager_scope
        #: Sockets made after this instant (wall clock, ns) survive the start-up cleanup.
        self.started_ns = started_ns if started_ns is not None else time.time_ns()
        self.device_plugin_dir = Path(device_plugin_dir).absolute()
        self.kubelet_socket = self.device_plugin_dir / KUBELET_SOCKET
        self.checkpoint_path = self.device_plugin_dir / CHECKPOINT_FILE
        self.pod_resources_socket = Path(
            pod_resources_socket
            if pod_resources_socket is not None
            else self.device_plugin_dir.parent / "pod-resources" / "kubelet.sock"
        )
        self.control_socket: Path | None = (
            control_socket_path(self.device_plugin_dir) if control_socket else None
        )
        self.grace_period_s = grace_period_s
        self.per_socket_clients = per_socket_clients
        self.dial_timeout_s = dial_timeout_s
        self._pr_limit = (pod_resources_qps, pod_resources_burst)
        #: Problems met reading checkpoints (each also logged); the file was moved aside.
        self.checkpoint_errors: list[str] = []
        self._notifier: Notifier | None = None
        self._events: EventLog | None = None
        self._manager: DeviceManager | None = None
        self._admitter: Admitter | None = None
        self._registration: RegistrationServer | None = None
        self._podresources: PodResourcesServer | None = None
        self._control: ControlServer | None = None
        self._pods: dict[tuple[str, str], _Pod] = {}
        self._admit_lock: asyncio.Lock | None = None
        self._running = False
        self._gc_clean = False
        self._journal: Path | None = None
        if control_socket:
            self._journal = (
                state_dir(self.device_plugin_dir) / f"{self.device_plugin_dir.name}.pods.jsonl"
            )

    # ------------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> Emulator:
        await self.start()
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    @property
    def events(self) -> EventLog:
        """Append-only log of typed event records (monotonic timestamps)."""
        if self._events is None:
            self._notifier = Notifier()
            self._events = EventLog(self._notifier)
        return self._events

    @property
    def _m(self) -> DeviceManager:
        if self._manager is None:
            raise EmulatorError("the emulator is not started")
        return self._manager

    async def start(self) -> None:
        """Read the checkpoint, clean the dir, serve kubelet.sock, PodResources and control."""
        if self._running:
            raise EmulatorError("the emulator is already running")
        events = self.events
        assert self._notifier is not None
        self._admit_lock = asyncio.Lock()
        self._manager = DeviceManager(
            self.device_plugin_dir,
            CheckpointWriter(self.checkpoint_path),
            events,
            self._notifier,
            grace_period_s=self.grace_period_s,
            per_socket_clients=self.per_socket_clients,
            checkpoint_interval_s=self.checkpoint_interval_s,
        )
        self._admitter = Admitter(
            self._manager, self.topology_manager_policy, self.topology_manager_scope
        )
        if self.control_socket is not None:
            self._control = ControlServer(
                self.control_socket, self._handle_control, self.pending_text
            )
            await self._control.start()
        try:
            self._replay_journal()
            await self._start_kubelet(restart=False)
            self._reconcile()
            self._schedule_readmission()
        except BaseException:
            await self._stop_kubelet()
            if self._control is not None:
                await self._control.stop()
                self._control = None
            raise
        self._running = True

    async def stop(self) -> None:
        """Disconnect every plugin and stop serving (idempotent)."""
        if not self._running:
            return
        self._running = False
        await self._stop_kubelet()
        if self._control is not None:
            await self._control.stop()
            self._control = None

    async def restart(self) -> None:
        """Simulate a kubelet restart: disconnect plugins, wipe sockets, re-read the checkpoint."""
        if not self._running:
            raise EmulatorError("the emulator is not running")
        async with self._turn("kubelet restart"):  # no admission half-way through it
            await self._stop_kubelet()
            await self._start_kubelet(restart=True)
            self._schedule_readmission()

    def _schedule_readmission(self) -> None:
        if self.readmit_after_s is not None and self._pods:
            self._readmit = asyncio.create_task(
                self._readmit_later(self.readmit_after_s), name="re-admission"
            )

    async def _readmit_later(self, delay: float) -> None:
        # this task's own copy of the context: the restart's control client, which may be
        # gone by now, is not the one waiting here
        CLIENT_GONE.set(lambda: False)
        await asyncio.sleep(delay)  # the modelled pod-source sync of a starting kubelet
        try:
            await self.readmit()
        except Exception:  # a bug here must not vanish in a task nobody awaits
            log.exception("re-admission of the pods failed")

    async def readmit(self) -> ReadmissionEvent:
        """Admit every pod again now, as a starting kubelet does once its pod sources synced.

        Done on its own ``readmit_after_s`` after each (re)start; a pod the device manager
        refuses now (see the constructor) is removed, its devices freed, and an
        ``UnexpectedAdmissionError`` admission event recorded.
        """
        async with self._turn("re-admission of running pods"):
            rejected: list[str] = []
            for key, pod in sorted(self._pods.items()):
                error = self._readmission_error(pod.spec)
                if error is None:
                    continue
                rejected.append(f"{pod.spec.namespace}/{pod.spec.name}")
                message = f"Allocate failed due to {error}, which is unexpected"
                log.warning(
                    "pod %s/%s rejected at re-admission: UnexpectedAdmissionError: %s",
                    pod.spec.namespace,
                    pod.spec.name,
                    message,
                )
                del self._pods[key]
                self._m.remove_pod(pod.spec.uid)
                self._journal_write({"del": pod.spec.uid})
                self.events.append(
                    AdmissionEvent(
                        t=self.events.now(),
                        pod=pod.spec.name,
                        namespace=pod.spec.namespace,
                        reason="UnexpectedAdmissionError",
                        message=message,
                    )
                )
            event = ReadmissionEvent(
                t=self.events.now(), kept=len(self._pods), rejected=tuple(rejected)
            )
            self.events.append(event)
            return event

    def _readmission_error(self, spec: PodSpec) -> str | None:
        """The device manager's refusal of a pod admitted again, if any.

        Running containers are skipped (their devices stay); an init container has
        finished, so its devices go through the checks of ``devicesToAllocate``.
        """
        m = self._m
        for c in spec.containers:
            if c.kind != "init":
                continue
            held = m.container_devices(spec.uid, c.name)
            for res, n in sorted(c.limits.items()):
                if n <= 0:
                    continue
                r = m.resources.get(res)
                if r is None:
                    return f"cannot allocate unregistered device {res}"
                if not r.healthy:
                    return f"no healthy devices present; cannot allocate unhealthy devices {res}"
                if res in held and not set(held[res].device_ids) <= r.healthy:
                    return (
                        "previously allocated devices are no longer healthy; cannot "
                        f"allocate unhealthy devices {res}"
                    )
        return None

    async def _start_kubelet(self, *, restart: bool) -> None:
        m = self._m
        d = self.device_plugin_dir
        d.mkdir(parents=True, exist_ok=True, mode=0o750)
        data = None
        try:
            data = m.read_checkpoint(self.checkpoint_path)
        except CheckpointError as exc:
            aside = _aside_name(self.checkpoint_path)
            with contextlib.suppress(OSError):
                os.replace(self.checkpoint_path, aside)
            msg = f"{exc}; moved aside to {aside.name}, starting empty"
            self.checkpoint_errors.append(msg)
            log.error("failed to read checkpoint: %s", msg)
        self._cleanup_sockets(time.time_ns() if restart else self.started_ns)
        self._gc_clean = False
        m.reset()
        if data is not None:
            m.restore(data)
        else:
            m.write_checkpoint()
        self._registration = RegistrationServer(
            self.kubelet_socket, self.events, m.plugin_connected, dial_timeout_s=self.dial_timeout_s
        )
        await self._registration.start()
        self._podresources = PodResourcesServer(
            self.pod_resources_socket,
            m,
            self._pod_specs,
            qps=self._pr_limit[0],
            burst=self._pr_limit[1],
        )
        await self._podresources.start()
        self.events.append(
            KubeletStartedEvent(
                t=self.events.now(), socket=str(self.kubelet_socket), restart=restart
            )
        )
        log.debug("Registration served", extra={"socket": str(self.kubelet_socket)})

    async def _stop_kubelet(self) -> None:
        if self._readmit is not None:
            self._readmit.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._readmit
            self._readmit = None
        if self._registration is not None:
            await self._registration.stop()
            self._registration = None
        if self._manager is not None:
            await self._manager.disconnect_all()
        if self._podresources is not None:
            await self._podresources.stop()
            self._podresources = None

    def _cleanup_sockets(self, before_ns: int) -> None:
        # The kubelet's CleanupPluginDirectory removes every socket before Registration is
        # served. Here only those that existed before this kubelet started (the previous
        # generation's) go: a plugin that starts together with the emulator and made its
        # socket meanwhile cannot have registered yet and must not lose it. (The stat is
        # made now, after the listing: a socket replaced since then is new, so kept.)
        for entry in os.scandir(self.device_plugin_dir):
            try:
                st = entry.stat(follow_symlinks=False)
                if not stat.S_ISSOCK(st.st_mode):
                    continue
                if st.st_ctime_ns > before_ns:
                    log.debug("keeping %s: made after the emulator started", entry.path)
                    continue
                os.unlink(entry.path)
            except FileNotFoundError:
                continue

    # ------------------------------------------------------------------ node

    def node(self) -> NodeStatus:
        """Per resource: capacity, allocatable, devices (id, health, NUMA)."""
        self._m.flush_checkpoint()  # what the caller sees is on disk too
        return self._m.node()

    async def wait_until(self, predicate: Callable[[], bool], timeout: float) -> None:  # noqa: ASYNC109
        """Return once ``predicate()`` holds (re-checked on each change); else TimeoutError.

        A device-set change waiting for its (coalesced) checkpoint write is written first,
        so the checkpoint on disk agrees with what the predicate saw.
        """
        self.events  # noqa: B018 - make sure the notifier exists
        assert self._notifier is not None
        try:
            await self._notifier.wait_until(predicate, timeout)
        finally:
            if self._manager is not None:
                self._manager.flush_checkpoint()

    async def wait_for_resource(
        self,
        resource: str,
        *,
        allocatable: int | None = None,
        timeout: float = 5.0,  # noqa: ASYNC109
    ) -> ResourceStatus:
        """Wait until ``resource`` is listed (with ``allocatable`` devices if given)."""
        found: list[ResourceStatus] = []

        def check() -> bool:
            s = self._m.resource_status(resource)
            if s is None or (allocatable is not None and s.allocatable != allocatable):
                return False
            found.append(s)
            return True

        await self.wait_until(check, timeout)
        return found[-1]

    def endpoint(self, resource: str) -> PluginEndpoint:
        """The endpoint currently registered for ``resource`` (EmulatorError if none)."""
        ep = self._m.endpoint(resource)
        if ep is None:
            raise EmulatorError(f"no plugin endpoint for {resource}")
        return ep

    # ------------------------------------------------------------------ pods

    def _pod_specs(self) -> list[PodSpec]:
        return [p.spec for p in self._pods.values()]

    def _status(self, pod: _Pod) -> PodStatus:
        containers = []
        for c in pod.spec.containers:
            allocs = self._m.container_devices(pod.spec.uid, c.name)
            per_res: dict[str, ContainerAllocation] = {}
            for res, a in allocs.items():
                per_res[res] = (
                    allocation_from_bytes(a.response) if a.response else ContainerAllocation()
                )
            start = pod.started.get(c.name, StartResult(True))
            containers.append(
                ContainerStatus(
                    name=c.name,
                    kind=c.kind,
                    devices={r: allocs[r].device_ids for r in sorted(allocs)},
                    runtime=merge_allocations(per_res),
                    started=start.started,
                    start_error=start.error,
                )
            )
        return PodStatus(pod.spec.name, pod.spec.namespace, pod.spec.uid, tuple(containers))

    def pods(self) -> list[PodStatus]:
        """Every admitted pod with, per container, its devices and merged runtime view."""
        return [self._status(p) for _, p in sorted(self._pods.items())]

    def pod(self, name: str, namespace: str = "default") -> PodStatus:
        """One admitted pod (EmulatorError if absent)."""
        p = self._pods.get((namespace, name))
        if p is None:
            raise EmulatorError(f'pods "{name}" not found in namespace "{namespace}"')
        return self._status(p)

    async def apply_pod(self, manifest: Mapping[str, Any] | str) -> PodStatus:
        """Validate and admit one pod; ``ManifestError`` or ``AdmissionError`` on refusal."""
        if isinstance(manifest, str):
            docs = load_manifests(manifest)
            if len(docs) != 1:
                raise ManifestError(f"expected one object, found {len(docs)}")
            manifest = docs[0]
        spec = parse_pod(manifest)
        key = (spec.namespace, spec.name)
        assert self._admit_lock is not None
        assert self._admitter is not None
        async with self._turn(f"apply of pod {spec.namespace}/{spec.name}"):
            if key in self._pods:
                raise ManifestError(f'pods "{spec.name}" already exists')
            self._gc_allocations()
            try:
                self._check_known_resources(spec)
                await self._admitter.admit(spec)
            except AdmissionError as exc:
                # the kubelet logs each refused admission too ("Failed to admit pod")
                log.warning(
                    "pod %s/%s rejected: %s: %s", spec.namespace, spec.name, exc.reason, exc.message
                )
                self.events.append(
                    AdmissionEvent(
                        t=self.events.now(),
                        pod=spec.name,
                        namespace=spec.namespace,
                        reason=exc.reason,
                        message=exc.message,
                    )
                )
                raise
            pod = _Pod(spec)
            self._pods[key] = pod
            pod.started = await self._admitter.start_containers(spec)
            self._journal_write({"add": _spec_to_json(pod)})
            self.events.append(
                AdmissionEvent(t=self.events.now(), pod=spec.name, namespace=spec.namespace)
            )
        status = self._status(pod)
        for c in status.containers:
            for conflict in c.runtime.conflicts:  # the kubelet logs these as errors
                log.error(conflict, extra={"pod": spec.name, "container": c.name})
        return status

    @contextlib.asynccontextmanager
    async def _turn(self, what: str) -> AsyncIterator[None]:
        """Hold the admission lock. The kubelet sets no deadline on plugin RPCs, so a
        request may wait long behind a hung one; if its client gave up meanwhile it is
        dropped when its turn comes rather than run behind everyone's back."""
        lock = self._admit_lock
        assert lock is not None
        waited = lock.locked()
        async with lock:
            if waited and CLIENT_GONE.get()():
                log.warning("%s dropped: its client gave up while it waited", what)
                raise EmulatorError(f"{what} dropped: the client gave up while it waited")
            yield

    def pending_text(self) -> str | None:
        """What the emulator is waiting on, for a client that waits (None: nothing)."""
        if self._manager is None:
            return None
        now = time.monotonic()
        pending = self._manager.pending_rpcs()
        if not pending:
            return None
        rpc, resource, socket, start = pending[0]
        more = f" (and {len(pending) - 1} more)" if len(pending) > 1 else ""
        return (
            f"waiting for the plugin: {rpc} on {resource} (socket {socket}) has not "
            f"returned for {now - start:.0f} s{more}; the kubelet sets no deadline on it"
        )

    def _check_known_resources(self, spec: PodSpec) -> None:
        # A real kubelet silently skips an extended resource no plugin ever registered (the
        # scheduler would not have placed the pod); the emulator, being the scheduler too,
        # refuses it with the device manager's "unregistered" text instead.
        m = self._m
        for c in spec.containers:
            for res, n in sorted(c.limits.items()):
                if n > 0 and res not in m.resources and res not in m.allocated:
                    raise AdmissionError(
                        "UnexpectedAdmissionError",
                        f"Allocate failed due to cannot allocate unregistered device {res}, "
                        "which is unexpected",
                    )

    def _gc_allocations(self, why: str = "its pod is not known to the emulator") -> None:
        # Allocations of pods that are not (or no longer) known, e.g. restored from a
        # checkpoint without their pod, are garbage-collected at admission like the kubelet.
        # Each released entry is logged: a checkpoint from a real kubelet holds pods the
        # emulator never saw, and its allocations must not vanish unsaid.
        m = self._m
        if len(m.pod_devices) <= len(self._pods) and self._gc_clean:
            return
        live = {p.spec.uid for p in self._pods.values()}
        for uid in list(m.pod_devices):
            if uid not in live:
                for container, per_resource in sorted(m.pod_devices[uid].items()):
                    for resource, alloc in sorted(per_resource.items()):
                        log.warning(
                            "releasing the checkpoint's allocation of pod UID %s container "
                            "%s: %s %s (%s)",
                            uid,
                            container,
                            resource,
                            ",".join(alloc.device_ids) or "no devices",
                            why,
                        )
                m.remove_pod(uid)
        self._gc_clean = True

    async def delete_pod(self, name: str, namespace: str = "default") -> None:
        """Delete a pod and free its devices (EmulatorError if absent)."""
        async with self._turn(f"delete of pod {namespace}/{name}"):
            pod = self._pods.pop((namespace, name), None)
            if pod is None:
                raise EmulatorError(f'pods "{name}" not found in namespace "{namespace}"')
            self._m.remove_pod(pod.spec.uid)
            self._journal_write({"del": pod.spec.uid})

    # ------------------------------------------------------------------ journal

    def _journal_write(self, record: dict[str, Any]) -> None:
        if self._journal is None:
            return
        try:
            fd = open_regular(self._journal, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.fchmod(fd, 0o600)  # also a journal an older version left world-readable
                os.write(fd, (json.dumps(record) + "\n").encode())
            finally:
                os.close(fd)
        except OSError as exc:
            log.error("cannot write pod journal: %s", exc)

    def _replay_journal(self) -> None:
        if self._journal is None or self._pods:
            return
        try:
            raw = read_regular(self._journal, _MAX_JOURNAL_BYTES)
        except FileNotFoundError:
            return
        except NotRegularFileError as exc:
            aside = _aside_name(self._journal)
            with contextlib.suppress(OSError):
                os.replace(self._journal, aside)
            log.error(
                "pod journal %s %s; moved aside to %s, starting with no pods",
                self._journal,
                exc.strerror,
                aside.name,
            )
            return
        except OSError as exc:
            log.error("cannot read pod journal, starting with no pods: %s", exc)
            return
        if len(raw) > _MAX_JOURNAL_BYTES:
            log.error(
                "pod journal %s is larger than %d bytes; starting with no pods",
                self._journal,
                _MAX_JOURNAL_BYTES,
            )
            return
        pods: dict[str, _Pod] = {}
        for n, line in enumerate(raw.splitlines(), 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line.decode("utf-8"))
                if not isinstance(rec, dict) or len(rec) != 1:
                    raise ValueError("not an object with one key")
                if "add" in rec:
                    p = _spec_from_json(rec["add"])
                    pods[p.spec.uid] = p
                elif "del" in rec and isinstance(rec["del"], str):
                    pods.pop(rec["del"], None)
                else:
                    raise ValueError("neither a pod to add nor a pod UID to delete")
            except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError included
                why = str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__
                log.warning("skipping pod journal line %d of %s: %s", n, self._journal, why)
        self._pods = {}
        for p in pods.values():
            key = (p.spec.namespace, p.spec.name)
            if key in self._pods:  # two UIDs for one name: keep the later one
                log.warning("pod journal: %s/%s is in it twice; keeping the later", *key)
            self._pods[key] = p
        text = "".join(json.dumps({"add": _spec_to_json(p)}) + "\n" for p in self._pods.values())
        try:
            write_atomic(self._journal, text.encode())
        except OSError as exc:
            log.error("cannot rewrite pod journal: %s", exc)

    def _reconcile(self) -> None:
        """Start-up with the pod journal: the pods are known, so the checkpoint must agree.

        Allocations of pods the journal does not hold (a crash between the checkpoint write
        and the journal write) are dropped now rather than at the next admission; a pod
        whose devices the checkpoint lost is kept, with a warning per container.
        """
        if self._journal is None:
            return
        self._gc_clean = False
        self._gc_allocations("not in the pod journal")
        m = self._m
        for p in self._pods.values():
            for c in p.spec.containers:
                missing = sorted(
                    r
                    for r, n in c.limits.items()
                    if n > 0 and r not in m.container_devices(p.spec.uid, c.name)
                )
                if missing:
                    log.warning(
                        "pod %s/%s container %s restored without its devices (%s): the "
                        "checkpoint has no allocation for them",
                        p.spec.namespace,
                        p.spec.name,
                        c.name,
                        ", ".join(missing),
                    )

    # ------------------------------------------------------------------ control socket

    async def _handle_control(self, req: dict[str, Any]) -> Any:
        op = req.get("op")
        if self._manager is not None:  # a client that looks finds the checkpoint up to date
            self._manager.flush_checkpoint()
        if op == "ping":
            return {"pid": os.getpid()}
        if op == "node":
            return self.node().to_dict()
        if op == "apply":
            manifest = req.get("manifest")
            if not isinstance(manifest, dict | str):
                raise ManifestError("apply needs a manifest object")
            return (await self.apply_pod(manifest)).to_dict()
        if op == "delete":
            await self.delete_pod(str(req.get("name")), str(req.get("namespace") or "default"))
            return {}
        if op == "get":
            return self.pod(str(req.get("name")), str(req.get("namespace") or "default")).to_dict()
        if op == "list":
            ns = req.get("namespace")
            return [p.to_dict() for p in self.pods() if ns is None or p.namespace == ns]
        if op == "wait":
            allocatable = req.get("allocatable")
            status = await self.wait_for_resource(
                str(req.get("resource")),
                allocatable=None if allocatable is None else int(allocatable),
                timeout=float(req.get("timeout") or 5.0),
            )
            return status.to_dict()
        if op == "restart":
            await self.restart()
            return {}
        if op == "events":
            return [to_jsonable(e) for e in self.events]
        raise EmulatorError(f"unknown control op {op!r}")


def _aside_name(path: Path) -> Path:
    """Where a damaged state file is moved: ``NAME.corrupt-<UTC time>-<ns>``, same dir."""
    return path.with_name(
        f"{path.name}.corrupt-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}"
        f"-{time.time_ns() % 1_000_000_000:09d}"
    )


def _spec_to_json(p: _Pod) -> dict[str, Any]:
    s = p.spec
    return {
        "name": s.name,
        "namespace": s.namespace,
        "uid": s.uid,
        "containers": [[c.name, c.kind, c.limits] for c in s.containers],
        "started": {k: [v.started, v.error] for k, v in p.started.items()},
    }


def _spec_from_json(d: Any) -> _Pod:
    """A journaled pod; ``ValueError`` naming what is wrong with a damaged record."""
    if not isinstance(d, dict):
        raise ValueError("the pod is not an object")
    for k in ("name", "namespace", "uid"):
        if not isinstance(d.get(k), str) or not d[k]:
            raise ValueError(f"pod {k} is not a non-empty string")
    raw_containers = d.get("containers")
    if not isinstance(raw_containers, list):
        raise ValueError("pod containers is not a list")
    containers = []
    for c in raw_containers:
        if not (
            isinstance(c, list)
            and len(c) == 3
            and isinstance(c[0], str)
            and c[1] in ("init", "sidecar", "app")
            and isinstance(c[2], dict)
            and all(
                isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v >= 0
                for k, v in c[2].items()
            )
        ):
            raise ValueError("a container is not [name, kind, {resource: count}]")
        containers.append(ContainerSpec(c[0], c[1], dict(c[2])))
    spec = PodSpec(d["name"], d["namespace"], d["uid"], tuple(containers))
    started: dict[str, StartResult] = {}
    raw_started = d.get("started", {})
    if not isinstance(raw_started, dict):
        raise ValueError("pod started is not an object")
    for k, v in raw_started.items():
        if not (
            isinstance(v, list)
            and len(v) == 2
            and isinstance(v[0], bool)
            and (v[1] is None or isinstance(v[1], str))
        ):
            raise ValueError("a container start result is not [bool, error]")
        started[k] = StartResult(v[0], v[1])
    return _Pod(spec, started)

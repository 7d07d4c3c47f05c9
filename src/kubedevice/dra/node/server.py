"""DriverServer: one DRA driver's sockets, registration, devices, slices and health.

Start-up order: without a pod UID, the node's lock file (``plugins/<driver>/driver.lock``)
is taken (a second such instance refuses to start, naming the holder); with one, the sockets
are named by it and instances run side by side, each holding ``driver-<pod UID>.lock`` (a
second instance with the same pod UID refuses to start) (:mod:`kubedevice.dra.state.lock`).
Under the node's claims lock the checkpoint is loaded and handed to the driver's ``restore``
hook; the first device list is awaited, the DRA socket serves (``v1.DRAPlugin``,
``v1beta1.DRAPlugin`` and, unless turned off, ``v1alpha1.DRAResourceHealth``), then the
registration socket appears in the kubelet's ``plugins_registry/`` (the kubelet dials the
DRA socket only after that). inotify on both directories puts a socket back within
milliseconds when it is removed; the kubelet's re-registration (after its restart)
republishes the slices. On stop the calls in flight end first (up to the stop grace, still
registered: the kubelet drops its connections to a driver that unregisters), then the
registration socket goes, then the DRA socket (only this instance's own sockets); slices
stay (a restarted driver or the other instance of a rolling upgrade adopts them unchanged;
the kubelet removes them when no instance of the driver stays registered). With a pod UID,
an instance whose plugin dir gets another instance's DRA socket after its own start (a
newer pod of the DaemonSet) holds its slice writes while that socket is there and answers:
only the newest instance writes them. Both
serve the health stream (the kubelet opens one per registered instance; both report the same
devices) and write ``status.devices`` of the claims each prepared, under one field manager,
with the same content. Devices that are not healthy are tainted by why
(:mod:`kubedevice.dra.model.taints`); the prepared claims' ``status.devices`` say how their
devices are (:mod:`kubedevice.dra.api.status`); with ``metrics_address`` set, ``/metrics``,
``/healthz`` and ``/readyz`` are served (:mod:`kubedevice.dra.node.metrics`).
"""

from __future__ import annotations

import asyncio
import logging
import stat
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType, TracebackType
from typing import TYPE_CHECKING, Any

import grpc

from kubedevice._api.dra.v1 import api_pb2_grpc as v1_grpc
from kubedevice._api.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc
from kubedevice._api.drahealth.v1alpha1 import api_pb2_grpc as health_grpc
from kubedevice._api.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from kubedevice._regular_file import NotRegularFileError
from kubedevice.dra.api.kube import KubeClient
from kubedevice.dra.api.slices import SlicePublisher
from kubedevice.dra.api.status import ClaimStatusWriter
from kubedevice.dra.driver import Driver
from kubedevice.dra.model.counters import check_counters
from kubedevice.dra.model.names import dra_socket_path
from kubedevice.dra.model.taints import TaintPolicy
from kubedevice.dra.model.types import Device, Health
from kubedevice.dra.node.health import HealthService
from kubedevice.dra.node.observed import ObservedServicer
from kubedevice.dra.node.peers import peer_uid, serves_as
from kubedevice.dra.node.registration import RegistrationService, supported_versions
from kubedevice.dra.node.service import ClaimService
from kubedevice.dra.node.servicers import V1beta1Servicer, V1Servicer
from kubedevice.dra.node.settings import Settings
from kubedevice.dra.node.sockets import UnixGrpcServer
from kubedevice.dra.state.cdi import CdiWriter
from kubedevice.dra.state.checkpoint import Checkpoint
from kubedevice.dra.state.lock import ClaimsLock, InstanceLock, PodLock, refusal
from kubedevice.errors import ConfigError, InstanceLockError, KubeDeviceError
from kubedevice.plugin.watch import OVERFLOW, DirWatcher

if TYPE_CHECKING:
    from kubedevice.dra.node.metrics import DraMetrics, StatusEndpoint

__all__ = ["DriverServer"]

log = logging.getLogger(__name__)

_DEVICE_LIST = "device list"


class DriverServer:
    """Runs one driver; an async context manager (``async with DriverServer(...)``).

    Args:
        driver: The author's driver.
        settings: Resolved settings.
        kube: An API client; ``None`` connects with ``settings.kubeconfig`` (or in-cluster).
    """

    def __init__(self, driver: Driver, settings: Settings, kube: KubeClient | None = None) -> None:
        self.driver = driver
        self.settings = settings
        self._kube = kube
        self._own_kube = kube is None
        self._devices: Mapping[str, Device] = MappingProxyType({})
        self._first = asyncio.Event()
        self._failed: asyncio.Future[BaseException | None] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._watchers: list[DirWatcher] = []
        self._repair = asyncio.Event()
        self._stopping = False
        self._newer: set[str] = set()  # pod UIDs of instances started after this one
        #: Held for the process life: exclusive without a pod UID (fixed socket names),
        #: shared with one (the instances of a rolling upgrade, never beside one without).
        self.lock = InstanceLock(
            settings.lock, f"DRA driver {settings.driver_name}", shared=bool(settings.pod_uid)
        )
        #: With a pod UID, held exclusive for the process life: a second instance with the
        #: same pod UID would replace this one's live sockets.
        self.pod_lock = (
            PodLock(settings.pod_lock, f"DRA driver {settings.driver_name}", settings.pod_uid)
            if settings.pod_uid
            else None
        )
        self.claims_lock = ClaimsLock(settings.claims_lock)
        self.checkpoint = Checkpoint(settings.checkpoint, settings.driver_name)
        self.cdi = CdiWriter(settings.cdi_dir, settings.driver_name)
        self.health = HealthService(settings.node_name)
        self.publisher: SlicePublisher | None = None
        self.claims: ClaimService | None = None
        self.registration = RegistrationService(
            settings.driver_name,
            str(settings.dra_socket),
            supported_versions(health=settings.health),
            on_registered=self._on_registered,
        )
        self._dra = UnixGrpcServer(settings.dra_socket, self._add_dra_services)
        self._reg = UnixGrpcServer(settings.registration_socket, self._add_registration)
        self.metrics: DraMetrics | None = None  # with settings.metrics_address
        self.endpoint: StatusEndpoint | None = None  # serves them, /healthz and /readyz
        self.status: ClaimStatusWriter | None = None  # with settings.claim_status

    @property
    def devices(self) -> Mapping[str, Device]:
        """The driver's current devices by name."""
        return self._devices

    @property
    def slice_writes(self) -> int:
        """ResourceSlices created, replaced or deleted by this instance."""
        return self.publisher.writes if self.publisher is not None else 0

    @property
    def registrations(self) -> int:
        """Times the kubelet registered this instance."""
        return self.registration.registrations

    @property
    def health_streams(self) -> int:
        """Open ``NodeWatchResources`` streams."""
        return self.health.streams

    async def __aenter__(self) -> DriverServer:
        try:
            await self.start()
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def start(self) -> None:
        """Serve and register; returns once both sockets are up.

        Raises:
            InstanceLockError: Another instance of the driver runs on this node and one of
                the two has no pod UID, or both have the same; or a lock file is not a
                regular file.
            ConfigError: The API client cannot be configured.
            KubeDeviceError: The driver's ``restore`` hook failed, its device list failed
                before its first snapshot, or a socket cannot be served.
        """
        s = self.settings
        self._failed = asyncio.get_running_loop().create_future()
        self.lock.acquire()  # before the checkpoint is read or a socket touched
        if self.pod_lock is not None:
            self.pod_lock.acquire()
        if self._kube is None:
            self._kube = await asyncio.to_thread(
                KubeClient.connect, s.kubeconfig, deadline_s=s.api_timeout
            )
        self.claims = ClaimService(
            self.driver,
            driver_name=s.driver_name,
            node_name=s.node_name,
            kube=self._kube,
            checkpoint=self.checkpoint,
            cdi=self.cdi,
            devices=lambda: self._devices,
            taints=TaintPolicy(s.driver_name, s.evict_on),
            claims_lock=self.claims_lock,
        )
        try:
            await self.claims.restore()  # loads the checkpoint, under the claims lock
        except NotRegularFileError as exc:  # a symlink planted in its place: never followed
            raise InstanceLockError(refusal(self.claims_lock.path, exc)) from None
        except OSError as exc:
            raise KubeDeviceError(f"cannot lock {self.claims_lock.path}: {exc}") from None
        if s.claim_status:
            self.status = ClaimStatusWriter(
                self._kube, s.driver_name, s.node_name, self.checkpoint, lambda: self._devices
            )
            self._spawn(self.status.run(), "write claim status")
        if s.metrics_address is not None:
            await self._serve_status(s.metrics_address)
        if s.publish:
            taints = TaintPolicy(s.driver_name, s.evict_on)
            self.publisher = SlicePublisher(self._kube, s.driver_name, s.node_name, taints)
            if s.pod_uid:  # only the newest instance of a rolling upgrade writes the slices
                self.publisher.defer_to = self._newer_serving
            self._spawn(self.publisher.run(), "publish ResourceSlices")
        self._spawn(self._consume(), _DEVICE_LIST)
        first: asyncio.Future[Any] = asyncio.ensure_future(self._first.wait())
        failed: asyncio.Future[Any] = self._failed
        try:
            await asyncio.wait({first, failed}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            first.cancel()
        if self._failed.done():
            error = self._failed.result()
            raise KubeDeviceError(f"the driver's device list failed: {error}") from error
        await self._dra.start()
        await self._reg.start()
        log.info(
            "DRA driver %s serving on %s, registration on %s (%s)",
            s.driver_name,
            s.dra_socket,
            s.registration_socket,
            ", ".join(self.registration.versions),
        )
        for directory in (s.registration_socket.parent, s.plugin_dir):
            watcher = DirWatcher(directory, self._on_dir_change)
            await watcher.start()
            self._watchers.append(watcher)
        self._spawn(self._keep_sockets(), "keep sockets")

    async def stop(self) -> None:
        """Unregister (registration socket removed), stop serving, end the tasks. Idempotent."""
        self._stopping = True  # the watchers' events about our own sockets are not repairs
        watchers, self._watchers = self._watchers, []
        unwatching = asyncio.gather(*(w.stop() for w in watchers))  # alongside the rest
        tasks, self._tasks = self._tasks, []
        # the publisher and the socket keeper end alongside; the device list (the driver's
        # devices(), whose clean-up may close what a prepare still in flight uses) only
        # once the DRA socket has stopped
        last = [t for t in tasks if t.get_name() == _DEVICE_LIST]
        for task in tasks:
            if task not in last:
                task.cancel()
        until = asyncio.get_running_loop().time() + self.settings.stop_grace
        if self.claims is not None and self.claims.inflight.tasks:
            # the calls in flight end first, the driver still registered: the kubelet drops
            # its connection to a driver that unregisters, and their answers with it
            await self.claims.inflight.drain(self.settings.stop_grace)
        await self._reg.stop()
        await self.health.close()
        await self._stop_calls(until)
        for task in last:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        if self.endpoint is not None:
            await self.endpoint.stop()
            self.endpoint = None
        if self._own_kube and self._kube is not None:
            self._kube.close()
            self._kube = None
        await unwatching
        if self.pod_lock is not None:
            self.pod_lock.release()
        self.lock.release()

    async def _stop_calls(self, until: float) -> None:
        """Stop serving the DRA socket; the prepare and unprepare calls in flight (their
        hooks, also those of calls cut off before) get until ``until`` (the stop grace) to
        end and be recorded. Past it, the node's claims lock stays held until this process
        ends, so no other instance meets a claim whose hook may still run here (the next to
        take the lock undoes what was left half done)."""
        loop = asyncio.get_running_loop()
        grace = self.settings.stop_grace
        await self._dra.stop(grace=max(until - loop.time(), 0))
        if self.claims is None:
            return
        left = await self.claims.inflight.drain(until - loop.time())
        if left:
            log.error(
                "%d prepare or unprepare calls still in flight after the stop grace of %g s; "
                "the node's claims lock stays held until this process ends",
                left,
                grace,
            )
            self.claims_lock.keep()

    async def wait_failed(self) -> BaseException | None:
        """Wait until a background job of the server fails; its error."""
        assert self._failed is not None
        return await asyncio.shield(self._failed)

    async def wait_published(self) -> None:
        """Wait until the current devices are in the ResourceSlices."""
        if self.publisher is not None:
            await self.publisher.wait_published()

    # ---- jobs ------------------------------------------------------------------------

    def _spawn(self, job: Any, name: str) -> None:
        task = asyncio.create_task(job, name=name)
        task.add_done_callback(self._job_done)
        self._tasks.append(task)

    def _job_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        error = task.exception()
        if error is None:
            return
        failed = self._failed
        reported = failed is not None and not failed.done()
        if not isinstance(error, KubeDeviceError):  # a bug: its traceback helps
            log.error("%s failed: %s", task.get_name(), error, exc_info=error)
        elif reported:  # serve() ends with it: one line there (a bad device, an API error)
            log.debug("%s failed: %s", task.get_name(), error, exc_info=error)
        else:
            log.error("%s failed: %s", task.get_name(), error)
        if failed is not None and reported:
            failed.set_result(error)

    async def _consume(self) -> None:
        async for snapshot in self.driver.devices():
            devices = tuple(snapshot)
            names = [d.name for d in devices]
            if len(set(names)) != len(names):
                duplicates = sorted({n for n in names if names.count(n) > 1})
                log.error("device list ignored: duplicate device names %s", duplicates)
                continue
            counter_sets = tuple(self.driver.counter_sets())
            try:
                check_counters(devices, counter_sets)
            except ConfigError as exc:
                log.error("device list ignored: %s", exc)
                continue
            self._devices = MappingProxyType({d.name: d for d in devices})
            healthy = sum(d.health == Health.HEALTHY for d in devices)
            log.info("%d devices (%d healthy)", len(devices), healthy)
            if self.publisher is not None:
                self.publisher.update(devices, counter_sets)
            await self.health.update(devices)
            if self.status is not None:
                self.status.devices_changed(devices)
            self._first.set()
        log.info("the driver's device list ended; keeping its last devices")
        self._first.set()

    def _on_registered(self) -> None:
        if self.publisher is not None and self.registration.registrations > 1:
            log.info("registered again; reconciling the ResourceSlices")
            self.publisher.request()

    def _on_dir_change(self, name: str) -> None:
        if self._stopping:
            return
        if name and not name.endswith(".sock"):
            # every name looked after is a socket's; the checkpoint's writes (four events
            # each, in the plugin dir) and the lock files are let go at once
            return
        s = self.settings
        if name in (OVERFLOW, s.registration_socket.name, s.dra_socket.name):
            self._repair.set()
        if s.pod_uid and name == OVERFLOW:
            self._newer_instances(None)
        elif s.pod_uid and (uid := peer_uid(name, s.driver_name, s.pod_uid)) is not None:
            self._newer_instances(uid)

    def _newer_instances(self, uid: str | None) -> None:
        """Another instance's socket appeared (it started after this one: a rolling
        upgrade) or went: the newest instance alone writes the slices."""
        s = self.settings
        # one socket looked at per event (all of them only when events were lost): a
        # thousand sockets appearing cost a thousand looks, not half a million
        before = len(self._newer)
        for u in [uid] if uid else list(self._newer):
            if _is_socket(dra_socket_path(s.kubelet_dir, s.driver_name, u)):
                self._newer.add(u)
            else:
                self._newer.discard(u)
        if self.publisher is not None and (
            uid is None or uid in self._newer or len(self._newer) != before
        ):
            self.publisher.recheck()  # also when its registration socket came

    async def _newer_serving(self) -> bool:
        """Whether a newer instance of this driver serves (:func:`serves_as`: a socket left
        by an instance killed with SIGKILL, or one of anything else, does not count); the
        publisher asks again at every wake, so a killed newer instance is noticed within a
        resync."""
        s = self.settings
        answers = await asyncio.gather(
            *(serves_as(s.driver_name, s.kubelet_dir, uid) for uid in self._newer)
        )
        return any(answers)

    async def _keep_sockets(self) -> None:
        while True:
            await self._repair.wait()
            self._repair.clear()
            if self._stopping:
                return
            for server, what in ((self._dra, "DRA"), (self._reg, "registration")):
                if server.serving:
                    continue
                log.warning("%s socket %s is gone; serving it again", what, server.path)
                try:
                    await server.start()
                except KubeDeviceError as exc:
                    log.error("%s", exc)  # the directory may be gone: the watcher says when

    # ---- metrics and probes ----------------------------------------------------------

    async def _serve_status(self, address: str) -> None:
        from kubedevice.dra.node.metrics import DraMetrics, StatusEndpoint

        self.metrics = DraMetrics(self)
        self.endpoint = StatusEndpoint(address, self.metrics, self._live, self._ready)
        try:
            await self.endpoint.start()
        except OSError as exc:
            self.endpoint = None
            raise KubeDeviceError(f"cannot serve metrics on {address}: {exc}") from None

    def _live(self) -> str | None:
        """``None`` while the DRA socket is served and no job failed; else why not."""
        if self._failed is not None and self._failed.done():
            return f"failed: {self._failed.result()}"
        if not self._dra.serving:
            return f"the DRA socket {self._dra.path} is not served"
        return None

    def _ready(self) -> str | None:
        """``None`` once the kubelet registered the driver, the slices were reconciled at
        least once (or a newer instance publishes them) and the API server is not failing
        the calls now (not reached, credentials refused, server errors); else why not."""
        live = self._live()
        if live is not None:
            return live
        if not self.registration.registered.is_set():
            error = self.registration.last_error
            return f"not registered with the kubelet{': ' + error if error else ''}"
        failing = self._kube.failing if self._kube is not None else None
        if failing is not None:
            return f"API server calls failing: {failing}"
        publisher = self.publisher
        if publisher is not None and not publisher.reconciled and not publisher.deferring:
            why = publisher.last_error
            return f"ResourceSlices not published yet{': ' + why if why else ''}"
        return None

    # ---- gRPC services ---------------------------------------------------------------

    def _add_dra_services(self, server: grpc.aio.Server) -> None:
        assert self.claims is not None
        v1: Any = V1Servicer(self.claims)
        v1beta1: Any = V1beta1Servicer(self.claims)
        if self.metrics is not None or self.status is not None:
            v1 = ObservedServicer(v1, self.metrics, self.status)
            v1beta1 = ObservedServicer(v1beta1, self.metrics, self.status)
        v1_grpc.add_DRAPluginServicer_to_server(v1, server)
        v1beta1_grpc.add_DRAPluginServicer_to_server(v1beta1, server)
        if self.settings.health:
            health_grpc.add_DRAResourceHealthServicer_to_server(self.health, server)

    def _add_registration(self, server: grpc.aio.Server) -> None:
        reg_grpc.add_RegistrationServicer_to_server(self.registration, server)


def _is_socket(path: Path) -> bool:
    try:
        return stat.S_ISSOCK(path.lstat().st_mode)
    except OSError:
        return False

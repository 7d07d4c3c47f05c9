"""The GPU plugin daemon: NVML start-up, one SDK plugin per resource, health, CDI, reload.

:class:`GpuPlugins` owns the SDK :class:`~kubedevice.plugin.PluginServer`, the
:class:`~kubedevice.nvidia.health.HealthMonitor`, the CDI spec file and the config
watcher. A reload (SIGHUP or a change of the file) is all-or-nothing: the new config and
everything derived from it (devices, CDI spec, labels) are built and checked first (each
new resource as the SDK would serve it: names, socket names, socket path lengths); then
the new resources are served through :class:`~kubedevice.plugin.swap.PluginSwap`, the
CDI spec is written (the new resources are removed again if it cannot be), the change is
committed, and the labels come last. A refused reload changes nothing. It never exits
the process; :func:`run_gpu_plugin` is the in-process entry point the CLI uses.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kubedevice.errors import ConfigError, NvmlError
from kubedevice.nvidia.backend import DriverInfo, GpuInfo, MigDeviceInfo, NvmlBackend
from kubedevice.nvidia.cdi import build_spec, find_driver_files, write_spec
from kubedevice.nvidia.config import Config, load_config
from kubedevice.nvidia.devices import Inventory, build_inventory, read_numa_node
from kubedevice.nvidia.health import HealthMonitor, HealthState
from kubedevice.nvidia.labels import node_labels, remove_feature_file, write_feature_file
from kubedevice.nvidia.mpsreplicas import ReplicaMps
from kubedevice.nvidia.plugin import GpuResourcePlugin, Prefer
from kubedevice.nvidia.topology import Topology, build_topology, preferred_allocation
from kubedevice.plugin.daemon import PluginDaemon, run_daemon
from kubedevice.plugin.filewatch import FileChanges, file_digest
from kubedevice.plugin.server import PluginServer
from kubedevice.plugin.swap import PluginSwap

if TYPE_CHECKING:
    from kubedevice.nvidia.metrics import GpuMetrics

__all__ = ["GpuPlugins", "Hardware", "run_gpu_plugin"]

log = logging.getLogger(__name__)

#: How long stopping waits for the NVML event thread to leave its wait.
_EVENT_THREAD_GRACE_S = 0.02


@dataclass(frozen=True, slots=True)
class Hardware:
    """What NVML enumerated at start-up (``driver`` is ``None`` when NVML did not start)."""

    driver: DriverInfo | None
    gpus: tuple[GpuInfo, ...]
    mig: Mapping[str, tuple[MigDeviceInfo, ...]]

    @property
    def parents(self) -> dict[str, str]:
        """Every GPU and MIG device UUID -> its GPU's UUID."""
        out = {g.uuid: g.uuid for g in self.gpus}
        for gpu_uuid, devices in self.mig.items():
            out.update((m.uuid, gpu_uuid) for m in devices)
        return out


def enumerate_hardware(backend: NvmlBackend, *, fail_on_init_error: bool) -> Hardware:
    """Initialise NVML and list the GPUs and their MIG devices (blocking).

    Raises:
        NvmlError: NVML cannot start and ``fail_on_init_error`` is set.
    """
    try:
        driver = backend.init()
    except NvmlError as exc:
        if fail_on_init_error:
            raise
        log.error(
            "NVML cannot start (%s); serving zero GPUs (failOnInitError is false)",
            exc,
        )
        return Hardware(None, (), {})
    gpus = tuple(backend.gpus())
    mig: dict[str, tuple[MigDeviceInfo, ...]] = {}
    for gpu in gpus:
        if not gpu.mig_enabled:
            continue
        try:
            mig[gpu.uuid] = tuple(backend.mig_devices(gpu.uuid))
        except NvmlError as exc:  # one GPU's failure costs that GPU's MIG devices only
            log.error("cannot list the MIG devices of %s: %s", gpu.uuid, exc)
            mig[gpu.uuid] = ()
    log.info(
        "NVML started",
        extra={"driver": driver.driver_version, "cuda": driver.cuda_version, "gpus": len(gpus)},
    )
    return Hardware(driver, gpus, mig)


@dataclass(frozen=True, slots=True)
class _Derived:
    """Everything a config yields on this hardware; built completely before it is applied."""

    config: Config
    inventory: Inventory
    cdi_spec: dict[str, Any] | None
    prefer: Prefer | None
    labels: dict[str, str] | None


class GpuPlugins(PluginDaemon):
    """The GPU plugin on one node: every GPU resource, served on one SDK plugin server.

    Use as an async context manager (or :meth:`start` / :meth:`stop`).

    Args:
        config: The validated config (CLI overrides already applied).
        backend: The NVML backend, not yet initialised.
        device_plugin_dir: The kubelet's device plugin directory.
        config_path: The file ``config`` came from; watched, and re-read by :meth:`reload`.
        config_digest: ``file_digest`` of ``config_path`` taken before ``config`` was loaded
            from it (an edit made since is then reloaded); taken now when ``None``.
        overrides: Flags given on the command line (``Flags`` field names); they win over
            every reloaded config too.
        metrics_address: ``host:port`` for Prometheus metrics, or ``None``.
        wait_timeout_ms: Longest single NVML event wait (see :class:`HealthMonitor`).
    """

    def __init__(
        self,
        config: Config,
        backend: NvmlBackend,
        *,
        device_plugin_dir: str | os.PathLike[str] | None = None,
        config_path: str | os.PathLike[str] | None = None,
        config_digest: str | None = None,
        overrides: Mapping[str, str | None] | None = None,
        metrics_address: str | None = None,
        wait_timeout_ms: int = 1000,
    ) -> None:
        super().__init__(log)
        self._overrides = dict(overrides or {})
        self._config = config.with_overrides(**self._overrides)
        self.backend = backend
        self._config_path = Path(config_path).absolute() if config_path is not None else None
        # the content in force, taken before it was loaded: an edit since is reloaded
        if config_digest is None and self._config_path is not None:
            config_digest = file_digest(self._config_path)
        self._config_digest = config_digest
        self._changes: FileChanges | None = None
        self.server = PluginServer(device_plugin_dir, metrics_address=metrics_address)
        """The SDK server hosting the plugins (``wait_registered`` etc.)."""
        self.hardware = Hardware(None, (), {})
        self.health: HealthState | None = None
        self._monitor: HealthMonitor | None = None
        self._wait_timeout_ms = wait_timeout_ms
        self._plugins: dict[str, GpuResourcePlugin] = {}
        self._derived: _Derived | None = None
        self._topology: tuple[str, Topology] | None = None  # (sysRoot, what NVML said)
        self._gpu_metrics: GpuMetrics | None = None
        self._metrics_resources: list[str] = []
        self._device_gpu: dict[str, str] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._reload_lock = asyncio.Lock()
        self.mps = ReplicaMps(backend, self._mps_changed)
        """``sharing.mps``: the MPS control daemons of the shared GPUs (a GPU whose daemon
        died has its replicas Unhealthy: :meth:`ReplicaMps.fault`)."""
        self._mps_on = False

    # ----------------------------------------------------------------- lifecycle

    @property
    def config(self) -> Config:
        """The config in force."""
        return self._config

    @property
    def inventory(self) -> Inventory:
        """The devices of each resource in force."""
        assert self._derived is not None
        return self._derived.inventory

    @property
    def resources(self) -> list[str]:
        """The resource names served."""
        return list(self._plugins)

    @property
    def metrics_url(self) -> str | None:
        """Where the Prometheus metrics are served (the real port when ``:0`` was asked)."""
        return self.server.metrics_url

    def plugin(self, resource: str) -> GpuResourcePlugin:
        """The plugin serving ``resource``."""
        return self._plugins[resource]

    async def _start(self) -> None:
        """Start NVML, serve every resource, write the CDI spec, start health and watchers.

        Raises:
            NvmlError: NVML cannot start and ``failOnInitError`` is set.
            ConfigError: The config does not fit the hardware (e.g. ``migStrategy: single``
                on mixed MIG profiles).
        """
        t0 = time.monotonic()
        self.hardware = await asyncio.to_thread(
            enumerate_hardware,
            self.backend,
            fail_on_init_error=self._config.flags.fail_on_init_error,
        )
        derived = await asyncio.to_thread(self._derive, self._config)
        self.health = HealthState(self._config.health, self.hardware.parents)
        await self.server.start()
        self._mps_on = await self.mps.sync(derived.config, derived.inventory)
        swap, fresh = self._swap(derived)
        if derived.cdi_spec is not None:
            await asyncio.to_thread(write_spec, derived.config.flags.cdi_dir, derived.cdi_spec)
        await swap.apply()
        await swap.finish()
        self._commit(derived, fresh)
        await self._write_labels(derived, None)
        self._sync_metrics()
        await self._sync_monitor()
        self._tasks.append(asyncio.create_task(self._reloader.run(), name="nvidia: reload"))
        if self._config_path is not None:
            self._changes = FileChanges(self._config_path, self._config_digest)
            self._tasks.append(
                asyncio.create_task(self._reloader.follow(self._changes), name="nvidia: config")
            )
        log.info("serving %.1f ms after start", (time.monotonic() - t0) * 1000)
        log.info("GPU plugin started", extra={"resources": ",".join(self._plugins)})

    async def _stop(self) -> None:
        """Stop the health thread, watchers and the server."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks = []
        if self._changes is not None:
            self._changes.close()
            self._changes = None
        event_thread_done = True
        if self._monitor is not None:
            # Not for the event thread's NVML wait (real NVML cannot be woken): stopping
            # takes milliseconds, and NVML is left to the process exit if it is still in it.
            event_thread_done = await self._monitor.stop(grace=_EVENT_THREAD_GRACE_S)
            self._monitor = None
        if self._gpu_metrics is not None:
            self._gpu_metrics.close()
            self._gpu_metrics = None
        await self.server.stop()
        await self.mps.close()
        if self.hardware.driver is not None and event_thread_done:
            with contextlib.suppress(NvmlError):
                await asyncio.to_thread(self.backend.shutdown)

    # ----------------------------------------------------------------- devices

    def _derive(self, config: Config) -> _Derived:
        """Build everything ``config`` yields (blocking: reads /dev, /sys, the driver root)."""
        hw = self.hardware
        inventory = build_inventory(
            config, hw.gpus, hw.mig, device_plugin_dir=self.server.device_plugin_dir
        )
        spec = None
        if config.flags.cdi_enabled:
            files = find_driver_files(
                config.flags.nvidia_driver_root,
                hw.driver.driver_version if hw.driver is not None else None,
            )
            spec = build_spec(
                inventory,
                driver_files=files,
                host_driver_root=config.flags.effective_host_driver_root,
            )
        topology = self._topology_for(config.flags.sys_root)
        prefer = None if topology is None else functools.partial(preferred_allocation, topology)
        labels = None
        if hw.driver is not None:
            labels = node_labels(config, hw.driver, hw.gpus, hw.mig)
        return _Derived(config, inventory, spec, prefer, labels)

    def _topology_for(self, sys_root: str) -> Topology | None:
        """The GPUs' topology (NVML asked about every pair; blocking).

        Built once: the GPUs never change, so a reload asks NVML again only when it
        changes ``sysRoot`` (where the NUMA nodes are read).
        """
        hw = self.hardware
        if hw.driver is None:
            return None
        if self._topology is None or self._topology[0] != sys_root:
            numa = {g.uuid: read_numa_node(sys_root, g.pci_bus_id, g.numa_node) for g in hw.gpus}
            self._topology = (sys_root, build_topology(self.backend, hw.gpus, numa))
        return self._topology[1]

    async def _write_labels(self, derived: _Derived, old_dir: str | None) -> None:
        """Write the labels file; remove one this plugin wrote in ``old_dir`` if it moved.

        A directory that cannot be written is logged: the GPUs are served all the same.
        """
        new_dir = derived.config.flags.features_dir
        try:
            if old_dir is not None and old_dir != new_dir:
                await asyncio.to_thread(remove_feature_file, Path(old_dir))
            if new_dir is None:
                return
            if derived.labels is None:  # no NVML: no stale "GPUs present" labels either
                await asyncio.to_thread(remove_feature_file, Path(new_dir))
                return
            if await asyncio.to_thread(write_feature_file, Path(new_dir), derived.labels):
                log.info("node labels written", extra={"dir": new_dir})
        except ConfigError as exc:
            log.error("node labels not written: %s", exc)

    def _healthy(self, uuid: str) -> bool:
        if self.mps.fault(uuid) is not None:  # its MPS daemon died (health.disabled is NVML's)
            return False
        return self.health is None or self._config.health.disabled or self.health.healthy(uuid)

    def _swap(self, derived: _Derived) -> tuple[PluginSwap, list[GpuResourcePlugin]]:
        """The plugins ``derived`` adds and removes, checked; nothing is touched.

        Raises:
            ConfigError: A new resource cannot be served (its name, its socket name taken
                by another resource, a socket path too long).
        """
        config = derived.config
        slicing = config.sharing.active
        wanted = derived.inventory.resources
        fresh = [
            GpuResourcePlugin(
                name,
                entries,
                config.flags,
                self._healthy,
                shared=name in derived.inventory.shared,
                fail_requests_greater_than_one=slicing.fail_requests_greater_than_one,
                prefer=derived.prefer,
                mps=self.mps.edits if self._mps_on else None,
            )
            for name, entries in wanted.items()
            if name not in self._plugins
        ]
        for plugin in fresh:
            plugin.refresh()  # the list it starts with (refreshed again on commit)
        gone = [p for n, p in self._plugins.items() if n not in wanted]
        swap = PluginSwap(self.server, add=fresh, remove=gone)
        swap.check()
        return swap, fresh

    def _commit(self, derived: _Derived, fresh: list[GpuResourcePlugin]) -> None:
        """Make ``derived`` the state in force (after its new plugins are served)."""
        config = derived.config
        self._derived = derived
        self._config = config
        self._device_gpu = {
            e.id: e.unit.parent_uuid
            for entries in derived.inventory.resources.values()
            for e in entries
        }
        if self.health is not None:
            self.health.config = config.health
        slicing = config.sharing.active
        wanted = derived.inventory.resources
        plugins = {p.resource_name: p for p in fresh}
        for name, entries in wanted.items():
            plugin = plugins.get(name) or self._plugins[name]
            plugin.configure(
                entries,
                config.flags,
                name in derived.inventory.shared,
                slicing.fail_requests_greater_than_one,
                derived.prefer,
                self.mps.edits if self._mps_on else None,
            )
            plugins[name] = plugin
        for name in self._plugins:
            if name not in wanted:
                log.info("resource removed", extra={"resource": name})
        self._plugins = {name: plugins[name] for name in wanted}
        for plugin in self._plugins.values():
            plugin.refresh()

    async def _sync_monitor(self) -> None:
        """Run the health monitor exactly when NVML started and health is not disabled."""
        wanted = self.hardware.driver is not None and not self._config.health.disabled
        if wanted and self._monitor is None and self.health is not None:
            self._monitor = HealthMonitor(
                self.backend,
                self.health,
                self._health_changed,
                sink=self._gpu_metrics,
                wait_timeout_ms=self._wait_timeout_ms,
            )
            await self._monitor.start()
        elif not wanted and self._monitor is not None:
            await self._monitor.stop()
            self._monitor = None
            self._health_changed()

    def _sync_metrics(self) -> None:
        """Per-GPU metrics for the resources served now (a new collector when they change)."""
        metrics = self.server.metrics
        if metrics is None or self.hardware.driver is None:
            return
        resources = sorted(self._plugins)
        current = self._gpu_metrics
        if current is not None and self._metrics_resources == resources:
            return
        if current is not None:
            current.close()
        from kubedevice.nvidia.metrics import GpuMetrics  # prometheus_client: only when asked

        socket = self._config.flags.pod_resources_socket
        self._gpu_metrics = GpuMetrics(
            self.backend,
            self.hardware.gpus,
            Path(socket),
            resources,
            self._device_gpu.get,
            registry=metrics.registry,
        )
        self._metrics_resources = resources
        if self.health is not None:
            for gpu in self.hardware.gpus:
                self._gpu_metrics.set_health(gpu.uuid, self.health.healthy(gpu.uuid))
        self._gpu_metrics.set_mps_faults(self.mps.faults())
        if self._monitor is not None:
            self._monitor.sink = self._gpu_metrics

    def _health_changed(self) -> None:
        for plugin in self._plugins.values():
            plugin.refresh()

    def _mps_changed(self) -> None:
        """A GPU's MPS daemon died, or the fault cleared: its replicas and its gauge."""
        if self._gpu_metrics is not None:
            self._gpu_metrics.set_mps_faults(self.mps.faults())
        self._health_changed()

    # ----------------------------------------------------------------- reload

    async def reload(self, config: Config | None = None) -> None:
        """Apply a new config, all or nothing.

        Raises:
            ConfigError: The new config is invalid or does not fit the hardware; nothing
                was changed.
        """
        async with self._reload_lock:
            if config is None:
                if self._config_path is None:
                    raise ConfigError("no config file to reload from")
                config = await asyncio.to_thread(load_config, self._config_path)
            config = config.with_overrides(**self._overrides)
            if config == self._config:
                log.info("config unchanged")
                return
            derived = await asyncio.to_thread(self._derive, config)
            # Everything that can be checked first, then the plugins (undone if the CDI
            # spec cannot be written), then the commit; the labels last.
            self._mps_on = await self.mps.sync(derived.config, derived.inventory)
            swap, fresh = self._swap(derived)
            await swap.apply()
            if derived.cdi_spec is not None:
                try:
                    await asyncio.to_thread(write_spec, config.flags.cdi_dir, derived.cdi_spec)
                except ConfigError:
                    await swap.undo()
                    raise
            old_features_dir = self._config.flags.features_dir
            self._commit(derived, fresh)
            await swap.finish()
            await self._write_labels(derived, old_features_dir)
            self._sync_metrics()
            await self._sync_monitor()
            log.info("config reloaded", extra={"resources": ",".join(self._plugins)})


async def run_gpu_plugin(
    config: Config,
    backend: NvmlBackend,
    *,
    stop: asyncio.Event,
    config_path: str | os.PathLike[str] | None = None,
    config_digest: str | None = None,
    device_plugin_dir: str | os.PathLike[str] | None = None,
    overrides: Mapping[str, str | None] | None = None,
    metrics_address: str | None = None,
    ready: Callable[[GpuPlugins], None] | None = None,
    handle_sighup: bool = False,
    wait_timeout_ms: int = 5000,
) -> None:
    """Run the GPU plugin until ``stop`` is set.

    ``wait_timeout_ms`` bounds each NVML event wait. Stopping does not wait for it: the
    event thread gets a few milliseconds to answer ``interrupt()`` (the fake answers at
    once; real NVML only at the end of its current wait slice), then is left in its wait
    and NVML is not shut down under it.

    Raises:
        NvmlError: NVML cannot start and ``failOnInitError`` is set.
        ConfigError: The config does not fit the hardware.
        KubeDeviceError: A plugin could not be served.
    """
    plugins = GpuPlugins(
        config,
        backend,
        device_plugin_dir=device_plugin_dir,
        config_path=config_path,
        config_digest=config_digest,
        overrides=overrides,
        metrics_address=metrics_address,
        wait_timeout_ms=wait_timeout_ms,
    )
    await run_daemon(plugins, stop=stop, ready=ready, handle_sighup=handle_sighup)

"""Runs a generic config on the SDK: scans on inotify events, health loops, hot reload.

:class:`GenericPlugins` owns one SDK :class:`~kubedevice.plugin.PluginServer` hosting one
:class:`GenericResourcePlugin` per configured resource, the device-directory watcher, the
per-group health tasks and (when given a config path) the config-file watcher. It never
exits the process; :func:`run_generic` is the in-process entry point the CLI and the demo use.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable
from pathlib import Path

from kubedevice.errors import ConfigError
from kubedevice.generic.config import Config, load_config
from kubedevice.generic.discovery import PhysicalDevice, Scanner, watch_dirs
from kubedevice.generic.health import CheckResult, run_check
from kubedevice.generic.resource import GenericResourcePlugin, Snapshot
from kubedevice.plugin.daemon import PluginDaemon, run_daemon
from kubedevice.plugin.filewatch import DirWatcher, FileChanges, file_digest
from kubedevice.plugin.server import PluginServer
from kubedevice.plugin.swap import PluginSwap

__all__ = ["GenericPlugins", "run_generic"]

log = logging.getLogger(__name__)

#: Health checks of one group run at most this many at a time (commands are processes).
_MAX_PARALLEL_CHECKS = 16


class GenericPlugins(PluginDaemon):
    """Every resource of a generic config, served on one SDK plugin server.

    Use as an async context manager (or call :meth:`start` / :meth:`stop`).

    Args:
        config: The validated config.
        device_plugin_dir: The kubelet's device plugin directory (``None``: the SDK
            default, ``$DP_DEVICE_PLUGIN_DIR`` or ``/var/lib/kubelet/device-plugins``).
        config_path: The file ``config`` came from; when set, the file is watched and
            :meth:`reload` re-reads it.
        config_digest: :func:`file_digest` of ``config_path`` taken before ``config`` was
            loaded from it (an edit made since is then reloaded); taken now when ``None``.
        metrics_address: ``host:port`` for Prometheus metrics, or ``None``.
        dev_root: Overrides ``devRoot`` of this and every reloaded config.
        sys_root: Overrides ``sysRoot`` of this and every reloaded config.
    """

    def __init__(
        self,
        config: Config,
        *,
        device_plugin_dir: str | os.PathLike[str] | None = None,
        config_path: str | os.PathLike[str] | None = None,
        config_digest: str | None = None,
        metrics_address: str | None = None,
        dev_root: str | None = None,
        sys_root: str | None = None,
    ) -> None:
        super().__init__(log, "new config rejected; the old one keeps running:\n%s")
        self._roots = (dev_root, sys_root)
        config = config.with_roots(dev_root, sys_root)
        self._config = config
        self._config_path = Path(config_path).absolute() if config_path is not None else None
        if config_digest is None and self._config_path is not None:
            config_digest = file_digest(self._config_path)
        self._config_digest = config_digest
        # A bad metrics address fails here, before start; the server serves the metrics.
        self.server = PluginServer(device_plugin_dir, metrics_address=metrics_address)
        """The SDK server hosting the plugins (``wait_registered`` etc.)."""
        self._scanner = Scanner(config)
        self._plugins: dict[str, GenericResourcePlugin] = {}
        self._health_tasks: dict[str, list[asyncio.Task[None]]] = {}
        self._health_kicks: dict[tuple[str, int], asyncio.Event] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._watcher: DirWatcher | None = None
        self._reload_lock = asyncio.Lock()  # one reload at a time (SIGHUP, file, callers)

    # ----------------------------------------------------------------- lifecycle

    @property
    def config(self) -> Config:
        """The config in force."""
        return self._config

    @property
    def resources(self) -> list[str]:
        """Resource names currently served."""
        return list(self._plugins)

    def plugin(self, resource: str) -> GenericResourcePlugin:
        """The plugin serving ``resource``."""
        return self._plugins[resource]

    async def _start(self) -> None:
        """Scan, start serving and registering every resource, and start the watchers."""
        self._check_roots()
        self._watcher = DirWatcher()
        for res in self._config.resources:
            self._plugins[res.name] = GenericResourcePlugin(
                res, self._config.keep_unhealthy_seconds
            )
        self.rescan()
        await self.server.start()
        for plugin in self._plugins.values():
            await self.server.add(plugin)
            self._start_health(plugin.resource_name)
        self._tasks.append(asyncio.create_task(self._watch_loop(), name="generic: device watch"))
        self._tasks.append(asyncio.create_task(self._reloader.run(), name="generic: reload"))
        if self._config_path is not None:
            self._tasks.append(
                asyncio.create_task(self._config_loop(), name="generic: config watch")
            )
        log.info("generic plugin started", extra={"resources": ",".join(self._plugins)})

    def _check_roots(self) -> None:
        for what, root in (("devRoot", self._config.dev_root), ("sysRoot", self._config.sys_root)):
            if not os.path.isdir(root):
                log.warning("%s %s is not a directory: nothing can be found or watched", what, root)

    async def _stop(self) -> None:
        """Stop watchers and health checks, then the server."""
        log.info("stopping generic plugin")
        tasks = self._tasks + [t for ts in self._health_tasks.values() for t in ts]
        self._tasks, self._health_tasks = [], {}
        for task in tasks:
            task.cancel()
        interrupted = False  # our caller was cancelled: finish cleaning up, then re-raise
        for task in tasks:
            try:
                await _reap(task)
            except asyncio.CancelledError:
                interrupted = True
            except Exception:
                log.exception("task %s had failed", task.get_name())
        for plugin in self._plugins.values():
            plugin.close()
        log.debug("generic plugin tasks stopped; stopping the plugin server")
        await self.server.stop()
        if self._watcher is not None:
            self._watcher.close()
            self._watcher = None
        if interrupted:
            raise asyncio.CancelledError

    # ----------------------------------------------------------------- scanning

    def rescan(self) -> None:
        """Re-read the trees now and push what changed (the watcher calls this on events)."""
        if self._watcher is not None:
            self._watcher.watch_exactly(watch_dirs(self._config))
        found = self._scanner.scan()
        for name, plugin in self._plugins.items():
            plugin.apply_scan(found.get(name, []))
            for index in range(len(plugin.spec.groups)):
                kick = self._health_kicks.get((name, index))
                if kick is not None and plugin.unchecked(index):
                    kick.set()

    async def _watch_loop(self) -> None:
        assert self._watcher is not None
        while True:
            await self._watcher.changed()
            try:
                self.rescan()
            except Exception:  # a scan bug must not kill hot-plug
                log.exception("scan failed")

    async def wait_for(self, resource: str, predicate: Callable[[Snapshot], bool]) -> Snapshot:
        """Wait until ``resource`` has pushed a snapshot satisfying ``predicate``.

        This is how a caller waits until a device change has been pushed to the kubelet's
        streams; bound it with ``asyncio.timeout``.
        """
        return await self._plugins[resource].wait_for(predicate)

    # ----------------------------------------------------------------- health

    def _start_health(self, resource: str) -> None:
        plugin = self._plugins[resource]
        tasks = []
        for i, group in enumerate(plugin.spec.groups):
            if group.health is None:
                continue
            kick = self._health_kicks[(resource, i)] = asyncio.Event()
            tasks.append(
                asyncio.create_task(
                    self._health_loop(plugin, i, kick), name=f"health {resource}[{i}]"
                )
            )
        self._health_tasks[resource] = tasks

    def _cancel_health(self, resource: str) -> list[asyncio.Task[None]]:
        """Cancel ``resource``'s health tasks; return them to be awaited."""
        tasks = self._health_tasks.pop(resource, [])
        for key in [k for k in self._health_kicks if k[0] == resource]:
            del self._health_kicks[key]
        for task in tasks:
            task.cancel()
        return tasks

    async def _health_loop(
        self, plugin: GenericResourcePlugin, index: int, kick: asyncio.Event
    ) -> None:
        spec = plugin.spec.groups[index].health
        assert spec is not None
        limit = asyncio.Semaphore(_MAX_PARALLEL_CHECKS)

        async def check(dev: PhysicalDevice) -> CheckResult:
            async with limit:
                try:
                    return await run_check(spec, dev, self._scanner.sys_root)
                except Exception as exc:  # a checker bug must not leave devices Healthy
                    log.exception("health check of %s crashed", dev.id)
                    return CheckResult(False, f"health check crashed: {exc!r}")

        while True:
            kick.clear()
            devices = plugin.present_devices(index)
            results = await asyncio.gather(*(check(d) for d in devices))
            plugin.apply_checks({d.id: r for d, r in zip(devices, results, strict=True)})
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for drops a cancel that
            # arrives as the kick is set, and stop() would then wait for this task forever.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(spec.period_seconds):
                    await kick.wait()

    # ----------------------------------------------------------------- reload

    async def _config_loop(self) -> None:
        assert self._config_path is not None
        changes = FileChanges(self._config_path, self._config_digest)
        try:
            await self._reloader.follow(changes)
        finally:
            changes.close()

    async def reload(self, config: Config | None = None) -> None:
        """Apply a new config: start new resources, stop removed ones, update changed ones.

        Allocated devices survive: a changed resource keeps its plugin (and what it
        allocated); a device the new config no longer matches follows the vanished-device
        rule. Without ``config``, the config file is read and validated again.

        Raises:
            ConfigError: The new config is invalid; nothing was changed.
        """
        async with self._reload_lock:
            await self._reload(config)

    async def _reload(self, config: Config | None) -> None:
        if config is None:
            if self._config_path is None:
                raise ConfigError("no config file to reload from")
            config = load_config(self._config_path)
        config = config.with_roots(*self._roots)
        old = self._config
        if config == old:
            log.info("config unchanged")
            return
        old_specs = {r.name: r for r in old.resources}
        new_specs = {r.name: r for r in config.resources}
        keep_changed = config.keep_unhealthy_seconds != old.keep_unhealthy_seconds
        removed = [n for n in self._plugins if n not in new_specs]
        changed = [
            n
            for n, spec in new_specs.items()
            if n in self._plugins and (spec != old_specs[n] or keep_changed)
        ]
        added = [n for n in new_specs if n not in self._plugins]
        # First the step that can fail (binding the new sockets), with nothing else
        # changed yet: a refused reload leaves the old config fully in force.
        fresh = {
            n: GenericResourcePlugin(new_specs[n], config.keep_unhealthy_seconds) for n in added
        }
        swap = PluginSwap(
            self.server, add=list(fresh.values()), remove=[self._plugins[n] for n in removed]
        )
        await swap.apply()
        # Then the synchronous switch, so a scan triggered meanwhile sees a consistent state.
        stopping: list[asyncio.Task[None]] = []
        for name in removed + changed:
            stopping.extend(self._cancel_health(name))
        self._config = config
        if (config.dev_root, config.sys_root) != (old.dev_root, old.sys_root):
            self._scanner = Scanner(config)
        else:
            self._scanner.config = config
        gone = {name: self._plugins.pop(name) for name in removed}
        for plugin in gone.values():
            plugin.close()
        for name in changed:
            self._plugins[name].reconfigure(new_specs[name], config.keep_unhealthy_seconds)
        self._plugins.update(fresh)
        self._plugins = {name: self._plugins[name] for name in new_specs}
        self.rescan()
        # Then the parts that wait: old health tasks, sockets, registrations.
        for task in stopping:
            await _reap(task)
        await swap.finish()
        for name in removed:
            log.info("resource removed", extra={"resource": name})
        for name in changed:
            self._start_health(name)
            log.info("resource updated", extra={"resource": name})
        for name in added:
            self._start_health(name)
            log.info("resource added", extra={"resource": name})
        log.info("config reloaded")


async def _reap(task: asyncio.Task[None]) -> None:
    """Wait for a task we cancelled; a cancel of our own caller still propagates."""
    try:
        await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise


async def run_generic(
    config: Config | str | os.PathLike[str],
    *,
    stop: asyncio.Event,
    device_plugin_dir: str | os.PathLike[str] | None = None,
    dev_root: str | None = None,
    sys_root: str | None = None,
    metrics_address: str | None = None,
    ready: Callable[[GenericPlugins], None] | None = None,
    handle_sighup: bool = False,
) -> None:
    """Run the generic plugin until ``stop`` is set.

    Args:
        config: A :class:`Config`, or the path of a YAML config (then watched for changes).
        stop: Set it to stop cleanly.
        device_plugin_dir: The kubelet's device plugin directory.
        dev_root: Override ``devRoot`` (``--dev-root``).
        sys_root: Override ``sysRoot`` (``--sys-root``).
        metrics_address: ``host:port`` for Prometheus metrics.
        ready: Called with the running :class:`GenericPlugins` once it serves.
        handle_sighup: Reload on SIGHUP (the CLI sets it; needs the main thread).

    Raises:
        ConfigError: The config is invalid.
    """
    path: Path | None = None
    digest: str | None = None
    if isinstance(config, Config):
        cfg = config
    else:
        path = Path(config)
        digest = file_digest(path)  # before the load: an edit from here on is reloaded
        cfg = load_config(path)
    plugins = GenericPlugins(
        cfg,
        device_plugin_dir=device_plugin_dir,
        config_path=path,
        config_digest=digest,
        metrics_address=metrics_address,
        dev_root=dev_root,
        sys_root=sys_root,
    )
    await run_daemon(plugins, stop=stop, ready=ready, handle_sighup=handle_sighup)

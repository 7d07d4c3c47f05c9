"""Daemon plumbing shared by plugin runners: lifecycle, reload on SIGHUP or file change, metrics.

A runner (the generic plugin, the GPU plugin) owns its resources; what every such daemon
does the same way lives here: the start-once/stop-once lifecycle (:class:`PluginDaemon`),
serving the Prometheus registry with a one-line error, serialising reload requests with a
count callers can wait on, turning file changes into reload requests, and running until a
stop event with SIGHUP mapped to a reload.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import TYPE_CHECKING, Protocol, Self, TypeVar

from kubedevice.errors import ConfigError, KubeDeviceError, PluginServerError

if TYPE_CHECKING:
    from kubedevice.plugin.metrics import PluginMetrics
    from kubedevice.plugin.statushttp import StatusHttp

__all__ = [
    "FileWatch",
    "PluginDaemon",
    "Reloader",
    "run_daemon",
    "serve_metrics",
]


async def serve_metrics(metrics: PluginMetrics, address: str) -> StatusHttp:
    """Serve ``metrics`` over HTTP on ``address``; return the HTTP server.

    Raises:
        ConfigError: ``address`` is not ``HOST:PORT`` with a port 0-65535.
        PluginServerError: ``address`` cannot be listened on.
    """
    try:
        return await metrics.serve_http(address)
    except (ValueError, OverflowError) as exc:
        raise ConfigError(
            f"metrics address: expected HOST:PORT with a port 0-65535 (got {address!r})"
        ) from exc
    except OSError as exc:
        raise PluginServerError(
            f"cannot serve metrics on {address}: {exc.strerror or exc}"
        ) from exc


class FileWatch(Protocol):
    """Something that returns from :meth:`changed` when a watched file's content changed."""

    async def changed(self) -> None: ...


class Reloader:
    """Runs reload attempts one request at a time and counts those that finished.

    Args:
        reload: Re-reads and applies the config; raises :class:`ConfigError` when the new
            config is refused (the old one keeps running).
        log: Where refusals and failures are logged.
        rejected: The log format of a refused config (one ``%s``: the error).
    """

    def __init__(
        self,
        reload: Callable[[], Awaitable[None]],
        log: logging.Logger,
        rejected: str = "new config rejected; the old one keeps running: %s",
    ) -> None:
        self._reload = reload
        self._log = log
        self._rejected = rejected
        self._requested = asyncio.Event()
        self._done = asyncio.Event()
        self.count = 0
        """How many reload attempts finished (applied or rejected)."""

    def request(self) -> None:
        """Ask for a reload (what SIGHUP does)."""
        self._requested.set()

    async def wait(self, count: int) -> None:
        """Wait until at least ``count`` reload attempts have finished."""
        while self.count < count:
            self._done.clear()
            await self._done.wait()

    async def run(self) -> None:
        """Serve reload requests forever (run it as a task; cancel it to stop)."""
        while True:
            await self._requested.wait()
            self._requested.clear()
            try:
                await self._reload()
            except ConfigError as exc:
                self._log.error(self._rejected, exc)
            except KubeDeviceError as exc:
                self._log.error("reload failed part-way: %s", exc)
            except Exception:
                self._log.exception("reload failed part-way")
            finally:
                self.count += 1
                self._done.set()

    async def follow(self, changes: FileWatch) -> None:
        """Request a reload on every change ``changes`` reports (run it as a task)."""
        while True:
            await changes.changed()
            self.request()


class PluginDaemon:
    """Base of a plugin daemon: started once, stopped idempotently, reloaded on request.

    Use as an async context manager (or :meth:`start` / :meth:`stop`). A subclass
    implements :meth:`_start` (a failure there stops what was set up, then propagates),
    :meth:`_stop` and :meth:`reload`.

    Args:
        log: Where refused and failed reloads are logged.
        rejected: The log format of a refused config (see :class:`Reloader`).
    """

    def __init__(
        self,
        log: logging.Logger,
        rejected: str = "new config rejected; the old one keeps running: %s",
    ) -> None:
        self._reloader = Reloader(self.reload, log, rejected)
        self._started = False
        self._stopped = False

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    async def start(self) -> None:
        """Start serving; on a failure, what was set up is released again and it propagates."""
        if self._started:
            raise RuntimeError(f"{type(self).__name__} can be started only once")
        self._started = True
        try:
            await self._start()
        except BaseException:
            await self.stop()  # release what was set up: sockets, inotify, tasks
            raise

    async def stop(self) -> None:
        """Stop everything :meth:`start` started (idempotent)."""
        if not self._started or self._stopped:
            return
        self._stopped = True
        await self._stop()

    async def _start(self) -> None:
        raise NotImplementedError

    async def _stop(self) -> None:
        raise NotImplementedError

    async def reload(self) -> None:
        """Re-read the config and apply it (what a reload request runs)."""
        raise NotImplementedError

    def request_reload(self) -> None:
        """Ask for a reload from the config file (what SIGHUP does)."""
        self._reloader.request()

    async def wait_reloaded(self, count: int) -> None:
        """Wait until at least ``count`` reload attempts have finished (applied or rejected)."""
        await self._reloader.wait(count)


D = TypeVar("D", bound=PluginDaemon)


async def run_daemon(
    daemon: D,
    *,
    stop: asyncio.Event,
    ready: Callable[[D], None] | None = None,
    handle_sighup: bool = False,
) -> None:
    """Start ``daemon``, call ``ready`` with it, run until ``stop`` is set, then stop it.

    With ``handle_sighup`` (needs the main thread), SIGHUP requests a reload; the handler
    is installed before start, so a SIGHUP during start-up does not kill the process.
    """
    loop = asyncio.get_running_loop()
    if handle_sighup:
        loop.add_signal_handler(signal.SIGHUP, daemon.request_reload)
    try:
        async with daemon:
            if ready is not None:
                ready(daemon)
            await stop.wait()
    finally:
        if handle_sighup:
            loop.remove_signal_handler(signal.SIGHUP)

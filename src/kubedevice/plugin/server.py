"""PluginServer: hosts N plugins, each on its own socket, and keeps them registered.

Per plugin: bind the socket (mode 0600) and serve, then register with the kubelet, then
wait for a reason to start over: our socket deleted, ``kubelet.sock`` re-created, or the
kubelet's ListAndWatch stream closed and not reopened while ``kubelet.sock`` still
exists. All of it is driven by inotify events on the device plugin directory.

Why this module is over 600 lines: the serve -> register -> watch -> again cycle is one state
machine per plugin, and its transitions (socket deleted, kubelet.sock re-created, stream lost,
reload) must be read together; the pieces it drives (servicer, registration, watch, swap)
live in their own modules.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import errno
import logging
import os
import socket
import stat
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

import grpc

from kubedevice._api import KUBELET_MAX_RECV_MESSAGE_BYTES, KUBELET_SOCKET
from kubedevice.errors import ConfigError, KubeDeviceError, PluginServerError
from kubedevice.plugin.base import DevicePlugin
from kubedevice.plugin.config import (
    resolve_device_plugin_dir,
    validate_socket_name,
)
from kubedevice.plugin.daemon import serve_metrics
from kubedevice.plugin.hooks import check_hooks, device_snapshots
from kubedevice.plugin.registration import Backoff, KubeletChannels, register
from kubedevice.plugin.servicer import HOOK_ERRORS, DeviceTable, make_handler
from kubedevice.plugin.unixsock import (
    SocketWiped,
    bind_in_place,
    check_path_length,
    socket_identity,
    temp_path,
)
from kubedevice.plugin.watch import OVERFLOW, DirWatcher

if TYPE_CHECKING:
    from kubedevice.plugin.metrics import PluginMetrics
    from kubedevice.plugin.statushttp import StatusHttp

__all__ = ["PluginServer", "ServerState"]

log = logging.getLogger(__name__)


class ServerState(enum.Enum):
    """Lifecycle of a :class:`PluginServer`."""

    NEW = "new"
    RUNNING = "running"
    STOPPED = "stopped"


class _Phase(enum.Enum):
    IDLE = "idle"  # not serving
    SERVING = "serving"  # socket bound, not yet registered
    REGISTERED = "registered"


_PATH_HINT = "use a shorter device plugin directory or socket name"


def _answers(path: Path) -> bool:
    """True if something accepts connections on the Unix socket at ``path``."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.setblocking(False)
        err = probe.connect_ex(str(path))
    return err in (0, errno.EAGAIN, errno.EINPROGRESS)


async def _starting(path: Path) -> None:
    """Called after our socket is in place and before its gRPC server starts (a test seam)."""


class _Runtime:
    """One plugin inside a server: its table, gRPC server, source and registration loop."""

    def __init__(
        self, server: PluginServer, plugin: DevicePlugin, resource: str, socket_name: str
    ) -> None:
        self.server = server
        self.plugin = plugin
        self.resource = resource
        self.socket_name = socket_name
        self.socket_path = server.device_plugin_dir / socket_name
        self.kubelet_socket = server.device_plugin_dir / KUBELET_SOCKET
        self.table = DeviceTable(resource, server.metrics, server.max_message_bytes)
        self.table.on_stream_closed = self._stream_closed
        self.registered = asyncio.Event()
        self.count = 0
        self.count_changed = asyncio.Event()
        self.extra = {"resource": resource, "socket": str(self.socket_path)}
        self._phase = _Phase.IDLE
        self._restart = asyncio.Event()
        self._kubelet_changed = asyncio.Event()
        self._bound_ino: tuple[int, int, int] | None = None
        self._kubelet_ino: tuple[int, int, int] | None = None
        self._grpc: grpc.aio.Server | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._stream_timer: asyncio.TimerHandle | None = None
        #: Id of the ListAndWatch stream taken to be the kubelet's: the first one opened
        #: after our Register call started (a kubelet opens exactly one per registration).
        self._kubelet_stream = 0

    # ---- lifecycle -------------------------------------------------------------------

    async def start(self) -> None:
        pending = self.plugin._kd_pending
        if pending is not None:
            self.table.publish(pending)
        if self.server.device_plugin_dir.is_dir():  # else the loop serves once it appears
            await self._serve(take_over=True)
        self.plugin._kd_sink = self.table.publish
        self._tasks = [
            asyncio.create_task(self._source(), name=f"devices {self.resource}"),
            asyncio.create_task(self._run(), name=f"register {self.resource}"),
        ]

    async def stop(self) -> None:
        self._phase = _Phase.IDLE
        self._cancel_stream_timer()
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks)
        for task in self._tasks:
            if not task.cancelled() and task.exception() is not None:
                log.error(
                    "task %s failed", task.get_name(), exc_info=task.exception(), extra=self.extra
                )
        self._tasks = []
        self.table.close()
        await self._unserve()
        self.plugin._kd_sink = None
        self.registered.clear()
        log.info("stopped", extra=self.extra)

    # ---- serving ---------------------------------------------------------------------

    async def _serve(self, *, take_over: bool) -> None:
        try:
            await self._bind_and_start(take_over=take_over)
        except OSError as exc:
            raise PluginServerError(f"cannot serve on {self.socket_path}: {exc}") from exc

    async def _bind_and_start(self, *, take_over: bool) -> None:
        """Bind a fresh socket (mode 0600) and serve on it.

        gRPC binds under a temporary name that is hard-linked into place (then dropped),
        so the socket appears at its path atomically with its final mode, nothing that
        appeared at the path meanwhile is replaced, and gRPC's own unlink at shutdown (by
        path) hits the temporary name, never a socket someone else has put at our path.

        Args:
            take_over: Replace a socket that still answers (another instance of this
                plugin being replaced); otherwise such a socket is left alone and this
                fails with :class:`PluginServerError`.
        """
        path = self.socket_path
        tmp = temp_path(path)
        check_path_length(path, tmp, hint=_PATH_HINT)
        replace = False
        try:
            st = path.lstat()
        except FileNotFoundError:
            pass
        else:
            replace = True
            if not stat.S_ISSOCK(st.st_mode):
                raise PluginServerError(f"{path} exists and is not a socket; refusing to remove it")
            if _answers(path):
                if not take_over:
                    raise PluginServerError(
                        f"{path} is in use by another process (another instance of this "
                        "plugin?); not taking it back while it answers"
                    )
                log.warning(
                    "taking over %s from the process still serving on it", path, extra=self.extra
                )
            else:
                log.info("replacing stale socket", extra=self.extra)
        self.table.closed = False
        server = grpc.aio.server(options=[("grpc.max_send_message_length", -1)])
        server.add_generic_rpc_handlers(
            (make_handler(self.plugin, self.table, self.server.metrics),)
        )
        try:
            bound = bind_in_place(server, path, tmp, replace=replace)
        except PluginServerError:
            await server.stop(None)
            raise
        self._bound_ino = bound
        self._grpc = server  # before the await: a cancelled start still gets stopped
        await _starting(path)
        await server.start()
        self._phase = _Phase.SERVING
        log.info("serving on %s", path, extra=self.extra)
        # A removal reported while the server was starting was ignored (not serving yet):
        # look now, or the kubelet would dial a socket that is gone, forever.
        self.on_socket_event()

    async def _unserve(self) -> None:
        server, self._grpc = self._grpc, None
        self.table.close()
        bound, self._bound_ino = self._bound_ino, None
        # Remove our socket, and only ours: another process may have put its own there.
        if bound is not None and socket_identity(self.socket_path) == bound:
            with contextlib.suppress(FileNotFoundError):
                self.socket_path.unlink()
        if server is not None:
            await server.stop(0.5)

    # ---- devices ---------------------------------------------------------------------

    async def _source(self) -> None:
        try:
            async for snapshot in device_snapshots(self.plugin):
                try:
                    self.table.publish(snapshot)
                except ConfigError as exc:
                    last = self.table.snapshot
                    if last is None:  # nothing to serve: never leave it waiting unregistered
                        self.server._fail(ConfigError(f"{exc}; {self.resource} cannot be served"))
                        return
                    log.error(
                        "%s; still serving the last good list (%d devices)",
                        exc,
                        len(last),
                        extra=self.extra,
                    )
        except asyncio.CancelledError:
            raise
        except HOOK_ERRORS as exc:
            if self.table.snapshot is not None:
                log.exception(
                    "the device source failed; keeping the last device list", extra=self.extra
                )
                return
            # Nothing to serve, ever: stop rather than sit there unregistered.
            if isinstance(exc, KubeDeviceError):  # our own one-line errors (a bad Device)
                why = str(exc)
            else:  # the author's bug: the traceback helps
                log.exception("the device source failed", extra=self.extra)
                why = f"{type(exc).__name__}: {exc}"
            self.server._fail(
                PluginServerError(
                    f"the device source of {self.resource} failed before its first list: {why}"
                )
            )

    # ---- registration loop -----------------------------------------------------------

    async def _run(self) -> None:
        if self.table.encoded is None:
            log.info("waiting for the first device list before registering", extra=self.extra)
            await self.table.wait_first()
        backoff = self.server.backoff_factory()
        first = self._phase is _Phase.SERVING
        take_over = not first  # the first socket we bind may replace our predecessor's
        while True:
            self._restart.clear()
            if not first:
                # Only changes from now on may end the wait after a failure.
                self._kubelet_changed.clear()
                if not self.server.device_plugin_dir.is_dir():
                    # The kubelet creates it; we never do. The watcher reports it.
                    await self._wait(self._kubelet_changed, None)
                    continue
                try:
                    await self._serve(take_over=take_over)
                    take_over = False
                except KubeDeviceError as exc:
                    delay = backoff.next_delay()
                    # A socket wiped by a restarting kubelet is routine, not an error.
                    level = logging.WARNING if isinstance(exc, SocketWiped) else logging.ERROR
                    log.log(level, "%s; retrying in %.1f s", exc, delay, extra=self.extra)
                    await self._wait(self._kubelet_changed, delay)
                    continue
            first = False
            try:
                if await self._register(backoff):
                    await self._restart.wait()
            finally:
                self._phase = _Phase.IDLE
                self._cancel_stream_timer()
                self.registered.clear()
                await self._unserve()
            log.info("serving again on a fresh socket and registering again", extra=self.extra)

    async def _register(self, backoff: Backoff) -> bool:
        """Register until it works; False if a restart was requested first."""
        waiting_logged = False
        failed_at: tuple[int, int, int] | None = None  # the kubelet.sock the last failure hit
        while not self._restart.is_set():
            self._kubelet_changed.clear()
            if self._bound_ino is None or socket_identity(self.socket_path) != self._bound_ino:
                # Whatever happened to the event: the kubelet could never dial us back.
                log.warning(
                    "our socket %s is gone or replaced; serving on a fresh one",
                    self.socket_path,
                    extra=self.extra,
                )
                return False
            ino = socket_identity(self.kubelet_socket)
            if ino is None:
                if not waiting_logged:
                    log.info(
                        "waiting for the kubelet socket %s", self.kubelet_socket, extra=self.extra
                    )
                    waiting_logged = True
                await self._wait(self._kubelet_changed, None)
                continue
            baseline = self.table.streams_served
            reg = asyncio.ensure_future(self._register_call(ino))
            restart = asyncio.ensure_future(self._restart.wait())
            try:
                await asyncio.wait((reg, restart), return_when=asyncio.FIRST_COMPLETED)
            finally:
                # Never swallow a cancellation of this task: wait, do not await.
                restart.cancel()
                reg.cancel()
                await asyncio.wait((reg, restart))
            if self._restart.is_set() or reg.cancelled():
                return False
            exc = reg.exception()
            if exc is not None:
                if ino != failed_at:  # a kubelet not failed before: start the backoff over
                    backoff.reset()
                    failed_at = ino
                delay = backoff.next_delay()
                log.warning("%s; retrying in %.2f s", exc, delay, extra=self.extra)
                await self._wait(self._kubelet_changed, delay)
                continue
            backoff.reset()
            # The kubelet.sock that answered: the one there now. The one read before the
            # call may be a dead kubelet's, replaced by the starting kubelet that answered
            # (kept, the check below would take the new one for another restart and
            # register twice). A kubelet that restarts during the call wipes our socket.
            self._kubelet_ino = socket_identity(self.kubelet_socket) or ino
            self._phase = _Phase.REGISTERED
            self.count += 1
            self.registered.set()
            changed, self.count_changed = self.count_changed, asyncio.Event()
            changed.set()
            if self.server.metrics is not None:
                self.server.metrics.registered(self.resource, self.count)
            log.info("registered with the kubelet (registration #%d)", self.count, extra=self.extra)
            # kubelet.sock may have been re-created, our socket removed or the kubelet's
            # stream closed while the call was in flight.
            self._kubelet_stream = baseline + 1
            self.on_kubelet_event()
            self.on_socket_event()
            if (
                self.table.streams_served >= self._kubelet_stream
                and self._kubelet_stream not in self.table.open_ids
            ):
                self._stream_closed(self._kubelet_stream)
            return True
        return False

    async def _register_call(self, kubelet: tuple[int, int, int]) -> None:
        """One Register, on the channel every plugin here shares for this kubelet."""
        async with self.server._kubelet_channels.use(kubelet) as channel:
            await register(
                self.kubelet_socket,
                endpoint=self.socket_name,
                resource_name=self.resource,
                options=self.plugin.options(),
                deadline=self.server.register_timeout,
                channel=channel,
            )

    async def _wait(self, event: asyncio.Event, limit: float | None) -> None:
        """Wait for ``event`` or a restart request, at most ``limit`` seconds."""
        waits = [asyncio.ensure_future(event.wait()), asyncio.ensure_future(self._restart.wait())]
        try:
            await asyncio.wait(waits, timeout=limit, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for fut in waits:
                fut.cancel()

    def _request_restart(self, why: str) -> None:
        if self._phase is _Phase.IDLE or self._restart.is_set():
            return
        log.warning("%s", why, extra=self.extra)
        self._restart.set()

    # ---- events ----------------------------------------------------------------------

    def on_socket_event(self) -> None:
        self._kubelet_changed.set()  # a socket that blocked a re-serve may be gone
        if self._phase is not _Phase.IDLE and socket_identity(self.socket_path) != self._bound_ino:
            self._request_restart(f"our socket {self.socket_path} was removed (kubelet restart?)")

    def on_kubelet_event(self) -> None:
        self._kubelet_changed.set()
        if self._phase is _Phase.REGISTERED:
            ino = socket_identity(self.kubelet_socket)
            if ino is not None and ino != self._kubelet_ino:
                self._request_restart(f"{self.kubelet_socket} was re-created (kubelet restart)")

    def _stream_closed(self, sid: int) -> None:
        """A ListAndWatch stream ended; if it was the kubelet's, start the grace timer.

        Other clients' streams (monitoring tools, the conformance kit's probes) neither
        start it nor, while they stay open, hide that the kubelet's stream ended.
        """
        if self._phase is not _Phase.REGISTERED or sid != self._kubelet_stream:
            return
        self._cancel_stream_timer()
        self._stream_timer = asyncio.get_running_loop().call_later(
            self.server.stream_grace,
            self._stream_grace_over,
            self.count,
            sid,
            self.table.streams_served,
        )

    def _stream_grace_over(self, count: int, sid: int, served_at_close: int) -> None:
        self._stream_timer = None
        if (
            self._phase is not _Phase.REGISTERED
            or self.count != count
            or self._kubelet_stream != sid
            or socket_identity(self.kubelet_socket) is None
        ):
            return
        reopened = sorted(i for i in self.table.open_ids if i > served_at_close)
        if reopened:  # the kubelet came back on a new stream: follow that one
            self._kubelet_stream = reopened[0]
            return
        self._request_restart(
            "the kubelet closed our ListAndWatch stream and did not reopen it while "
            f"{self.kubelet_socket} still exists; registering again"
        )

    def _cancel_stream_timer(self) -> None:
        if self._stream_timer is not None:
            self._stream_timer.cancel()
            self._stream_timer = None


class PluginServer:
    """Hosts device plugins, one socket each, and keeps them registered with the kubelet.

    Use it as an async context manager; plugins can be added and removed while it runs::

        async with kubedevice.PluginServer(device_plugin_dir) as server:
            await server.add(MyPlugin())
            await server.wait_registered("example.com/foo", timeout=5)

    Args:
        device_plugin_dir: The kubelet's device plugin directory; ``None`` means
            ``$DP_DEVICE_PLUGIN_DIR`` or ``/var/lib/kubelet/device-plugins``. Never
            created: when it is missing, the server waits for the kubelet to create it.
        register_timeout: Deadline of each Register call, in seconds.
        stream_grace: How long the kubelet may leave us without a ListAndWatch stream
            (while ``kubelet.sock`` exists) before we register again, in seconds.
        backoff_initial: First delay between failed registrations, in seconds.
        backoff_max: Largest delay between failed registrations, in seconds.
        metrics: Where to record metrics, or ``None`` for none (unless ``metrics_address``).
        metrics_address: ``host:port`` to expose Prometheus metrics on over HTTP while the
            server runs; creates a :class:`PluginMetrics` if ``metrics`` is ``None``.
        max_message_bytes: Largest ListAndWatch message to send (the kubelet's limit).

    Raises:
        ConfigError: ``metrics_address`` is not ``HOST:PORT`` with a port 0-65535.
    """

    def __init__(
        self,
        device_plugin_dir: str | os.PathLike[str] | None = None,
        *,
        register_timeout: float = 10.0,
        stream_grace: float = 1.0,
        backoff_initial: float = 0.1,
        backoff_max: float = 5.0,
        metrics: PluginMetrics | None = None,
        metrics_address: str | None = None,
        max_message_bytes: int = KUBELET_MAX_RECV_MESSAGE_BYTES,
    ) -> None:
        if metrics_address is not None:
            from kubedevice.plugin.metrics import PluginMetrics, parse_metrics_address

            parse_metrics_address(metrics_address)  # a bad address fails here, not at start
            if metrics is None:
                metrics = PluginMetrics()
        self.metrics_address = metrics_address
        self._http: StatusHttp | None = None
        self.device_plugin_dir = resolve_device_plugin_dir(device_plugin_dir)
        self.register_timeout = register_timeout
        self.stream_grace = stream_grace
        self.metrics = metrics
        self.max_message_bytes = max_message_bytes
        self._backoff = (backoff_initial, backoff_max)
        self.state = ServerState.NEW
        self._runtimes: dict[str, _Runtime] = {}
        self._by_socket: dict[str, _Runtime] = {}  # each event names one socket: no scan
        #: Register calls share one channel per kubelet (200 plugins: one connection)
        self._kubelet_channels = KubeletChannels(self.device_plugin_dir / KUBELET_SOCKET)
        self._watcher: DirWatcher | None = None
        self._lock = asyncio.Lock()
        self._failure: KubeDeviceError | None = None
        self._failed = asyncio.Event()
        self._failure_waiters = 0

    def backoff_factory(self) -> Backoff:
        """A fresh registration backoff with this server's settings."""
        return Backoff(initial=self._backoff[0], maximum=self._backoff[1])

    async def __aenter__(self) -> PluginServer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def start(self) -> None:
        """Start watching the directory; one that does not exist yet is waited for.

        The directory is the kubelet's to create: when it is missing, plugins added are
        served and registered once it appears.

        Raises:
            PluginServerError: The server was already started, the directory is unusable,
                or the metrics address cannot be listened on.
            ConfigError: The metrics address is not a usable ``HOST:PORT``.
        """
        if self.state is not ServerState.NEW:
            raise PluginServerError(
                f"PluginServer is {self.state.value}; it cannot be started again"
            )
        directory = self.device_plugin_dir
        if not directory.is_dir():
            if directory.exists():
                raise PluginServerError(f"{directory} is not a directory")
            log.info("waiting for the kubelet to create %s", directory)  # never created here
        self._watcher = DirWatcher(directory, self._on_change)
        try:
            await self._watcher.start()
        except OSError as exc:
            raise PluginServerError(f"cannot watch {directory}: {exc}") from exc
        if self.metrics is not None and self.metrics_address is not None:
            try:
                self._http = await serve_metrics(self.metrics, self.metrics_address)
            except KubeDeviceError:
                await self._watcher.stop()
                self._watcher = None
                raise
            log.info("metrics on %s", self.metrics_url)
        self.state = ServerState.RUNNING
        log.info("plugin server watching %s", self.device_plugin_dir)

    @property
    def metrics_url(self) -> str | None:
        """Where the metrics are served while running (the real port when ``:0`` was asked)."""
        if self._http is None:
            return None
        host, port = self._http.server_address[:2]
        if ":" in host:  # an IPv6 address is bracketed in a URL (RFC 3986)
            host = f"[{host}]"
        return f"http://{host}:{port}/metrics"

    async def stop(self) -> None:
        """Stop every plugin: end the streams, remove the sockets. Idempotent."""
        if self.state is not ServerState.RUNNING:
            self.state = ServerState.STOPPED
            return
        self.state = ServerState.STOPPED
        # Under the lock: an add() in progress finishes first and is then removed here.
        async with self._lock:
            while self._runtimes:
                await self._remove_locked(next(iter(self._runtimes)))
        await self._kubelet_channels.close()
        if self._watcher is not None:
            await self._watcher.stop()
            self._watcher = None
        http, self._http = self._http, None
        if http is not None:
            await http.stop()

    def check_plugin(self, plugin: DevicePlugin) -> tuple[str, str]:
        """What :meth:`add` checks before it binds: names, hooks, the socket path's length.

        Nothing is changed; :class:`~kubedevice.plugin.swap.PluginSwap` calls it for every
        plugin of a reload before touching any.

        Returns:
            The plugin's resource name and socket file name.

        Raises:
            InvalidResourceNameError: The kubelet would reject the resource name.
            ConfigError: The socket name is not a bare file name, or a hook cannot take
                the server's arguments.
            PluginServerError: The socket path would be longer than AF_UNIX allows.
        """
        if not isinstance(plugin, DevicePlugin):
            raise ConfigError(f"{plugin!r} is not a kubedevice.DevicePlugin")
        resource = plugin.validated_resource_name()
        socket_name = validate_socket_name(plugin.effective_socket_name())
        check_hooks(plugin)
        path = self.device_plugin_dir / socket_name
        check_path_length(path, temp_path(path), hint=_PATH_HINT)
        return resource, socket_name

    async def add(self, plugin: DevicePlugin) -> None:
        """Start serving ``plugin`` and register it (registration continues in the background).

        The resource name and the hooks are checked before any network call; the socket
        is bound before this returns (when the directory exists; else once it appears),
        so a path that exists and is not a socket fails here.

        Args:
            plugin: The plugin to serve.

        Raises:
            InvalidResourceNameError: The kubelet would reject the plugin's resource name.
            ConfigError: The resource or socket name is already served here, or a hook
                cannot take the server's arguments.
            PluginServerError: The server is not running, or the socket cannot be bound.
        """
        resource, socket_name = self.check_plugin(plugin)
        async with self._lock:
            if self.state is not ServerState.RUNNING:
                raise PluginServerError("the PluginServer is not running (use 'async with')")
            if resource in self._runtimes:
                raise ConfigError(f"resource {resource!r} is already served by this server")
            if any(rt.socket_name == socket_name for rt in self._runtimes.values()):
                raise ConfigError(f"socket name {socket_name!r} is already used by this server")
            if plugin._kd_sink is not None:
                raise ConfigError(f"{plugin!r} is already served")
            runtime = _Runtime(self, plugin, resource, socket_name)
            self._by_socket[socket_name] = runtime  # its socket's events count from now
            try:
                await runtime.start()
            except BaseException:
                del self._by_socket[socket_name]
                raise
            self._runtimes[resource] = runtime

    async def remove(self, resource_name: str) -> None:
        """Stop serving a resource: end its streams and remove its socket.

        Args:
            resource_name: The plugin's resource name.

        Raises:
            ConfigError: No plugin with that resource name is served here.
        """
        async with self._lock:
            await self._remove_locked(resource_name)

    async def _remove_locked(self, resource_name: str) -> None:
        runtime = self._runtimes.pop(resource_name, None)
        if runtime is None:
            raise ConfigError(f"resource {resource_name!r} is not served by this server")
        self._by_socket.pop(runtime.socket_name, None)
        await runtime.stop()
        if self.metrics is not None:
            self.metrics.forget(resource_name)

    async def wait_failed(self) -> KubeDeviceError:
        """Wait until a plugin fails for good; the error.

        A plugin fails for good when its first device list is refused (a device ID twice,
        an item that is not a :class:`Device`) or its ``devices()`` raises before yielding
        one (a :class:`Device` with a bad value, say): it has nothing to serve and would
        never register. While someone waits here the error is theirs to report; otherwise it is
        logged.

        Returns:
            The error.
        """
        self._failure_waiters += 1
        try:
            await self._failed.wait()
        finally:
            self._failure_waiters -= 1
        assert self._failure is not None
        return self._failure

    def _fail(self, error: KubeDeviceError) -> None:
        if self._failure is None:
            self._failure = error
            self._failed.set()
            if not self._failure_waiters:
                log.error("%s", error)

    @property
    def resource_names(self) -> tuple[str, ...]:
        """The resource names currently served."""
        return tuple(self._runtimes)

    def socket_path(self, resource_name: str) -> Path:
        """The socket path of a served resource."""
        return self._runtime(resource_name).socket_path

    def registered(self, resource_name: str) -> asyncio.Event:
        """An event that is set while ``resource_name`` is registered with the kubelet.

        It is cleared when the plugin starts over (kubelet restart, lost stream).
        """
        return self._runtime(resource_name).registered

    def registration_count(self, resource_name: str) -> int:
        """How many times ``resource_name`` registered successfully."""
        return self._runtime(resource_name).count

    async def wait_registered(
        self,
        resource_name: str,
        *,
        count: int = 1,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> None:
        """Wait until ``resource_name`` has registered ``count`` times and is registered now.

        Args:
            resource_name: The plugin's resource name.
            count: The number of successful registrations to wait for.
            timeout: Seconds to wait at most; ``None`` waits forever.

        Raises:
            TimeoutError: ``timeout`` passed first.
        """
        runtime = self._runtime(resource_name)

        async def _wait() -> None:
            while runtime.count < count or not runtime.registered.is_set():
                waiter = runtime.count_changed
                if runtime.count >= count:
                    await runtime.registered.wait()
                else:
                    await waiter.wait()

        async with asyncio.timeout(timeout):  # not wait_for: on 3.11 it may swallow a cancel
            await _wait()

    def _runtime(self, resource_name: str) -> _Runtime:
        try:
            return self._runtimes[resource_name]
        except KeyError:
            raise ConfigError(f"resource {resource_name!r} is not served by this server") from None

    def _on_change(self, name: str) -> None:
        if name in (KUBELET_SOCKET, OVERFLOW):
            for runtime in list(self._by_socket.values()):
                runtime.on_kubelet_event()
                if name == OVERFLOW:
                    runtime.on_socket_event()
            return
        owner = self._by_socket.get(name)
        if owner is not None:
            owner.on_socket_event()

    def __repr__(self) -> str:
        return f"<PluginServer {self.device_plugin_dir} {self.state.value} {list(self._runtimes)}>"

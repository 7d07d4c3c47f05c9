"""The kit's one door to the Kubernetes API: ResourceClaims (and their status), ResourceSlices,
the Node.

Reads the credentials itself (:mod:`kubedevice.dra.api.credentials`: the service account, and
kubeconfigs with tokens, client certificates or basic auth) and calls over ``http.client``
(:mod:`kubedevice.dra.api.http`); only a kubeconfig that needs a credential plugin (``exec``,
``auth-provider``) or a proxy is loaded with the official ``kubernetes`` client (the
``kube-client`` extra) and called through its ``urllib3`` pool, both imported only then.
Plain JSON dicts in and out (no generated models: a field newer than the client is never
dropped). Every failure is a :class:`~kubedevice.errors.KubeApiError`
with the HTTP status (0: not reached, or no complete answer in time); :attr:`KubeClient.failing`
says whether the last call found the API server unusable (a driver's ``/readyz`` reads it).

The calls are coroutines. Each runs in this client's own bounded thread pool, never in the
event loop's default one: a slow API server holds at most these threads, and the local work
that runs in threads (CDI specs, the checkpoint, plain-function hooks) never waits behind
it. Each call has one total deadline (``deadline_s``, retries included) on the whole
answer, enforced by shutting the connection's socket when it passes: a server that
stalls, or trickles a byte now and then, is given up on time. :meth:`KubeClient.close`
ends the calls still in flight at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Final, TypeVar

from kubedevice.dra.api.credentials import ClientEndpoint, Endpoint, OwnEndpoint, read_credentials
from kubedevice.dra.api.http import (
    MAX_BODY,
    Connections,
    NotConnected,
    json_answer,
    read_body,
    reason,
)
from kubedevice.errors import KubeApiError
from kubedevice.kubeconfig import resolve_kubeconfig

__all__ = ["API_WORKERS", "DEFAULT_DEADLINE_S", "WATCH_TIMEOUT_S", "KubeClient"]

log = logging.getLogger(__name__)

_RESOURCE: Final = "/apis/resource.k8s.io/v1"
#: The total time one call may take, retries included: under the kubelet's 45 s for a
#: NodePrepareResources, so a claim that cannot be read fails with a clear error first.
DEFAULT_DEADLINE_S: Final = 30.0
#: Threads for API calls (at most this many calls in flight; more wait their turn).
API_WORKERS: Final = 8
#: How long the API server is asked to keep one watch open (it ends it then, or earlier).
WATCH_TIMEOUT_S: Final = 1800
#: Tries of a call whose connection could not be made (nothing was sent).
_TRIES: Final = 3
_CONNECT_S: Final = 10.0

_T = TypeVar("_T")


class _Watch:
    """The sockets of one call; :meth:`fire` shuts them (the deadline, or a close)."""

    def __init__(self) -> None:
        self.fired = False
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()

    def add(self, sock: socket.socket | None) -> None:
        if sock is None:
            return
        with self._lock:
            self._sockets.append(sock)
            fired = self.fired
        if fired:
            _shut(sock)

    def fire(self) -> None:
        with self._lock:
            self.fired = True
            sockets = list(self._sockets)
        for sock in sockets:
            _shut(sock)


def _shut(sock: socket.socket) -> None:
    # the plain socket's shutdown (not SSLSocket's, which drops its TLS state under a
    # reader): a recv blocked in another thread returns at once
    with contextlib.suppress(OSError):
        socket.socket.shutdown(sock, socket.SHUT_RDWR)


_current = threading.local()  # .watch: the _Watch of the call this thread runs


def _register(sock: socket.socket | None) -> None:
    watch = getattr(_current, "watch", None)
    if watch is not None:
        watch.add(sock)


def _tracked(base: type) -> type:
    """``base`` (a urllib3 connection class) registering its socket with the current call:
    a new one as soon as it exists (the TLS handshake included), a reused one before the
    request is sent."""

    class Tracked(base):  # type: ignore[misc]
        def _new_conn(self) -> Any:
            sock = super()._new_conn()
            _register(sock)
            return sock

        def request(self, *args: Any, **kwargs: Any) -> Any:
            _register(getattr(self, "sock", None))
            return super().request(*args, **kwargs)

    Tracked.__name__ = f"Tracked{base.__name__}"
    return Tracked


def _tracked_manager(manager: Any) -> Any:
    """``manager`` (a ``urllib3.PoolManager``) with its connections' sockets tracked."""
    from urllib3 import HTTPConnectionPool as Plain, HTTPSConnectionPool as Tls

    pools: dict[str, Any] = {"http": Plain, "https": Tls}
    manager.pool_classes_by_scheme = {
        scheme: type(f"Tracked{b.__name__}", (b,), {"ConnectionCls": _tracked(b.ConnectionCls)})
        for scheme, b in pools.items()
    }
    return manager


class KubeClient:
    """A small client for the calls a DRA driver makes. Build it with :meth:`connect`.

    Args:
        endpoint: The server, its credentials and its connection pool.
        deadline_s: The total time of one call, retries included.
        workers: Threads for API calls.
    """

    def __init__(
        self,
        endpoint: Endpoint,
        *,
        deadline_s: float = DEFAULT_DEADLINE_S,
        workers: int = API_WORKERS,
    ) -> None:
        self._endpoint = endpoint
        self.deadline_s = deadline_s
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kube-api")
        self._watches: set[_Watch] = set()
        self._lock = threading.Lock()
        self._closed = False
        #: Why the last call failed when the API server could not be used (not reached, no
        #: answer in time, credentials refused: 401/403, a server error: 5xx); ``None``
        #: once a call gets any other answer (a 404 or a conflict is the server working).
        self.failing: str | None = None
        #: Own connections (own credentials), else the official client's urllib3 pool.
        self._connections: Connections | None = None
        self._manager: Any = None
        self._retried: tuple[type[Exception], ...] = (NotConnected,)
        if isinstance(endpoint, OwnEndpoint):
            self._connections = Connections(endpoint.credentials)
        else:
            self._manager = _tracked_manager(endpoint.pool_manager)
            import urllib3

            self._retried = (NotConnected, urllib3.exceptions.NewConnectionError)

    @classmethod
    def connect(
        cls, kubeconfig: Path | None, *, deadline_s: float = DEFAULT_DEADLINE_S
    ) -> KubeClient:
        """Load the credentials: ``kubeconfig``, else ``$KUBECONFIG``, else
        ``~/.kube/config``, else the in-cluster service account
        (:func:`kubedevice.kubeconfig.resolve_kubeconfig`).

        Raises:
            ConfigError: There is no kubeconfig (and this is not a pod), it cannot be
                loaded, or it needs the official client and that is not installed.
        """
        path = resolve_kubeconfig(kubeconfig)
        credentials = read_credentials(path)
        if credentials is not None:
            return cls(OwnEndpoint(credentials), deadline_s=deadline_s)
        return cls(ClientEndpoint.load(path), deadline_s=deadline_s)

    def close(self) -> None:
        """End the calls in flight (they fail at once) and close the connections."""
        with self._lock:
            self._closed = True
            watches = list(self._watches)
        for watch in watches:
            watch.fire()
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self._connections is not None:
            self._connections.close()
        self._endpoint.close()

    # ---- the calls -----------------------------------------------------------------

    async def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        """The ResourceClaim ``namespace/name``."""
        return await self._async("GET", f"{_RESOURCE}/namespaces/{namespace}/resourceclaims/{name}")

    async def get_node(self, name: str) -> dict[str, Any]:
        """The Node ``name``."""
        return await self._async("GET", f"/api/v1/nodes/{name}")

    async def list_slices(self, driver: str, node: str) -> list[dict[str, Any]]:
        """This driver's ResourceSlices on ``node`` (field selectors on driver and node)."""
        return (await self.list_slices_at(driver, node))[0]

    async def list_slices_at(self, driver: str, node: str) -> tuple[list[dict[str, Any]], str]:
        """:meth:`list_slices` and the list's ``resourceVersion`` (to watch from)."""
        answer = await self._async(
            "GET",
            f"{_RESOURCE}/resourceslices",
            query=[("fieldSelector", f"spec.driver={driver},spec.nodeName={node}")],
        )
        items: list[dict[str, Any]] = answer.get("items") or []
        return items, str(answer.get("metadata", {}).get("resourceVersion", ""))

    async def watch_slices(
        self,
        driver: str,
        node: str,
        resource_version: str,
        on_event: Callable[[str, str], None],
        *,
        timeout_s: int = WATCH_TIMEOUT_S,
    ) -> None:
        """Watch this driver's ResourceSlices on ``node`` from ``resource_version``: each
        event's type (``ADDED``, ``MODIFIED``, ``DELETED``; ``BOOKMARK``: the version reached)
        and its object's ``resourceVersion`` go to ``on_event`` on this loop. Returns when
        the API server ends the watch (after about ``timeout_s``).

        The stream is read by a thread of its own (not one of the API threads: a watch
        holds its thread for as long as it runs); an idle watch costs no wake-ups.
        Cancelling the call, or :meth:`close`, ends it at once.

        Raises:
            KubeApiError: It cannot be made or broke off (status 410: the version is too
                old, list again).
        """
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        # its error is read here, or nobody waits any more (cancelled): never "unretrieved"
        done.add_done_callback(lambda f: f.cancelled() or f.exception())
        watch = _Watch()
        with self._lock:
            if self._closed:
                raise KubeApiError("watch: the API client is closed")
            self._watches.add(watch)
        query = [
            ("fieldSelector", f"spec.driver={driver},spec.nodeName={node}"),
            ("watch", "1"),
            ("allowWatchBookmarks", "true"),
            ("resourceVersion", resource_version),
            ("timeoutSeconds", str(timeout_s)),
        ]

        def deliver(kind: str, version: str) -> None:
            if not done.done():
                on_event(kind, version)

        def finish(error: BaseException | None) -> None:
            if done.done():
                return
            if error is None:
                done.set_result(None)
            else:
                done.set_exception(error)

        def run() -> None:
            _current.watch = watch
            try:
                self._stream(f"{_RESOURCE}/resourceslices", query, timeout_s, watch, deliver, loop)
                error: BaseException | None = None
            except BaseException as exc:  # handed to the awaiting task
                error = exc
            finally:
                _current.watch = None
                with self._lock:
                    self._watches.discard(watch)
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                loop.call_soon_threadsafe(finish, error)

        threading.Thread(target=run, name="kube-watch", daemon=True).start()
        try:
            await asyncio.shield(done)
        except asyncio.CancelledError:
            watch.fire()  # the thread's read ends at once
            raise

    def _stream(
        self,
        path: str,
        query: list[tuple[str, str]],
        timeout_s: int,
        watch: _Watch,
        deliver: Callable[[str, str], None],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        url, headers = self._endpoint.request(path, query, "application/json")
        conn: Any = None
        response: Any = None
        try:
            # the server ends the watch after timeout_s; a read that long silent is a
            # connection that is gone
            if self._connections is not None:
                conn, response = self._connections.send(
                    "GET",
                    url,
                    None,
                    headers,
                    connect_s=_CONNECT_S,
                    timeout_s=timeout_s + 60,
                    register=_register,
                )
            else:
                import urllib3

                response = self._manager.request(
                    "GET",
                    url,
                    headers=headers,
                    timeout=urllib3.Timeout(connect=_CONNECT_S, read=timeout_s + 60),
                    retries=False,
                    redirect=False,
                    preload_content=False,
                )
        except Exception as exc:
            error = KubeApiError(f"watch {path}: {_what(exc)}")
            self._note(error)
            raise error from None
        try:
            status = int(response.status)
            if not 200 <= status <= 299:
                error = KubeApiError(
                    f"watch {path}: {status} {reason(response.read(65536))}", status=status
                )
                self._note(error)
                raise error
            self._note(None)
            buffer = b""
            while chunk := response.read1(65536):
                buffer += chunk
                if len(buffer) > MAX_BODY:
                    raise KubeApiError(f"watch {path}: an event over {MAX_BODY} bytes")
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    kind = str(event.get("type", ""))
                    if kind == "ERROR":
                        code = int(event.get("object", {}).get("code", 0) or 0)
                        message = event.get("object", {}).get("message", "")
                        raise KubeApiError(f"watch {path}: {code} {message}", status=code)
                    meta = event.get("object", {}).get("metadata", {})
                    loop.call_soon_threadsafe(deliver, kind, str(meta.get("resourceVersion", "")))
        except KubeApiError:
            raise
        except Exception as exc:  # the connection broke, or close() shut it
            if watch.fired:
                raise KubeApiError(f"watch {path}: ended (the client is closing)") from None
            raise KubeApiError(f"watch {path}: {_what(exc)}") from None
        finally:
            response.close()  # never back to the pool: a watch's connection is done
            if conn is not None:
                conn.close()
            else:
                response.release_conn()

    async def create_slice(self, body: dict[str, Any]) -> dict[str, Any]:
        """Create a ResourceSlice (``metadata.generateName`` names it, when given)."""
        return await self._async("POST", f"{_RESOURCE}/resourceslices", body=body)

    async def replace_slice(self, body: dict[str, Any]) -> dict[str, Any]:
        """Replace a ResourceSlice (its ``metadata.resourceVersion`` guards against races)."""
        name = body["metadata"]["name"]
        return await self._async("PUT", f"{_RESOURCE}/resourceslices/{name}", body=body)

    async def apply_claim_status(
        self, namespace: str, name: str, body: dict[str, Any], manager: str
    ) -> dict[str, Any]:
        """Server-side apply ``body`` to the ResourceClaim's status as field ``manager``
        (only that manager's fields change; ``status.devices`` entries of other drivers stay).
        """
        return await self._async(
            "PATCH",
            f"{_RESOURCE}/namespaces/{namespace}/resourceclaims/{name}/status",
            query=[("fieldManager", manager), ("force", "true")],
            body=body,
            content_type="application/apply-patch+yaml",
        )

    async def delete_slice(self, name: str, resource_version: str | None = None) -> None:
        """Delete a ResourceSlice (gone already is fine)."""
        body: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if resource_version:
            body["preconditions"] = {"resourceVersion": resource_version}
        try:
            await self._async("DELETE", f"{_RESOURCE}/resourceslices/{name}", body=body)
        except KubeApiError as exc:
            if exc.status != 404:
                raise

    # ---- plumbing ------------------------------------------------------------------

    async def _async(
        self,
        method: str,
        path: str,
        *,
        query: list[tuple[str, str]] | None = None,
        body: dict[str, Any] | None = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        # the deadline runs from now: time spent waiting for a free thread counts too; it
        # is kept by the event loop's timer (a thread per call, as call() starts, costs
        # a thread start, and its handshake, on every call)
        end = time.monotonic() + self.deadline_s
        watch = _Watch()
        loop = asyncio.get_running_loop()
        timer = loop.call_later(self.deadline_s, watch.fire)
        try:
            future = self._in_pool(
                lambda: self._call(method, path, query, body, content_type, end, watch)
            )
        except BaseException:
            timer.cancel()
            raise
        # kept until the thread is done with the call, even if the caller stops waiting
        future.add_done_callback(lambda _done: timer.cancel())
        return await future

    def _in_pool(self, fn: Callable[[], _T]) -> asyncio.Future[_T]:
        loop = asyncio.get_running_loop()
        try:
            return loop.run_in_executor(self._pool, fn)
        except RuntimeError:  # closed: shut down
            raise KubeApiError("the API client is closed") from None

    def call(
        self,
        method: str,
        path: str,
        *,
        query: list[tuple[str, str]] | None = None,
        body: dict[str, Any] | None = None,
        content_type: str = "application/json",
        until: float | None = None,
    ) -> dict[str, Any]:
        """One API call, blocking, within :attr:`deadline_s` (retries included), or until
        the :func:`time.monotonic` time ``until``; the body goes as JSON (an apply patch's
        YAML is JSON text too)."""
        end = time.monotonic() + self.deadline_s if until is None else until
        watch = _Watch()
        timer = threading.Timer(max(end - time.monotonic(), 0.0), watch.fire)
        timer.daemon = True
        timer.start()
        try:
            return self._call(method, path, query, body, content_type, end, watch)
        finally:
            timer.cancel()

    def _call(
        self,
        method: str,
        path: str,
        query: list[tuple[str, str]] | None,
        body: dict[str, Any] | None,
        content_type: str,
        end: float,
        watch: _Watch,
    ) -> dict[str, Any]:
        """:meth:`call`, with ``watch`` fired by the caller's timer at ``end``."""
        with self._lock:
            if self._closed:
                raise KubeApiError(f"{method} {path}: the API client is closed")
            self._watches.add(watch)
        left = end - time.monotonic()
        if left <= 0:
            with self._lock:
                self._watches.discard(watch)
            error = KubeApiError(
                f"{method} {path}: no complete answer within {self.deadline_s:g} s "
                "(it waited for a free connection)"
            )
            self._note(error)
            raise error
        _current.watch = watch
        try:
            answer = self._tries(method, path, query, body, content_type, end, watch)
        except KubeApiError as exc:
            self._note(exc)
            raise
        finally:
            _current.watch = None
            with self._lock:
                self._watches.discard(watch)
        self.failing = None
        return answer

    def _note(self, error: KubeApiError | None) -> None:
        """Record how a call ended (see :attr:`failing`)."""
        if error is None or not _unusable(error.status):
            self.failing = None
        else:
            self.failing = str(error)

    def _tries(
        self,
        method: str,
        path: str,
        query: list[tuple[str, str]] | None,
        body: dict[str, Any] | None,
        content_type: str,
        end: float,
        watch: _Watch,
    ) -> dict[str, Any]:
        for attempt in range(_TRIES):
            try:
                return self._once(method, path, query, body, content_type, end)
            except self._retried as exc:
                left = end - time.monotonic()
                if watch.fired or attempt == _TRIES - 1 or left < 0.5:
                    raise KubeApiError(f"{method} {path}: {_what(exc)}") from None
                time.sleep(min(0.2 * 2**attempt, left / 2))
            except KubeApiError:
                raise
            except Exception as exc:  # urllib3/ssl/socket/auth errors
                # the deadline shut the socket, or a socket timeout (set to what was left)
                # ran out a hair before it fired: either way, the deadline
                if watch.fired or time.monotonic() >= end - 0.01:
                    break
                raise KubeApiError(f"{method} {path}: {_what(exc)}") from None
        raise KubeApiError(
            f"{method} {path}: no complete answer within {self.deadline_s:g} s"
            if not self._closed
            else f"{method} {path}: the API client was closed"
        )

    def _once(
        self,
        method: str,
        path: str,
        query: list[tuple[str, str]] | None,
        body: dict[str, Any] | None,
        content_type: str,
        end: float,
    ) -> dict[str, Any]:
        url, headers = self._endpoint.request(path, query or [], content_type)
        left = max(end - time.monotonic(), 0.01)
        what = f"{method} {path}"
        raw = None if body is None else json.dumps(body).encode()
        if self._connections is not None:  # what the client reads itself: http.client
            return self._connections.call(
                what, url, raw, headers, connect_s=min(_CONNECT_S, left), end=end, on=_register
            )
        import urllib3

        response = self._manager.request(
            method,
            url,
            body=raw,
            headers=headers,
            timeout=urllib3.Timeout(connect=min(_CONNECT_S, left), read=left),
            retries=False,
            redirect=False,
            preload_content=False,
        )
        try:
            data = read_body(response, what, end)
        except BaseException:
            response.close()  # a half-read answer: the connection is never used again
            raise
        finally:
            response.release_conn()
        return json_answer(what, int(response.status), data)


def _unusable(status: int) -> bool:
    """Whether an answer of ``status`` says the API server cannot be used: not reached (0),
    the credentials refused (401, 403) or a server error (5xx)."""
    return status in (0, 401, 403) or status >= 500


def _what(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"

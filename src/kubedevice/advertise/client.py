"""Send the node-status patch: credentials from the official Kubernetes client, the request
itself over :mod:`http.client` under one deadline; every failure as one line.

The ``kubernetes`` package (an optional extra, ``pip install 'kubedevice[cluster]'``) is
imported only to load credentials (kubeconfig users of every kind, or the in-cluster service
account). The request is sent here, not by that client, for three things it cannot give:

* ``timeout`` is a deadline for the whole exchange (name lookup, connect, TLS, send, every
  byte of the answer): a watchdog shuts the socket down when it passes, so a server that
  drips its answer cannot hold the command, and the name is looked up in a thread of its own
  (``getaddrinfo`` cannot be interrupted), so a resolver that never answers cannot either.
* The answer is read up to :data:`MAX_BODY` bytes, never more.
* Each failure says whether the request had been sent: before it, the node is unchanged;
  after it, the patch may have been applied.
"""

from __future__ import annotations

import contextlib
import functools
import http.client
import ipaddress
import json
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from kubedevice.advertise.patch import PatchRequest
from kubedevice.advertise.target import kubeconfig_path
from kubedevice.errors import AdvertiseError, ConfigError
from kubedevice.kubeconfig_rules import load_kubeconfig

__all__ = ["MAX_BODY", "Connection", "load_connection", "send"]

#: The most of an answer read: a Node is tens of kilobytes, a Status less.
MAX_BODY = 4 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Connection:
    """Where to send and with what: the API server URL, TLS settings, Authorization."""

    server: str
    authorization: str
    ssl_context: ssl.SSLContext | None
    #: The TLS server name when it differs from the URL's host (kubeconfig tls-server-name).
    server_hostname: str | None = None


def _kubernetes() -> Any:
    try:
        import kubernetes
    except ImportError:
        raise ConfigError(
            "the Kubernetes client is not installed: pip install 'kubedevice[cluster]'"
        ) from None
    return kubernetes


def _ssl_context(cfg: Any) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=cfg.ssl_ca_cert or None)
    if not cfg.verify_ssl:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if cfg.cert_file:
        ctx.load_cert_chain(cfg.cert_file, cfg.key_file or None)
    return ctx


def load_connection(kubeconfig: str | None, context: str | None) -> Connection:
    """Credentials from a kubeconfig (``--kubeconfig``, ``$KUBECONFIG``, ``~/.kube/config``)
    or, when none exists and this runs in a pod, the in-cluster service account.

    This runs what the kubeconfig asks to get a token (an ``exec`` plugin, an OIDC refresh):
    only for a real request, never for a dry run.
    """
    path = kubeconfig_path(kubeconfig)
    if path is not None:  # kubectl's rules first: the official client reads "false" as true
        load_kubeconfig(Path(path), context)
    k8s = _kubernetes()
    cfg = k8s.client.Configuration()
    where = path or "in-cluster service account"
    try:
        if path is not None:
            k8s.config.load_kube_config(config_file=path, context=context, client_configuration=cfg)
        else:
            k8s.config.load_incluster_config(client_configuration=cfg)
        if cfg.proxy:
            raise ConfigError("proxy-url is not supported by advertise")
        context_ssl = _ssl_context(cfg) if cfg.host.startswith("https:") else None
        authorization = cfg.get_api_key_with_prefix("BearerToken") or ""
    except Exception as exc:  # the client's parser raises anything on a malformed file
        msg = str(exc).splitlines()[0].rstrip(".") if str(exc) else type(exc).__name__
        raise ConfigError(f"cannot load Kubernetes credentials ({where}): {msg}") from None
    name = getattr(cfg, "tls_server_name", None) or None
    return Connection(str(cfg.host), str(authorization), context_ssl, name)


def _status_message(body: bytes) -> str:
    try:
        doc = json.loads(body)
        return str(doc.get("message") or "").splitlines()[0]
    except (ValueError, TypeError, AttributeError, IndexError):
        return ""


def _missing(request: PatchRequest, capacity: dict[str, Any] | None) -> str | None:
    """Why a 422 happened, from the node's capacity read after it: a ``remove`` of a resource
    the node does not have, or no capacity at all (no kubelet ever reported one)."""
    node = request.node
    if capacity is None:
        return None
    if not capacity:
        return f"node {node} has no status.capacity (no kubelet has reported this node)"
    absent = [
        name
        for op, name in zip(request.operations, request.resources, strict=True)
        if op["op"] == "remove" and name not in capacity
    ]
    if not absent:
        return None
    return f"node {node} has no {', '.join(absent)} in its capacity: nothing to remove"


def _api_error(
    status: int,
    reason: str,
    body: bytes,
    request: PatchRequest,
    capacity: dict[str, Any] | None = None,
) -> AdvertiseError:
    detail = _status_message(body)
    node = request.node
    if status == 401:
        text = "unauthorized (401): the API server refused these credentials"
    elif status == 403:
        text = f"forbidden (403): not allowed to patch nodes/status of {node}"
    elif status == 404:
        text = f"no such node: {node} (404)"
    elif status == 409:
        text = f"conflict (409) patching node {node}: the node changed meanwhile, try again"
    elif status == 422 and (why := _missing(request, capacity)) is not None:
        return AdvertiseError(f"{why}; nothing was changed (the patch is all or nothing)")
    elif status == 422:
        text = f"the API server refused the patch for node {node} (422)"
    else:
        text = f"the API server answered {status} {reason}".rstrip()
    if detail and status not in (401, 404):
        text += f": {detail}"
    return AdvertiseError(text)


class _Exchange:
    """One HTTP exchange under a deadline; knows how far it got."""

    def __init__(self, conn: Connection, timeout: float) -> None:
        self.conn = conn
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout
        self.sent = False
        self.expired = threading.Event()
        self._http: http.client.HTTPConnection | None = None
        self._lock = threading.Lock()

    def _expire(self) -> None:
        with self._lock:
            self.expired.set()
            sock = self._http.sock if self._http is not None else None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # wakes a blocked connect, send or recv

    def remaining(self) -> float:
        return max(0.001, self.deadline - time.monotonic())

    def run(
        self, method: str, url: str, headers: list[tuple[str, str]], body: bytes | None
    ) -> tuple[int, str, bytes]:
        parts = urlsplit(self.conn.server)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"API server address {self.conn.server!r} is not an http(s) URL")
        watchdog = threading.Timer(self.timeout, self._expire)
        watchdog.daemon = True
        watchdog.start()
        try:
            return self._run(method, url, headers, body, parts.scheme, parts.hostname, parts.port)
        finally:
            watchdog.cancel()
            if self._http is not None:
                self._http.close()

    def _run(
        self,
        method: str,
        url: str,
        headers: list[tuple[str, str]],
        body: bytes | None,
        scheme: str,
        host: str,
        port: int | None,
    ) -> tuple[int, str, bytes]:
        http_conn: http.client.HTTPConnection
        if scheme == "https":
            http_conn = _TLSConnection(
                host,
                port,
                timeout=self.remaining(),
                context=self.conn.ssl_context,
                server_hostname=self.conn.server_hostname,
            )
        else:
            http_conn = http.client.HTTPConnection(host, port, timeout=self.remaining())
        with self._lock:
            self._http = http_conn
        if not _is_ip(host):
            addresses = _resolve(host, port or http_conn.port, self.remaining())
            # http.client makes its socket with the _create_connection attribute (typeshed
            # leaves it out): connect to the addresses looked up above instead
            hook = functools.partial(_connect_any, addresses)
            setattr(http_conn, "_create_connection", hook)  # noqa: B010
        http_conn.connect()
        if self.expired.is_set():
            raise TimeoutError("deadline passed")
        http_conn.putrequest(method, urlsplit(url).path, skip_host=True, skip_accept_encoding=True)
        for key, value in headers:
            http_conn.putheader(key, value)
        self.sent = True  # from here on the API server may act on the request
        http_conn.endheaders(body)
        response = http_conn.getresponse()
        body = response.read(MAX_BODY + 1)
        if len(body) > MAX_BODY:
            raise _TooLarge(response.status)
        if response.length:  # the connection ended before Content-Length was read
            raise http.client.IncompleteRead(body, response.length)
        if self.expired.is_set():
            raise TimeoutError("deadline passed")
        return response.status, response.reason, body


_AddrInfo = tuple[socket.AddressFamily, socket.SocketKind, int, str, Any]


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


def _resolve(host: str, port: int, timeout: float) -> list[_AddrInfo]:
    """``getaddrinfo`` in a daemon thread, waited for at most ``timeout`` seconds."""
    done = threading.Event()
    result: list[list[_AddrInfo] | OSError] = []

    def look_up() -> None:
        try:
            result.append(list(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)))
        except OSError as exc:
            result.append(exc)
        finally:
            done.set()

    threading.Thread(target=look_up, name="kubedevice-resolve", daemon=True).start()
    if not done.wait(timeout):
        raise TimeoutError(f"looking up {host} took longer than the deadline")
    [answer] = result
    if isinstance(answer, OSError):
        raise answer
    return answer


def _connect_any(
    addresses: list[_AddrInfo],
    _address: tuple[str, int],
    timeout: float | None = None,
    source_address: tuple[str, int] | None = None,
) -> socket.socket:
    """``socket.create_connection`` over addresses already looked up: the first that connects."""
    error: OSError | None = None
    for family, kind, proto, _, sockaddr in addresses:
        sock = socket.socket(family, kind, proto)
        try:
            sock.settimeout(timeout)
            if source_address is not None:
                sock.bind(source_address)
            sock.connect(sockaddr)
        except OSError as exc:
            sock.close()
            error = exc
            continue
        return sock
    raise error or OSError(f"no address to connect to for {_address[0]}")


class _TLSConnection(http.client.HTTPSConnection):
    """HTTPS with an optional TLS server name other than the URL's host."""

    def __init__(
        self,
        host: str,
        port: int | None,
        *,
        timeout: float,
        context: ssl.SSLContext | None,
        server_hostname: str | None,
    ) -> None:
        super().__init__(host, port, timeout=timeout, context=context)
        self._server_hostname = server_hostname or host
        self._tls = context or ssl.create_default_context()

    def connect(self) -> None:
        http.client.HTTPConnection.connect(self)
        self.sock = self._tls.wrap_socket(self.sock, server_hostname=self._server_hostname)


class _TooLarge(Exception):
    def __init__(self, status: int) -> None:
        self.status = status


def _reason(exc: BaseException) -> str:
    text = str(getattr(exc, "reason", "") or exc or type(exc).__name__)
    return text.splitlines()[0] if text else type(exc).__name__


def send(conn: Connection, request: PatchRequest, timeout: float = 30.0) -> dict[str, str]:
    """PATCH the node status; the node's resulting capacity. AdvertiseError on failure.

    ``timeout`` (seconds) bounds the whole exchange.
    """
    server = conn.server
    ex = _Exchange(conn, timeout)
    check = f"check with: kubectl get node {request.node} -o jsonpath='{{.status.capacity}}'"
    headers = request.headers(server, conn.authorization)
    try:
        status, reason, body = ex.run(
            "PATCH", request.url(server), headers, request.body().encode()
        )
    except ConfigError:
        raise
    except _TooLarge as exc:
        raise AdvertiseError(
            f"the API server at {server} answered {exc.status} with a body over "
            f"{MAX_BODY // (1024 * 1024)} MiB; stopped reading: the patch may have been "
            f"applied; {check}"
        ) from None
    except (OSError, http.client.HTTPException) as exc:
        timed_out = ex.expired.is_set() or isinstance(exc, TimeoutError)
        if not ex.sent:
            if timed_out:
                raise AdvertiseError(
                    f"cannot reach the API server at {server}: no connection within "
                    f"{timeout:g} s; nothing was sent"
                ) from None
            if isinstance(exc, ssl.SSLError):
                raise AdvertiseError(
                    f"TLS with the API server at {server} failed: {_reason(exc)}; nothing was sent"
                ) from None
            raise AdvertiseError(
                f"cannot reach the API server at {server}: {_reason(exc)}"
            ) from None
        what = (
            f"no complete answer within {timeout:g} s"
            if timed_out
            else f"the connection failed after the request was sent ({_reason(exc)})"
        )
        raise AdvertiseError(
            f"the API server at {server}: {what}: the patch may have been applied; {check}"
        ) from None
    if status == 422:
        raise _api_error(status, reason, body, request, _capacity(conn, request, ex))
    if not 200 <= status < 300:
        raise _api_error(status, reason, body, request)
    try:
        doc = json.loads(body)
        capacity = doc["status"]["capacity"]
        if doc.get("kind") != "Node" or not isinstance(capacity, dict):
            raise ValueError("not a Node")
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        raise AdvertiseError(
            f"the API server at {server} answered {status}, but not with a Node: the patch "
            f"was probably applied; {check}"
        ) from None
    return {str(k): str(v) for k, v in capacity.items()}


def _capacity(conn: Connection, request: PatchRequest, ex: _Exchange) -> dict[str, Any] | None:
    """The node's capacity now (a GET in what is left of the deadline), to say why a patch
    was refused; None when it cannot be read."""
    url = conn.server.rstrip("/") + f"/api/v1/nodes/{request.node}"
    headers = [
        (k, v)
        for k, v in request.headers(conn.server, conn.authorization)
        if k not in ("Content-Type", "Content-Length")
    ]
    try:
        status, _, body = _Exchange(conn, ex.remaining()).run("GET", url, headers, None)
        if status != 200:
            return None
        capacity = (json.loads(body).get("status") or {}).get("capacity") or {}
    except (OSError, http.client.HTTPException, ValueError, AttributeError, _TooLarge):
        return None
    return capacity if isinstance(capacity, dict) else None

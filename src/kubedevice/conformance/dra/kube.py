"""The kit's own small API server client: a kubeconfig, JSON over HTTPS, and a watch.

Independent of the drivers' client (and of the ``kubernetes`` package): the kit judges what
a driver wrote, so it reads the API server its own way. Supports what kind, kubeadm and the
kit's own API server write into a kubeconfig: a bearer token (or token file), a client
certificate and key (files or ``-data``), a CA (file or ``-data``) or
``insecure-skip-tls-verify``. Calls block; the runner calls them in a thread.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import socket
import ssl
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

import yaml

from kubedevice.errors import ConfigError, KubeApiError

__all__ = ["RESOURCE", "ApiError", "KubeClient", "Watch"]

#: The resource.k8s.io version the kit writes and reads.
RESOURCE = "/apis/resource.k8s.io/v1"


class ApiError(KubeApiError):
    """The API server answered the kit an error status (0: it could not be reached)."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(f"API server: {status}: {text[:300]}", status)


def _section(config: dict[str, Any], kind: str, name: str) -> dict[str, Any]:
    for entry in config.get(kind + "s") or []:
        if entry.get("name") == name:
            return dict(entry.get(kind) or {})
    raise ConfigError(f"kubeconfig: no {kind} named {name!r}")


class KubeClient:
    """JSON calls to the API server a kubeconfig names (its current context)."""

    def __init__(self, kubeconfig: Path, *, timeout: float = 30.0) -> None:
        try:
            config = yaml.safe_load(kubeconfig.read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"kubeconfig {kubeconfig}: {exc}") from exc
        context = _section(config, "context", str(config.get("current-context", "")))
        cluster = _section(config, "cluster", str(context.get("cluster", "")))
        user = _section(config, "user", str(context.get("user", "")))
        url = urlsplit(str(cluster.get("server", "")))
        if url.scheme != "https" or not url.hostname:
            raise ConfigError(f"kubeconfig {kubeconfig}: server {url.geturl()!r} is not https")
        self.host, self.port = url.hostname, url.port or 443
        self.prefix = url.path.rstrip("/")
        self.timeout = timeout
        if user.get("exec") or user.get("auth-provider"):
            raise ConfigError(
                f"kubeconfig {kubeconfig}: exec and auth-provider users are not "
                "supported by the conformance kit (use a token or a certificate)"
            )
        token = user.get("token")
        try:
            if not token and user.get("tokenFile"):
                token = Path(user["tokenFile"]).read_text().strip()
            # inline certificates and keys go through files only while the context loads them
            with tempfile.TemporaryDirectory(prefix="kd-conf-kube-") as files:
                self._files = Path(files)
                self.ssl = self._context(cluster, user, kubeconfig.parent)
        except (OSError, ValueError, ssl.SSLError) as exc:
            raise ConfigError(f"kubeconfig {kubeconfig}: {exc}") from exc
        self.headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if token:
            self.headers["Authorization"] = f"Bearer {token}"
        self._local = threading.local()
        #: Every thread's kept-alive connection, so that :meth:`close` closes them all.
        self._kept: list[http.client.HTTPSConnection] = []
        self._lock = threading.Lock()

    def _file(self, data: str, name: str) -> str:
        path = self._files / name
        path.write_bytes(base64.b64decode(data))
        return str(path)

    def _context(self, cluster: dict[str, Any], user: dict[str, Any], base: Path) -> ssl.SSLContext:
        def where(key: str) -> str | None:
            if user.get(f"{key}-data") or cluster.get(f"{key}-data"):
                return self._file(user.get(f"{key}-data") or cluster[f"{key}-data"], key)
            value = user.get(key) or cluster.get(key)
            return None if not value else str(base / value)

        ctx = ssl.create_default_context(cafile=where("certificate-authority"))
        if cluster.get("insecure-skip-tls-verify"):
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        cert, key = where("client-certificate"), where("client-key")
        if cert and key:
            ctx.load_cert_chain(cert, key)
        return ctx

    def close(self) -> None:
        """Close the kept-alive connections (every thread's: the cases call from worker
        threads too, which outlive nothing of the run)."""
        with self._lock:
            kept, self._kept = self._kept, []
        for conn in kept:
            conn.close()
        self._local.conn = None

    def _conn(self, timeout: float | None = None) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection(
            self.host, self.port, context=self.ssl, timeout=timeout or self.timeout
        )

    def call(self, method: str, path: str, body: Any = None, **query: str) -> Any:
        """One request; the decoded JSON answer. :class:`ApiError` on an error status."""
        url = self.prefix + path + ("?" + urlencode(query) if query else "")
        conn: http.client.HTTPSConnection | None = getattr(self._local, "conn", None)
        for attempt in (0, 1):  # a kept-alive connection the server closed: once more
            if conn is None:
                conn = self._local.conn = self._conn()
                with self._lock:
                    self._kept.append(conn)
            try:
                conn.request(method, url, None if body is None else json.dumps(body),
                             self.headers)  # fmt: skip
                response = conn.getresponse()
                text = response.read().decode("utf-8", "replace")
                break
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                with self._lock, contextlib.suppress(ValueError):
                    self._kept.remove(conn)
                conn = self._local.conn = None
                if attempt:
                    raise ApiError(0, f"{method} {path}: {exc}") from exc
        if response.status >= 300:
            raise ApiError(response.status, text)
        return json.loads(text) if text else None

    def get_or_none(self, path: str) -> Any:
        """GET; None when the object does not exist."""
        try:
            return self.call("GET", path)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def delete(self, path: str) -> None:
        """DELETE; an object already gone is fine."""
        with contextlib.suppress(ApiError):
            self.call("DELETE", path)

    def watch(self, path: str, resource_version: str, **query: str) -> Watch:
        """A watch of ``path`` from ``resource_version`` (iterate it; close it to stop)."""
        query = {**query, "watch": "1", "resourceVersion": resource_version,
                 "allowWatchBookmarks": "true", "timeoutSeconds": "3600"}  # fmt: skip
        return Watch(self._conn(timeout=None), f"{self.prefix}{path}?{urlencode(query)}",
                     self.headers)  # fmt: skip


class Watch:
    """One watch request: iterate the events; :meth:`close` from any thread ends it."""

    def __init__(self, conn: http.client.HTTPSConnection, url: str, headers: dict[str, str]):
        self._conn = conn
        self._url = url
        self._headers = headers
        self._closed = False

    def __iter__(self) -> Iterator[dict[str, Any]]:
        try:
            self._conn.request("GET", self._url, None, self._headers)
            response = self._conn.getresponse()
            if response.status >= 300:
                raise ApiError(response.status, response.read().decode("utf-8", "replace"))
            # the stream may be silent for as long as nothing changes (a bookmark comes about
            # once a minute): the connection's timeout bounds the request, not the waiting
            if self._conn.sock is not None:
                self._conn.sock.settimeout(None)
            while not self._closed:
                line = response.readline()
                if not line:
                    return
                yield json.loads(line)
        except (OSError, http.client.HTTPException, ValueError):
            if not self._closed:
                raise
        finally:
            self._conn.close()

    def close(self) -> None:
        """End the watch (its reader sees the end of the stream)."""
        self._closed = True
        sock = self._conn.sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

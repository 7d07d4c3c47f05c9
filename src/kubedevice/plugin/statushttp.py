"""A small HTTP server for ``/metrics`` and probes, on the event loop, with bounded connections.

Used by the device plugins' metrics port and by a DRA driver's ``/metrics``, ``/healthz`` and
``/readyz`` port. Any pod that reaches the port may connect, so what one client can hold is
bounded:

- at most :data:`MAX_CONNECTIONS` connections are open at once; one more closes the oldest
  that has sent nothing yet (a probe or a scrape, which sends its request at once, is
  answered even while idle connections keep coming);
- a connection has :data:`REQUEST_TIMEOUT_S` to send its request line and headers (at most
  :data:`MAX_REQUEST` bytes), and :data:`WRITE_TIMEOUT_S` to take the answer; then it is
  closed;
- one request per connection (``Connection: close``); ``GET`` and ``HEAD`` only.

Nothing is logged per connection: connections closed over the limit are counted and logged at
most once a minute.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import socket
import sys
import termios
import time
from collections.abc import Awaitable, Callable
from typing import Final

__all__ = [
    "LISTEN_BACKLOG",
    "MAX_CONNECTIONS",
    "MAX_REQUEST",
    "REQUEST_TIMEOUT_S",
    "WRITE_TIMEOUT_S",
    "Answer",
    "StatusHttp",
]

log = logging.getLogger(__name__)

#: Connections open at once; one more closes the oldest.
MAX_CONNECTIONS: Final = 64
#: Seconds a connection has to send its request line and headers.
REQUEST_TIMEOUT_S: Final = 5.0
#: Seconds a connection has to take the answer.
WRITE_TIMEOUT_S: Final = 10.0
#: Bytes of request line and headers read.
MAX_REQUEST: Final = 8192
#: Connections the kernel holds until they are accepted (capped by ``net.core.somaxconn``).
LISTEN_BACKLOG: Final = 4096
_ACCEPT_BATCH: Final = 16
_LOG_EVERY_S: Final = 60.0

#: ``(path)`` to ``(status, content type, body)``; ``path`` is without its query.
Answer = Callable[[str], Awaitable[tuple[int, str, bytes]]]

_REASONS: Final = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


class StatusHttp:
    """Serves ``answer`` over HTTP/1.1 on ``host:port`` (port 0 picks a free one).

    Args:
        host: The address to listen on (``0.0.0.0``: every IPv4 address).
        port: The port.
        answer: What to answer to a ``GET`` of a path.
        max_connections: Connections open at once.
        request_timeout_s: Seconds to send the request.
        write_timeout_s: Seconds to take the answer.
    """

    def __init__(
        self,
        host: str,
        port: int,
        answer: Answer,
        *,
        max_connections: int = MAX_CONNECTIONS,
        request_timeout_s: float = REQUEST_TIMEOUT_S,
        write_timeout_s: float = WRITE_TIMEOUT_S,
    ) -> None:
        self.host = host
        self.port = port
        self.answer = answer
        self.max_connections = max_connections
        self.request_timeout_s = request_timeout_s
        self.write_timeout_s = write_timeout_s
        #: Connections closed because more than ``max_connections`` were open.
        self.evicted = 0
        self._open: dict[_Connection, None] = {}  # in the order they came
        self._server: asyncio.Server | None = None
        self._logged_at = -_LOG_EVERY_S
        self._logged = 0
        self._failed_at = -_LOG_EVERY_S

    @property
    def connections(self) -> int:
        """Connections open now."""
        return len(self._open)

    @property
    def server_address(self) -> tuple[str, int]:
        """The address listened on and the bound port."""
        return self.host, self.port

    async def start(self) -> None:
        """Listen (:attr:`port` is then the bound port).

        Raises:
            OSError: The address cannot be listened on.
        """
        loop = asyncio.get_running_loop()
        family, kind, proto, _, address = (
            await loop.getaddrinfo(
                self.host, self.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
            )
        )[0]
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            sock.setblocking(False)
            # accepted a few at a time (each may close an older one) ...
            self._server = await loop.create_server(
                lambda: _Connection(self), sock=sock, backlog=_ACCEPT_BATCH
            )
            # ... from a long queue in the kernel (no descriptor of ours): a probe's
            # connection waits its turn behind a burst, never dropped and sent again 1 s later
            sock.listen(LISTEN_BACKLOG)
        except BaseException:
            sock.close()
            raise
        self.port = int(sock.getsockname()[1])

    async def stop(self) -> None:
        """Stop listening and close the connections."""
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        for connection in list(self._open):
            connection.abort()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(server.wait_closed(), 2.0)

    def _opened(self, connection: _Connection) -> None:
        while len(self._open) >= self.max_connections:
            # the oldest that sent nothing yet: a request that came but is not read yet
            # (a probe accepted in the same burst) is answered first
            idle = (c for c in self._open if not c.answered and not c.pending())
            victim = next(idle, None) or next(iter(self._open))
            del self._open[victim]
            victim.abort()
            self.evicted += 1
        self._open[connection] = None
        if self.evicted > self._logged and time.monotonic() - self._logged_at >= _LOG_EVERY_S:
            log.warning(
                "%d connections to %s:%d closed unanswered: over the limit of %d open at once",
                self.evicted - self._logged,
                self.host,
                self.port,
                self.max_connections,
            )
            self._logged, self._logged_at = self.evicted, time.monotonic()

    def _closed(self, connection: _Connection) -> None:
        self._open.pop(connection, None)

    async def _respond(self, path: str) -> tuple[int, str, bytes]:
        try:
            return await self.answer(path)
        except Exception as exc:  # a bug in the answer: logged at most once a minute
            if time.monotonic() - self._failed_at >= _LOG_EVERY_S:
                self._failed_at = time.monotonic()
                log.error("answering GET %s failed: %s", path, exc, exc_info=exc)
            return 500, "text/plain", b"internal error\n"


class _Connection(asyncio.Protocol):
    """One connection: its request, its answer, its deadlines."""

    def __init__(self, endpoint: StatusHttp) -> None:
        self.endpoint = endpoint
        self.transport: asyncio.Transport | None = None
        self.buffer = b""
        self.answered = False
        self.timer: asyncio.TimerHandle | None = None
        self.task: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        loop = asyncio.get_running_loop()
        self.timer = loop.call_later(self.endpoint.request_timeout_s, self.abort)
        self.endpoint._opened(self)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
        if self.task is not None:
            self.task.cancel()
        self.endpoint._closed(self)

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def pending(self) -> bool:
        """Whether the client sent something (read or still in the socket)."""
        if self.buffer:
            return True
        sock = self.transport.get_extra_info("socket") if self.transport is not None else None
        if sock is None:
            return False
        try:
            waiting = fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0")
        except OSError:
            return False
        return int.from_bytes(waiting, sys.byteorder) > 0

    def data_received(self, data: bytes) -> None:
        if self.answered:
            return
        self.buffer += data
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(self.buffer) > MAX_REQUEST:
                self._reply("GET", 400, "text/plain", b"request too long\n")
            return
        if end > MAX_REQUEST:
            self._reply("GET", 400, "text/plain", b"request too long\n")
            return
        line = self.buffer.split(b"\r\n", 1)[0].decode("latin-1")
        parts = line.split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            self._reply("GET", 400, "text/plain", b"not an HTTP request line\n")
            return
        method, path = parts[0], parts[1].split("?", 1)[0]
        if method not in ("GET", "HEAD"):
            self._reply(method, 405, "text/plain", b"only GET\n")
            return
        self.answered = True
        self.task = asyncio.get_running_loop().create_task(self._answer(method, path))

    async def _answer(self, method: str, path: str) -> None:
        status, ctype, body = await self.endpoint._respond(path)
        self._reply(method, status, ctype, body)

    def eof_received(self) -> bool:
        return self.answered  # the answer is still written; else closed (no whole request)

    def _reply(self, method: str, status: int, ctype: str, body: bytes) -> None:
        self.answered = True
        transport = self.transport
        assert transport is not None
        if transport.is_closing():
            return
        transport.pause_reading()
        header = (
            f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\n"
            f"Content-Type: {ctype}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        )
        transport.write(header.encode() + (body if method != "HEAD" else b""))
        if self.timer is not None:
            self.timer.cancel()
        self.timer = asyncio.get_running_loop().call_later(
            self.endpoint.write_timeout_s, self.abort
        )
        transport.close()  # once the answer is written

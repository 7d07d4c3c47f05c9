"""The control socket: newline-delimited JSON over a Unix socket, for the CLI and scripts.

It lives OUTSIDE the device-plugin directory so neither a plugin nor a real kubelet can
mistake it for a plugin socket: ``<DIR>/../kubedevice-emulator/<basename of DIR>.sock``
(``control_socket_path``). One request per line, ``{"op": ..., ...}``; one reply per line,
``{"ok": true, "result": ...}`` or ``{"ok": false, "error": {"type", "message", ...}}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import logging
import socket
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from kubedevice.kubelet.sockets import private_umask, remove_socket

__all__ = [
    "CLIENT_GONE",
    "MAX_REQUEST_BYTES",
    "ControlServer",
    "call",
    "control_socket_path",
    "state_dir",
]

log = logging.getLogger(__name__)

Handler = Callable[[dict[str, Any]], Awaitable[Any]]
Progress = Callable[[], str | None]

#: For the request being handled: True once its client has hung up (read by the emulator
#: when a queued request's turn comes, so that nobody's abandoned request runs later).
CLIENT_GONE: contextvars.ContextVar[Callable[[], bool]] = contextvars.ContextVar(
    "CLIENT_GONE", default=lambda: False
)

#: Seconds before the first "still waiting" line, and the most between two of them (the
#: CLI's socket timeout is longer, so a request that waits on a plugin never times out).
PROGRESS_FIRST_S = 1.0
PROGRESS_MAX_S = 20.0

#: Longest request line accepted (a pod manifest easily exceeds asyncio's 64 KiB default).
MAX_REQUEST_BYTES = 16 * 1024 * 1024


def state_dir(device_plugin_dir: Path) -> Path:
    """The emulator's own directory next to the device-plugin dir."""
    return device_plugin_dir.resolve().parent / "kubedevice-emulator"


def control_socket_path(device_plugin_dir: str | Path) -> Path:
    """Where the emulator for ``device_plugin_dir`` serves its control socket."""
    d = Path(device_plugin_dir)
    return state_dir(d) / f"{d.resolve().name}.sock"


class ControlServer:
    """Serves the control protocol; ``handler`` gets each request and returns the result."""

    def __init__(self, path: Path, handler: Handler, progress: Progress | None = None) -> None:
        self.path = path
        self._handler = handler
        self._progress = progress
        self._server: asyncio.AbstractServer | None = None
        self._conns: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        """Bind (mode 0600). A live socket at the path means another emulator is running."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.is_socket():
            if _alive(self.path):
                raise OSError(f"another emulator is serving {self.path}")
            self.path.unlink()
        with private_umask():
            self._server = await asyncio.start_unix_server(
                self._serve, path=str(self.path), limit=MAX_REQUEST_BYTES
            )

    async def stop(self) -> None:
        """Stop serving, end every open connection (awaited) and remove the socket."""
        if self._server is not None:
            self._server.close()
            conns = list(self._conns)
            for t in conns:
                t.cancel()
            await asyncio.gather(*conns, return_exceptions=True)
            await self._server.wait_closed()
            self._server = None
        remove_socket(self.path)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        try:
            while True:
                try:
                    line = await reader.readline()
                except ValueError:  # longer than MAX_REQUEST_BYTES: answer, then hang up
                    too_long = {
                        "type": "ValueError",
                        "message": f"request too large (limit {MAX_REQUEST_BYTES >> 20} MiB)",
                    }
                    writer.write(json.dumps({"ok": False, "error": too_long}).encode() + b"\n")
                    await writer.drain()
                    break
                if not line:
                    break
                try:
                    req = json.loads(line)
                    if not isinstance(req, dict):
                        raise ValueError("request must be a JSON object")
                    result = await self._run(req, reader, writer)
                    reply: dict[str, Any] = {"ok": True, "result": result}
                except Exception as exc:
                    err: dict[str, Any] = {"type": type(exc).__name__, "message": str(exc)}
                    for attr in ("reason", "message"):
                        if hasattr(exc, attr):
                            err[attr] = getattr(exc, attr)
                    reply = {"ok": False, "error": err}
                writer.write(json.dumps(reply).encode() + b"\n")
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self._conns.discard(task)
            writer.close()

    async def _run(
        self, req: dict[str, Any], reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> Any:
        """Run one request; while it waits, tell the client what on, now and then."""
        token = CLIENT_GONE.set(lambda: reader.at_eof() or writer.is_closing())
        try:
            task = asyncio.ensure_future(self._handler(req))  # copies the context
        finally:
            CLIENT_GONE.reset(token)
        delay = PROGRESS_FIRST_S
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=delay)
                if done:
                    break
                delay = min(delay * 2, PROGRESS_MAX_S)
                note = self._progress() if self._progress is not None else None
                if note and not writer.is_closing():
                    writer.write(json.dumps({"progress": note}).encode() + b"\n")
                    await writer.drain()
        except BaseException:
            if not task.done():  # our connection is going away: the request still runs
                task.add_done_callback(_consume)
            raise
        try:
            return task.result()
        except asyncio.CancelledError:
            # the handler was cancelled from inside (not this connection): an answer, not
            # a silently dropped connection
            raise RuntimeError("the request was cancelled inside the emulator") from None


def _consume(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


def _alive(path: Path) -> bool:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(str(path))
    except OSError:
        return False
    finally:
        s.close()
    return True


def _connect(
    path: Path, timeout: float, wait_for_server: float, on_wait: Callable[[], None] | None
) -> socket.socket:
    """Connect to ``path``; for ``wait_for_server`` seconds, an emulator still starting up
    (no socket yet, or not listening yet) is retried with a short, growing backoff, and
    ``on_wait`` is called once when the first attempt fails."""
    deadline = time.monotonic() + wait_for_server
    delay = 0.01
    waiting = False
    while True:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(timeout)
        try:
            s.connect(str(path))
        except (FileNotFoundError, ConnectionRefusedError):
            s.close()
            if time.monotonic() + delay > deadline:
                raise
            if not waiting and on_wait is not None:
                on_wait()
            waiting = True
            time.sleep(delay)
            delay = min(delay * 2, 0.2)
            continue
        except BaseException:
            s.close()
            raise
        return s


def call(
    path: Path,
    request: dict[str, Any],
    timeout: float = 60.0,
    *,
    wait_for_server: float = 0.0,
    on_wait: Callable[[], None] | None = None,
    on_progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Send one request and return the reply object (blocking; for the CLI).

    Args:
        path: The control socket.
        request: The request object.
        timeout: Socket timeout for the exchange.
        wait_for_server: How long to wait for an emulator that is still starting.
        on_wait: Called once if the emulator is not there yet and we start waiting.
        on_progress: Called with each "still waiting" note the emulator sends.
    """
    s = _connect(path, timeout, wait_for_server, on_wait)
    try:
        # the emulator may hang up early (e.g. a request too long): read why below
        with contextlib.suppress(BrokenPipeError):
            s.sendall(json.dumps(request).encode() + b"\n")
        buf = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                reply = json.loads(line)
                if not isinstance(reply, dict):
                    raise ValueError("bad reply from emulator")
                if "progress" in reply and "ok" not in reply:
                    if on_progress is not None:
                        on_progress(str(reply["progress"]))
                    continue
                return reply
    finally:
        s.close()
    if not buf:
        raise ValueError("the emulator closed the connection without an answer")
    raise ValueError("bad reply from emulator")

"""A real HTTP server standing in for a slow or broken API server (tests of deadlines).

Each request path is answered by the first rule whose prefix matches: ``stall`` (send
nothing until :meth:`SlowApi.release`, or the client gives up), ``trickle`` (the status
line and headers at once, then one body byte every ``every`` seconds), ``trickle-head``
(the status line itself byte by byte), or a JSON answer. Unmatched paths get 404.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

Rule = tuple[str, str, Any]  # path prefix, behaviour, answer or period


class SlowApi:
    def __init__(self) -> None:
        self.rules: list[Rule] = []
        self.released = threading.Event()
        self.requests: list[tuple[str, str]] = []
        self.arrived = threading.Condition()
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                with api.arrived:
                    api.requests.append((self.command, self.path))
                    api.arrived.notify_all()
                for prefix, how, what in api.rules:
                    if self.path.startswith(prefix) and (
                        how != "method" or what[0] == self.command
                    ):
                        break
                else:
                    self._json(404, {"kind": "Status", "message": "not found"})
                    return
                try:
                    if how == "stall":
                        api.released.wait(what)
                        self._json(503, {"kind": "Status", "message": "released"})
                    elif how == "trickle":
                        self.send_response(200)
                        self.send_header("Content-Type", "application/json")
                        self.send_header("Content-Length", "100000")
                        self.end_headers()
                        while not api.released.is_set():
                            self.wfile.write(b" ")
                            self.wfile.flush()
                            api.released.wait(what)
                    elif how == "trickle-head":
                        for byte in b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" * 1000:
                            if api.released.is_set():
                                return
                            self.wfile.write(bytes([byte]))
                            self.wfile.flush()
                            api.released.wait(what)
                    else:
                        self._json(200, what() if callable(what) else what)
                except OSError:
                    pass  # the client hung up: what a deadline does

            def _json(self, status: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = _serve

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.http.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"

    def on(self, prefix: str, how: str, what: Any = None) -> None:
        self.rules.append((prefix, how, what))

    def wait_requests(
        self, predicate: Callable[[list[tuple[str, str]]], bool], timeout: float = 10
    ) -> None:
        with self.arrived:
            if not self.arrived.wait_for(lambda: predicate(self.requests), timeout):
                raise AssertionError(f"requests seen: {self.requests}")

    def release(self) -> None:
        self.released.set()

    def kubeconfig(self, path: Path) -> Path:
        path.write_text(
            "apiVersion: v1\nkind: Config\n"
            f"clusters: [{{name: slow, cluster: {{server: '{self.url}'}}}}]\n"
            "users: [{name: u, user: {token: t}}]\n"
            "contexts: [{name: slow, context: {cluster: slow, user: u}}]\n"
            "current-context: slow\n"
        )
        return path


@contextmanager
def slow_api() -> Iterator[SlowApi]:
    api = SlowApi()
    thread = threading.Thread(target=api.http.serve_forever, daemon=True)
    thread.start()
    try:
        yield api
    finally:
        api.release()
        api.http.shutdown()
        api.http.server_close()


def free_local_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def elapsed(since: float) -> float:
    return time.monotonic() - since

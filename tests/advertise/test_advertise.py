"""``kubedevice advertise`` against a local HTTP endpoint standing in for the API server.

No API server runs here: a ``http.server`` in a thread records exactly what the official
Kubernetes client sends (method, path, headers, body) and answers like the API server would
(a Node, or a ``Status`` with 401/403/404/409/422).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from kubedevice.advertise import build_patch, escape_pointer
from kubedevice.errors import ConfigError

TOKEN = "t0ken-for-tests"


@dataclass
class FakeApi:
    """What the endpoint received, and what it answers next."""

    url: str
    received: list[dict[str, Any]] = field(default_factory=list)
    status: int = 200
    capacity: dict[str, str] = field(default_factory=lambda: {"cpu": "2"})


def _handler(api: FakeApi) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_PATCH(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            api.received.append(
                {
                    "method": self.command,
                    "path": self.path,
                    "headers": {k.lower(): v for k, v in self.headers.items()},
                    "body": body.decode(),
                }
            )
            if api.status == 200:
                node = self.path.split("/")[4]
                for op in json.loads(body):
                    name = op["path"].split("/")[-1].replace("~1", "/").replace("~0", "~")
                    if op["op"] == "add":
                        api.capacity[name] = op["value"]
                    else:
                        api.capacity.pop(name, None)
                doc: dict[str, Any] = {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {"name": node},
                    "status": {"capacity": dict(api.capacity)},
                }
            else:
                doc = {
                    "apiVersion": "v1",
                    "kind": "Status",
                    "status": "Failure",
                    "message": f"server says {api.status}",
                    "code": api.status,
                }
            out = json.dumps(doc).encode()
            self.send_response(api.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


@pytest.fixture
def api() -> Iterator[FakeApi]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(FakeApi("")))
    fake = FakeApi(f"http://127.0.0.1:{server.server_address[1]}")
    server.RequestHandlerClass = _handler(fake)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def _kubeconfig(path: Path, server: str) -> Path:
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "local", "cluster": {"server": server}}],
                "users": [{"name": "me", "user": {"token": TOKEN}}],
                "contexts": [{"name": "local", "context": {"cluster": "local", "user": "me"}}],
                "current-context": "local",
            }
        )
    )
    return path


def _advertise(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``kubedevice advertise ARGS`` as a process, with HOME in ``tmp_path`` (no user config)."""
    return subprocess.run(
        [sys.executable, "-m", "kubedevice", "advertise", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )


def _run(tmp_path: Path, server: str, *args: str) -> subprocess.CompletedProcess[str]:
    kubeconfig = _kubeconfig(tmp_path / "kubeconfig", server)
    return _advertise(tmp_path, "--kubeconfig", str(kubeconfig), *args)


def test_add_and_remove(api: FakeApi, tmp_path: Path) -> None:
    api.capacity["example.com/bar"] = "1"
    proc = _run(tmp_path, api.url, "node-1", "example.com/foo=4", "--remove", "example.com/bar")
    assert proc.returncode == 0, proc.stderr
    [req] = api.received
    assert req["method"] == "PATCH"
    assert req["path"] == "/api/v1/nodes/node-1/status"
    assert req["headers"]["content-type"] == "application/json-patch+json"
    assert req["headers"]["authorization"] == f"Bearer {TOKEN}"
    assert json.loads(req["body"]) == [
        {"op": "add", "path": "/status/capacity/example.com~1foo", "value": "4"},
        {"op": "remove", "path": "/status/capacity/example.com~1bar"},
    ]
    assert proc.stdout.splitlines() == [
        "node-1: add example.com/foo: capacity 4",
        "node-1: remove example.com/bar: not in capacity",
    ]


def test_dry_run_prints_exactly_what_is_sent(api: FakeApi, tmp_path: Path) -> None:
    args = ("gpu-node.zone-a", "example.com/foo=0004", "vendor.io/fpga=2", "--remove", "a.b/c")
    dry = _run(tmp_path, api.url, *args, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert api.received == []  # nothing sent
    request_line, content_type, blank, body = dry.stdout.rstrip("\n").split("\n")
    sent = _run(tmp_path, api.url, *args)
    assert sent.returncode == 0, sent.stderr
    [req] = api.received
    assert request_line == f"PATCH {api.url}{req['path']}"
    assert content_type == f"Content-Type: {req['headers']['content-type']}"
    assert blank == ""
    assert body == req["body"]  # byte for byte
    assert json.loads(body)[0] == {
        "op": "add",
        "path": "/status/capacity/example.com~1foo",
        "value": "4",
    }


@pytest.mark.parametrize(
    ("status", "line"),
    [
        (401, "error: unauthorized (401): the API server refused these credentials"),
        (403, "error: forbidden (403): not allowed to patch nodes/status of n1: server says 403"),
        (404, "error: no such node: n1 (404)"),
        (409, "error: conflict (409) patching node n1: the node changed meanwhile, try again: "
              "server says 409"),
        (422, "error: the API server refused the patch for node n1 (422): server says 422"),
    ],
)  # fmt: skip
def test_api_errors_are_one_line_exit_2(
    api: FakeApi, tmp_path: Path, status: int, line: str
) -> None:
    api.status = status
    proc = _run(tmp_path, api.url, "n1", "example.com/foo=1")
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [line]
    assert len(api.received) == 1  # sent once, not retried


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["n1", "Example.com/foo=1"], "invalid resource name 'Example.com/foo'"),
        (["n1", "kubernetes.io/foo=1"], "reserved"),
        (["n1", "example.com/foo=1.5"], "count '1.5' must be a whole number"),
        (["n1", "example.com/foo=-1"], "count '-1' must be a whole number"),
        (["n1", "example.com/foo=٣"], "count '٣' must be a whole number"),
        (["n1", "example.com/foo=" + "9" * 5000], "is larger than 9223372036854775807"),
        (["n1", "example.com/foo"], "expected RESOURCE=COUNT"),
        (["n1", "example.com/foo=1", "example.com/foo=2"], "given twice"),
        (["n1"], "nothing to do"),
        (["Node_1", "example.com/foo=1"], "invalid node name 'Node_1'"),
        (["n1", "--remove", "bad"], "invalid resource name 'bad'"),
    ],
)
def test_bad_arguments_exit_2_before_any_request(
    api: FakeApi, tmp_path: Path, args: list[str], needle: str
) -> None:
    proc = _run(tmp_path, api.url, *args)
    assert proc.returncode == 2
    [line] = proc.stderr.splitlines()
    assert line.startswith("error: ")
    assert needle in line
    assert api.received == []


def test_unreachable_api_server(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    proc = _run(tmp_path, f"http://127.0.0.1:{port}", "n1", "example.com/foo=1")
    assert proc.returncode == 2
    [line] = proc.stderr.splitlines()
    assert line.startswith(f"error: cannot reach the API server at http://127.0.0.1:{port}")


def test_missing_kubeconfig(tmp_path: Path) -> None:
    proc = _advertise(tmp_path, "--kubeconfig", str(tmp_path / "no"), "n1", "example.com/foo=1")
    assert proc.returncode == 2
    [line] = proc.stderr.splitlines()
    assert line == f"error: kubeconfig {tmp_path / 'no'} does not exist"
    (tmp_path / "bad").write_text("clusters: 7\n")
    proc = _advertise(tmp_path, "--kubeconfig", str(tmp_path / "bad"), "n1", "example.com/foo=1")
    assert proc.returncode == 2
    [line] = proc.stderr.splitlines()
    assert line.startswith(f"error: cannot load Kubernetes credentials ({tmp_path / 'bad'}): ")


def test_pointer_escaping() -> None:
    assert escape_pointer("a~b/c") == "a~0b~1c"
    assert escape_pointer("~1") == "~01"
    req = build_patch("n", ["x.io/a-b_c.d=3"], [])
    assert req.operations == (
        {"op": "add", "path": "/status/capacity/x.io~1a-b_c.d", "value": "3"},
    )
    with pytest.raises(ConfigError, match="nothing to do"):
        build_patch("n", [], [])

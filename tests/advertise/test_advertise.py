"""``kubedevice advertise`` against local HTTP endpoints standing in for the API server.

A ``http.server`` in a thread records exactly what is sent (method, path, headers, body) and
answers like the API server does (a Node, or a ``Status`` with 401/403/404/409/422; a
``remove`` of a resource the node lacks is a 422, as the real API server answers). Raw socket
servers play the hostile ones: one that drips its answer a byte at a time, one whose body
never ends. tests/e2e/test_advertise_real.py runs it against the real API server.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubedevice.advertise import build_patch, escape_pointer
from kubedevice.errors import ConfigError
from kubedevice.ports import free_port

TOKEN = "t0ken-for-tests"


@dataclass
class FakeApi:
    """What the endpoint received, and what it answers next."""

    url: str
    received: list[dict[str, Any]] = field(default_factory=list)
    gets: int = 0
    status: int = 200
    capacity: dict[str, str] = field(default_factory=lambda: {"cpu": "2"})


def _handler(api: FakeApi) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            api.gets += 1
            node = self.path.split("/")[4]
            self._answer(200, _node(node, api.capacity))

        def _answer(self, status: int, doc: dict[str, Any]) -> None:
            out = json.dumps(doc).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

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
                capacity = dict(api.capacity)
                for op in json.loads(body):
                    name = op["path"].split("/")[-1].replace("~1", "/").replace("~0", "~")
                    if op["op"] == "add":
                        capacity[name] = op["value"]
                    elif name in capacity:
                        del capacity[name]
                    else:  # what the real API server answers (all or nothing)
                        self._answer(422, _status(422, REAL_422))
                        return
                api.capacity = capacity
                self._answer(200, _node(node, capacity))
            else:
                self._answer(api.status, _status(api.status, f"server says {api.status}"))

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


#: The real API server's whole message for a JSON patch that does not apply (v1.36.2).
REAL_422 = "the server rejected our request due to an error in our request"


def _node(name: str, capacity: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name},
        "status": {"capacity": dict(capacity)},
    }


def _status(code: int, message: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Status", "status": "Failure", "message": message,
            "code": code}  # fmt: skip


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
        env={
            "PATH": "/usr/bin:/bin",
            "HOME": str(tmp_path),
            **{k: os.environ[k] for k in ("PYTHONPATH",) if k in os.environ},  # these sources
        },
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


def test_dry_run_prints_every_header_that_is_sent(api: FakeApi, tmp_path: Path) -> None:
    args = ("gpu-node.zone-a", "example.com/foo=0004", "vendor.io/fpga=2", "--remove", "a.b/c")
    dry = _run(tmp_path, api.url, *args, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert api.received == []  # nothing sent
    head, body = dry.stdout.rstrip("\n").split("\n\n")
    request_line, *header_lines = head.split("\n")
    printed = dict(line.split(": ", 1) for line in header_lines)
    api.capacity["a.b/c"] = "1"
    sent = _run(tmp_path, api.url, *args)
    assert sent.returncode == 0, sent.stderr
    [req] = api.received
    assert request_line == f"PATCH {api.url}{req['path']}"
    # every header sent is printed, with its value; the token itself is not printed
    assert {k.lower() for k in printed} == set(req["headers"])
    for key, value in printed.items():
        if key == "Authorization":
            assert value == "Bearer <the token of kubeconfig user 'me'>"
            assert TOKEN not in dry.stdout
        else:
            assert req["headers"][key.lower()] == value, key
    assert body == req["body"]  # byte for byte
    assert json.loads(body)[0] == {
        "op": "add",
        "path": "/status/capacity/example.com~1foo",
        "value": "4",
    }


def _exec_kubeconfig(path: Path, server: str, marker: Path) -> Path:
    plugin = path.parent / "credential-plugin"
    plugin.write_text(f"#!/bin/sh\ntouch {marker}\necho '{{}}'\n")
    plugin.chmod(0o755)
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": server}}],
                "users": [
                    {
                        "name": "exec-user",
                        "user": {
                            "exec": {
                                "apiVersion": "client.authentication.k8s.io/v1",
                                "command": str(plugin),
                                "interactiveMode": "Never",
                            }
                        },
                    },
                    {
                        "name": "oidc-user",
                        "user": {
                            "auth-provider": {
                                "name": "oidc",
                                "config": {
                                    "client-id": "kd",
                                    "client-secret": "s",
                                    # expired (exp 1), so a client would refresh it
                                    "id-token": "eyJhbGciOiJub25lIn0.eyJleHAiOjF9.",
                                    "refresh-token": "r",
                                    "idp-issuer-url": server,
                                },
                            }
                        },
                    },
                ],
                "contexts": [
                    {"name": "exec", "context": {"cluster": "c", "user": "exec-user"}},
                    {"name": "oidc", "context": {"cluster": "c", "user": "oidc-user"}},
                ],
                "current-context": "exec",
            }
        )
    )
    return path


@pytest.mark.parametrize(
    ("context", "auth"),
    [
        ("exec", "Bearer <a token from the exec plugin '{plugin}', not run in a dry run>"),
        ("oidc", "Bearer <a token from the 'oidc' auth provider, not refreshed in a dry run>"),
    ],
)
def test_dry_run_runs_no_credential_plugin_and_writes_nothing(
    api: FakeApi, tmp_path: Path, context: str, auth: str
) -> None:
    marker = tmp_path / "plugin-ran"
    kubeconfig = _exec_kubeconfig(tmp_path / "kubeconfig", api.url, marker)
    before = kubeconfig.read_bytes()
    proc = _advertise(
        tmp_path, "--kubeconfig", str(kubeconfig), "--context", context, "--dry-run",
        "n1", "example.com/foo=1",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    plugin = tmp_path / "credential-plugin"
    assert f"Authorization: {auth.format(plugin=plugin)}" in proc.stdout.splitlines()
    assert not marker.exists()  # the exec plugin never ran
    assert kubeconfig.read_bytes() == before  # nothing rewritten
    assert api.received == []  # neither the API server nor the IdP was asked
    assert api.gets == 0


@pytest.mark.parametrize("kind", ["fifo", "nested", "laughs"])
def test_a_dry_run_reads_a_hostile_kubeconfig_in_one_line(tmp_path: Path, kind: str) -> None:
    """Before: a FIFO hung the dry run, deep nesting was a RecursionError traceback."""
    kubeconfig = tmp_path / "kubeconfig"
    if kind == "fifo":
        os.mkfifo(kubeconfig)
    elif kind == "nested":
        kubeconfig.write_text("x: " + "{a: " * 20_000 + "1" + "}" * 20_000 + "\n")
    else:
        kubeconfig.write_text(
            "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n"
            + "".join(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]\n" for i in range(1, 9))
        )
    proc = _advertise(tmp_path, "--kubeconfig", str(kubeconfig), "--dry-run", "n1", "a.io/b=1")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(f"error: cannot read kubeconfig {kubeconfig}: "), proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr


def test_dry_run_needs_no_credentials_at_all(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "clusters: [{name: c, cluster: {server: 'https://10.0.0.1:6443'}}]\n"
        "contexts: [{name: x, context: {cluster: c}}]\ncurrent-context: x\n"
    )
    proc = _advertise(tmp_path, "--kubeconfig", str(kubeconfig), "--dry-run", "n1", "a.io/b=1")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("PATCH https://10.0.0.1:6443/api/v1/nodes/n1/status\n")
    assert "Authorization" not in proc.stdout


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


def test_removing_a_resource_the_node_lacks_says_so(api: FakeApi, tmp_path: Path) -> None:
    api.capacity["example.com/foo"] = "2"
    proc = _run(tmp_path, api.url, "n1", "example.com/foo=3", "--remove", "example.com/gone")
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        "error: node n1 has no example.com/gone in its capacity: nothing to remove; "
        "nothing was changed (the patch is all or nothing)"
    ]
    assert api.capacity["example.com/foo"] == "2"
    assert api.gets == 1  # the capacity was read to say why


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
    port = free_port()  # nothing listens there
    proc = _run(tmp_path, f"http://127.0.0.1:{port}", "n1", "example.com/foo=1")
    assert proc.returncode == 2
    [line] = proc.stderr.splitlines()
    assert line.startswith(f"error: cannot reach the API server at http://127.0.0.1:{port}")


def test_missing_kubeconfig(tmp_path: Path) -> None:
    proc = _advertise(tmp_path, "--kubeconfig", str(tmp_path / "no"), "n1", "example.com/foo=1")
    assert proc.returncode == 2
    [line] = proc.stderr.splitlines()
    assert line == f"error: kubeconfig {tmp_path / 'no'} does not exist (--kubeconfig)"
    (tmp_path / "bad").write_text("clusters: 7\n")
    proc = _advertise(tmp_path, "--kubeconfig", str(tmp_path / "bad"), "n1", "example.com/foo=1")
    assert proc.returncode == 2
    [line] = proc.stderr.splitlines()
    assert line == f"error: kubeconfig {tmp_path / 'bad'}: clusters is the number 7, not a list"


def test_a_kubeconfig_kubectl_refuses_is_refused(api: FakeApi, tmp_path: Path) -> None:
    """The official client reads a quoted "false" as true (verification off): kubectl's rules
    refuse it before any request carries the token."""
    kubeconfig = _kubeconfig(tmp_path / "kubeconfig", api.url)
    doc = json.loads(kubeconfig.read_text())
    doc["clusters"][0]["cluster"]["insecure-skip-tls-verify"] = "false"
    kubeconfig.write_text(json.dumps(doc))
    proc = _advertise(tmp_path, "--kubeconfig", str(kubeconfig), "n1", "example.com/foo=1")
    assert proc.returncode == 2, proc.stderr
    [line] = proc.stderr.splitlines()
    assert "insecure-skip-tls-verify is the string 'false', not a boolean" in line
    assert api.received == []


def test_pointer_escaping() -> None:
    assert escape_pointer("a~b/c") == "a~0b~1c"
    assert escape_pointer("~1") == "~01"
    req = build_patch("n", ["x.io/a-b_c.d=3"], [])
    assert req.operations == (
        {"op": "add", "path": "/status/capacity/x.io~1a-b_c.d", "value": "3"},
    )
    with pytest.raises(ConfigError, match="nothing to do"):
        build_patch("n", [], [])


class RawServer:
    """A TCP server that reads one HTTP request (headers and Content-Length body) per
    connection and then runs ``answer(conn)``; counts the bytes it managed to send."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.requests = 0
        self.sent = 0
        self.done = threading.Event()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.sock.accept()
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            head, _, body = data.partition(b"\r\n\r\n")
            length = next(
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            )
            while len(body) < length:
                body += conn.recv(65536)
            self.requests += 1
            try:
                self.answer(self, conn)
            except OSError:
                pass  # the client hung up: what these tests expect
            finally:
                self.done.set()

    def send(self, conn: socket.socket, data: bytes) -> None:
        conn.sendall(data)
        self.sent += len(data)

    def close(self) -> None:
        self.stop.set()
        self.sock.close()
        self.thread.join(30)


@pytest.fixture
def raw() -> Iterator[Any]:
    servers: list[RawServer] = []

    def make(answer: Any) -> RawServer:
        servers.append(RawServer(answer))
        return servers[-1]

    yield make
    for server in servers:
        server.close()


NODE_200 = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 80\r\n\r\n"
    + json.dumps(_node("n1", {"example.com/foo": "1"})).encode().ljust(80)
)


def test_timeout_is_a_deadline_for_a_server_that_drips(raw: Any, tmp_path: Path) -> None:
    """A whole, valid answer sent one byte per 50 ms takes about 8 s; --timeout 1 gives up
    at the deadline instead of waiting for each byte (the old per-read timeout never fired)."""

    def drip(server: RawServer, conn: socket.socket) -> None:
        for i in range(len(NODE_200)):
            if server.stop.wait(0.05):
                return
            server.send(conn, NODE_200[i : i + 1])

    server = raw(drip)
    proc = _run(tmp_path, server.url, "--timeout", "1", "n1", "example.com/foo=1")
    assert proc.returncode == 2, proc.stdout
    [line] = proc.stderr.splitlines()
    assert line == (
        f"error: the API server at {server.url}: no complete answer within 1 s: the patch may "
        "have been applied; check with: kubectl get node n1 -o jsonpath='{.status.capacity}'"
    )
    assert server.requests == 1
    assert 0 < server.sent < len(NODE_200)  # it stopped before the answer was complete


def test_a_huge_body_is_not_read_past_the_bound(raw: Any, tmp_path: Path) -> None:
    size = 300 * 1024 * 1024

    def huge(server: RawServer, conn: socket.socket) -> None:
        server.send(conn, f"HTTP/1.1 200 OK\r\nContent-Length: {size}\r\n\r\n".encode())
        chunk = b" " * (1024 * 1024)
        while server.sent < size and not server.stop.is_set():
            server.send(conn, chunk)

    server = raw(huge)
    proc = _run(tmp_path, server.url, "n1", "example.com/foo=1")
    assert proc.returncode == 2
    [line] = proc.stderr.splitlines()
    assert line.startswith(
        f"error: the API server at {server.url} answered 200 with a body over 4 MiB; "
        "stopped reading: the patch may have been applied"
    )
    assert server.done.wait(30)
    assert server.sent < 64 * 1024 * 1024  # the client hung up long before 300 MB


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nnot json!",
            "answered 200, but not with a Node: the patch was probably applied; check with: "
            "kubectl get node n1 -o jsonpath='{.status.capacity}'",
        ),
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}",
            "answered 200, but not with a Node: the patch was probably applied",
        ),
        (
            b"",  # the connection closes once the request is in
            ": the connection failed after the request was sent (",
        ),
        (
            b'HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\n{"kind"',  # cut short
            ": the connection failed after the request was sent (",
        ),
    ],
    ids=["not-json", "not-a-node", "closed", "cut-short"],
)
def test_reached_but_bad_answers_never_say_cannot_reach(
    raw: Any, tmp_path: Path, answer: bytes, expected: str
) -> None:
    server = raw(lambda server, conn: server.send(conn, answer))
    proc = _run(tmp_path, server.url, "n1", "example.com/foo=1")
    assert proc.returncode == 2
    [line] = proc.stderr.splitlines()
    assert "cannot reach" not in line
    assert expected in line
    assert server.requests == 1


def test_no_answer_after_the_request_says_it_may_have_been_applied(
    raw: Any, tmp_path: Path
) -> None:
    server = raw(lambda server, conn: server.stop.wait(60))
    proc = _run(tmp_path, server.url, "--timeout", "0.5", "n1", "example.com/foo=1")
    assert proc.returncode == 2
    [line] = proc.stderr.splitlines()
    assert "no complete answer within 0.5 s: the patch may have been applied" in line


def test_timeout_bounds_a_name_lookup_that_never_answers(tmp_path: Path) -> None:
    """The deadline covers the name lookup: with a resolver that never answers (a UDP socket
    that reads and stays silent, named in a resolv.conf bind-mounted in a private mount
    namespace), --timeout 1 ends the command in about a second, nothing sent."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare to give the command a resolver of its own")
    silent = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        silent.bind(("127.0.0.9", 53))  # resolv.conf names no port: 53, on a spare address
    except OSError:
        silent.close()
        pytest.skip("cannot bind 127.0.0.9:53 for a silent resolver")
    asked = threading.Event()

    def swallow() -> None:
        with contextlib.suppress(OSError):
            silent.recvfrom(4096)
            asked.set()

    threading.Thread(target=swallow, daemon=True).start()
    resolv = tmp_path / "resolv.conf"
    resolv.write_text("nameserver 127.0.0.9\noptions timeout:30 attempts:1\n")
    server = "https://kd-api.example.test:6443"
    kubeconfig = _kubeconfig(tmp_path / "kubeconfig", server)
    script = 'mount --bind "$1" /etc/resolv.conf && shift && exec "$@"'
    cmd = [sys.executable, "-m", "kubedevice", "advertise", "--kubeconfig", str(kubeconfig)]
    started = time.monotonic()
    try:
        proc = subprocess.run(
            ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", str(resolv),
             *cmd, "--timeout", "1", "n1", "example.com/foo=1"],
            capture_output=True,
            text=True,
            timeout=25,
            env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
        )  # fmt: skip
    finally:
        silent.close()
    elapsed = time.monotonic() - started
    assert asked.is_set(), "the command never asked the silent resolver"
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [
        f"error: cannot reach the API server at {server}: no connection within 1 s; "
        "nothing was sent"
    ]
    assert elapsed < 10  # the resolver's own timeout is 30 s

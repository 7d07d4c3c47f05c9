"""Benchmark of ``kubedevice advertise`` against hostile API servers; prints one JSON object.

Each case runs ``kubedevice advertise`` as a process against a local raw-socket server and
reports the wall time from spawn to exit, the exit status, the process's peak RSS
(``ru_maxrss`` of the child) and how many bytes the server managed to send:

- ``drip``: a complete, valid 200 answer sent one byte per second (the issue's case: it held
  the old client 102 s with ``--timeout 3``); run with ``--timeout 3``.
- ``huge``: a 200 with a 300 MB body sent as fast as the client reads it.
- ``baseline``: the same valid answer sent at once (the cost of the command itself).

Targets: ``drip`` exits within about ``--timeout`` (3 s, plus start-up); ``huge`` stops reading
at 4 MiB, its RSS within a few MB of ``baseline``.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from _common import PY, cpu_model

NODE = json.dumps(
    {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"},
     "status": {"capacity": {"example.com/foo": "1"}}}
).encode()  # fmt: skip
ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(NODE), NODE)
HUGE = 300 * 1024 * 1024


def _serve(mode: str, sent: list[int], stop: threading.Event) -> tuple[socket.socket, int]:
    srv = socket.create_server(("127.0.0.1", 0))

    def run() -> None:
        conn, _ = srv.accept()
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            try:
                if mode == "baseline":
                    conn.sendall(ANSWER)
                    sent[0] += len(ANSWER)
                elif mode == "drip":
                    for i in range(len(ANSWER)):
                        if stop.wait(1.0):
                            return
                        conn.sendall(ANSWER[i : i + 1])
                        sent[0] += 1
                else:
                    head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % HUGE
                    conn.sendall(head)
                    chunk = b" " * (1024 * 1024)
                    while sent[0] < HUGE and not stop.is_set():
                        conn.sendall(chunk)
                        sent[0] += len(chunk)
            except OSError:
                pass

    threading.Thread(target=run, daemon=True).start()
    return srv, srv.getsockname()[1]


def _case(mode: str, tmp: Path) -> dict[str, Any]:
    sent = [0]
    stop = threading.Event()
    srv, port = _serve(mode, sent, stop)
    kubeconfig = tmp / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    args = [PY, "-m", "kubedevice", "advertise", "--kubeconfig", str(kubeconfig),
            "--timeout", "3", "n1", "example.com/foo=1"]  # fmt: skip
    start = time.monotonic()
    # a fresh parent per case, so its RUSAGE_CHILDREN peak is this command's alone
    proc = subprocess.run([PY, "-c", _WRAPPER, *args], capture_output=True, text=True, timeout=300)
    wall = time.monotonic() - start
    stop.set()
    srv.close()
    *lines, last = proc.stderr.strip().splitlines()
    exit_status, maxrss_kb = (int(x) for x in last.split())
    return {
        "exit": exit_status,
        "wall_s": round(wall, 2),
        "peak_rss_mb": round(maxrss_kb / 1024, 1),
        "server_sent_bytes": sent[0],
        "stderr": "\n".join(lines)[:200],
    }


_WRAPPER = (
    "import resource, subprocess, sys\n"
    "p = subprocess.run(sys.argv[1:])\n"
    "print(p.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr)"
)


def main() -> None:
    out: dict[str, Any] = {
        "machine": f"{cpu_model()}, {platform.python_implementation()} {platform.python_version()}",
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }
    with tempfile.TemporaryDirectory() as tmp:
        for mode in ("baseline", "drip", "huge"):
            out[mode] = _case(mode, Path(tmp))
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

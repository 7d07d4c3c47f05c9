"""A stand-in for NVIDIA's MPS control daemon (``nvidia-cuda-mps-control``) on the fake machine.

Run as ``python -m kubedevice.nvidia.fake.mps``, it is driven exactly as the real program:

* ``-d`` starts the daemon in the background (``-f``: in the foreground). It reads
  ``CUDA_MPS_PIPE_DIRECTORY`` (required here: the real one falls back to
  ``/tmp/nvidia-mps``), ``CUDA_MPS_LOG_DIRECTORY`` and ``CUDA_VISIBLE_DEVICES``, creates
  ``control`` (a Unix socket) and ``nvidia-cuda-mps-control.pid`` in the pipe directory and
  ``control.log`` in the log directory, and refuses to start where a daemon already runs.
* Without an option it is the control client: each line of its stdin is a command sent to
  the daemon of ``CUDA_MPS_PIPE_DIRECTORY``, each answer printed (``echo quit | ...`` stops
  it). Commands: ``quit``, ``get_server_list``, ``get_client_list <pid>``,
  ``set_default_device_pinned_mem_limit <dev> <value>``,
  ``set_default_active_thread_percentage <pct>``, ``get_default_active_thread_percentage``.
* ``client`` (the fake's own): what a CUDA process does at its first CUDA call under MPS:
  connects with its ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` and
  ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` and prints the daemon's answer (``--hold`` keeps the
  connection until stdin closes).

What the daemon knows is written to ``fake-mps.json`` in its log directory after every
change (its pid, the devices it is bound to, its directories, the defaults set and every
client with its limits), so tests read what each client was given.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import socket
import sys
import time
from pathlib import Path
from typing import Any, Final

__all__ = ["CONTROL_SOCKET", "PID_FILE", "STATE_FILE", "main", "read_state"]

#: The files the real daemon makes in its pipe directory (the pid file, its control socket).
PID_FILE: Final = "nvidia-cuda-mps-control.pid"
CONTROL_SOCKET: Final = "control"
#: The stand-in's record of itself and its clients, in its log directory.
STATE_FILE: Final = "fake-mps.json"


def read_state(log_dir: str | Path) -> dict[str, Any] | None:
    """What the daemon logging to ``log_dir`` recorded (``None`` when nothing is there)."""
    try:
        data = json.loads((Path(log_dir) / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


class _Daemon:
    def __init__(self, pipe: Path, log: Path | None) -> None:
        self.pipe, self.log = pipe, log
        self.state: dict[str, Any] = {
            "pid": os.getpid(),
            "visibleDevices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "pipeDirectory": str(pipe),
            "logDirectory": None if log is None else str(log),
            "startedAt": time.time(),
            "defaults": {"pinnedMemLimit": {}, "activeThreadPercentage": 100},
            "clients": [],
        }
        self.running = True

    def note(self, text: str) -> None:
        if self.log is not None:
            with open(self.log / "control.log", "a") as f:
                f.write(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] {text}\n")

    def save(self) -> None:
        if self.log is None:
            return
        tmp = self.log / f".{STATE_FILE}.tmp"
        tmp.write_text(json.dumps(self.state, indent=1))
        os.replace(tmp, self.log / STATE_FILE)

    def command(self, line: str) -> str:
        words = line.split()
        if not words:
            return ""
        verb, args = words[0], words[1:]
        self.note(f"command: {line}")
        if verb == "quit":
            self.running = False
            return ""
        if verb == "get_server_list":
            connected = any(c["connected"] for c in self.state["clients"])
            return str(os.getpid()) if connected else ""
        if verb == "get_client_list":
            return "\n".join(str(c["pid"]) for c in self.state["clients"] if c["connected"])
        if verb == "set_default_device_pinned_mem_limit" and len(args) == 2:
            self.state["defaults"]["pinnedMemLimit"][args[0]] = args[1]
            self.save()
            return ""
        if verb == "set_default_active_thread_percentage" and len(args) == 1:
            self.state["defaults"]["activeThreadPercentage"] = float(args[0])
            self.save()
            return args[0]
        if verb == "get_default_active_thread_percentage":
            return str(self.state["defaults"]["activeThreadPercentage"])
        return f"Invalid command: {line}"

    def client(self, payload: str) -> dict[str, Any]:
        info = json.loads(payload)
        record = {
            "pid": info.get("pid"),
            "pinnedMemLimit": info.get("pinnedMemLimit"),
            "activeThreadPercentage": info.get("activeThreadPercentage"),
            "connected": True,
        }
        self.state["clients"].append(record)
        self.note(f"client {record['pid']} connected: {payload}")
        self.save()
        return record

    def serve(self, ready: int | None) -> None:
        path = self.pipe / CONTROL_SOCKET
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(str(path))
        server.listen(16)
        os.chmod(path, 0o666)
        (self.pipe / PID_FILE).write_text(f"{os.getpid()}\n")
        self.save()
        self.note(f"Control daemon started (pid {os.getpid()})")
        if ready is not None:
            os.write(ready, b"1")
            os.close(ready)
        sel = selectors.DefaultSelector()
        sel.register(server, selectors.EVENT_READ, None)
        buffers: dict[socket.socket, bytes] = {}
        held: dict[socket.socket, dict[str, Any]] = {}
        while self.running:
            for key, _ in sel.select():
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                if sock is server:
                    conn, _ = server.accept()
                    sel.register(conn, selectors.EVENT_READ, None)
                    buffers[conn] = b""
                    continue
                data = sock.recv(65536)
                if not data:
                    self._gone(sel, sock, buffers, held)
                    continue
                buffers[sock] += data
                while b"\n" in buffers[sock]:
                    raw, buffers[sock] = buffers[sock].split(b"\n", 1)
                    line = raw.decode().strip()
                    if line.startswith("client "):
                        held[sock] = self.client(line[7:])
                        answer = json.dumps({"server": os.getpid(), **held[sock]})
                    else:
                        answer = self.command(line)
                    with contextlib.suppress(OSError):
                        sock.sendall((answer + "\n").encode())
                    if not self.running:
                        break
                if not self.running:
                    break
        for sock in list(buffers):
            sock.close()
        server.close()
        self.note("Control daemon exiting (quit)")
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        with contextlib.suppress(FileNotFoundError):
            (self.pipe / PID_FILE).unlink()

    def _gone(
        self,
        sel: selectors.BaseSelector,
        sock: socket.socket,
        buffers: dict[socket.socket, bytes],
        held: dict[socket.socket, dict[str, Any]],
    ) -> None:
        sel.unregister(sock)
        buffers.pop(sock, None)
        record = held.pop(sock, None)
        if record is not None:
            record["connected"] = False
            self.note(f"client {record['pid']} disconnected")
            self.save()
        sock.close()


def _dirs() -> tuple[Path, Path | None]:
    pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY")
    if not pipe:
        print("CUDA_MPS_PIPE_DIRECTORY must be set (the fake has no default)", file=sys.stderr)
        raise SystemExit(1)
    log = os.environ.get("CUDA_MPS_LOG_DIRECTORY")
    return Path(pipe), Path(log) if log else None


def _running(pipe: Path) -> bool:
    try:
        pid = int((pipe / PID_FILE).read_text().strip())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return False
    return True


def _start(foreground: bool) -> int:
    pipe, log = _dirs()
    pipe.mkdir(parents=True, exist_ok=True)
    if log is not None:
        log.mkdir(parents=True, exist_ok=True)
    if _running(pipe):
        print("An instance of this daemon is already running", file=sys.stderr)
        return 1
    if foreground:
        _Daemon(pipe, log).serve(None)
        return 0
    read, write = os.pipe()
    if os.fork() > 0:  # the caller's process: back once the daemon serves
        os.close(write)
        answer = os.read(read, 4096)
        if answer != b"1":
            why = answer.decode(errors="replace") or "the daemon exited"
            print(f"cannot start the MPS control daemon: {why}", file=sys.stderr)
            return 1
        return 0
    os.close(read)
    os.setsid()
    if os.fork() > 0:
        os._exit(0)
    os.chdir("/")
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    try:
        _Daemon(pipe, log).serve(write)
    except Exception as exc:  # told to the caller while it waits
        with contextlib.suppress(OSError):
            os.write(write, f"{type(exc).__name__}: {exc}".encode())
    finally:
        os._exit(0)


def _connect(pipe: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(pipe / CONTROL_SOCKET))
    except OSError:
        sock.close()
        print(f"Cannot find MPS control daemon process ({pipe})", file=sys.stderr)
        raise SystemExit(1) from None
    return sock


def _control() -> int:
    pipe, _ = _dirs()
    sock = _connect(pipe)
    reader = sock.makefile("r")
    for line in sys.stdin:
        if not line.strip():
            continue
        sock.sendall(line.strip().encode() + b"\n")
        answer = reader.readline()
        if answer.strip():
            print(answer.rstrip("\n"), flush=True)
        if line.strip() == "quit":
            break
    sock.close()
    return 0


def _client(hold: bool) -> int:
    pipe, _ = _dirs()
    sock = _connect(pipe)
    info = {
        "pid": os.getpid(),
        "pinnedMemLimit": os.environ.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"),
        "activeThreadPercentage": os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"),
    }
    sock.sendall(b"client " + json.dumps(info).encode() + b"\n")
    print(sock.makefile("r").readline().rstrip("\n"), flush=True)
    if hold:
        sys.stdin.read()
    sock.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    """The program: ``-d``, ``-f``, ``client [--hold]``, or control commands on stdin."""
    args = sys.argv[1:] if argv is None else argv
    if args in (["-d"], ["-f"]):
        return _start(foreground=args == ["-f"])
    if args[:1] == ["client"]:
        return _client("--hold" in args[1:])
    if not args:
        return _control()
    print(f"usage: nvidia-cuda-mps-control [-d | -f] (got {' '.join(args)})", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())

"""Picking a loopback TCP port to hand to another process (demo, checks, test harness).

Binding port 0 and closing the socket gives a port from the kernel's ephemeral range, and
that range is also where every outgoing connection takes its source port: between the
pick and the other process's bind, a connection to etcd or the API server can take it,
and the process fails with "address already in use". So the pick comes from below (or
above) the ephemeral range, which outgoing connections never use, is checked bindable,
and is never handed out twice by one process.

A leaf module shared by every side: it knows nothing of plugins or the kubelet.
"""

from __future__ import annotations

import random
import socket
import threading
from pathlib import Path

__all__ = ["EPHEMERAL_RANGE_FILE", "ephemeral_range", "free_port"]

#: Where Linux keeps the range it draws source ports of outgoing connections from.
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_DEFAULT_EPHEMERAL = (32768, 60999)
_LOWEST = 20000  # below this sit well-known services' ports
_MIN_SPAN = 1000  # a smaller gap outside the ephemeral range is not worth drawing from
_TRIES = 200

_lock = threading.Lock()
_handed_out: set[int] = set()


def ephemeral_range(path: Path = EPHEMERAL_RANGE_FILE) -> tuple[int, int]:
    """The kernel's ephemeral port range, or Linux's default where it cannot be read."""
    try:
        low, high = (int(x) for x in path.read_text().split())
    except (OSError, ValueError):
        return _DEFAULT_EPHEMERAL
    return (low, high) if 0 < low <= high <= 65535 else _DEFAULT_EPHEMERAL


def _bindable(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _kernel_pick(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def free_port(host: str = "127.0.0.1", *, ephemeral: tuple[int, int] | None = None) -> int:
    """A TCP port on ``host`` that nothing holds now and no outgoing connection will take.

    Drawn at random outside the ephemeral range (``ephemeral``, default: the kernel's),
    checked bindable, and never returned twice by this process. Where no gap outside the
    ephemeral range is wide enough, falls back to a kernel-chosen port.
    """
    low, high = ephemeral if ephemeral is not None else ephemeral_range()
    spans = [(a, b) for a, b in ((_LOWEST, low - 1), (high + 1, 65535)) if b - a + 1 >= _MIN_SPAN]
    with _lock:
        for _ in range(_TRIES if spans else 0):
            a, b = random.choice(spans)
            port = random.randint(a, b)
            if port not in _handed_out and _bindable(host, port):
                _handed_out.add(port)
                return port
        port = _kernel_pick(host)
        _handed_out.add(port)
        return port

"""The emulator's Unix sockets: created mode 0600, and only sockets are ever removed.

Shared by the Registration, PodResources and control servers so that every socket the
emulator owns follows the same rules.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from grpc import aio

__all__ = [
    "private_umask",
    "process_start_ns",
    "remove_socket",
    "serve_grpc",
    "stop_grpc",
]


def process_start_ns() -> int | None:
    """When this process started (wall clock, ns), from /proc; None where unknown.

    /proc counts in clock ticks (10 ms), rounded down, so this may be up to a tick early.
    """
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        ticks = int(fields[19])  # field 22, "starttime", in clock ticks after boot
        age_s = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None
    return time.time_ns() - max(0, int(age_s * 1e9))


@contextlib.contextmanager
def private_umask() -> Iterator[None]:
    """Sockets bound inside are created mode 0600 (no window where others can connect)."""
    old = os.umask(0o177)
    try:
        yield
    finally:
        os.umask(old)


def remove_socket(path: Path) -> None:
    """Remove ``path`` if, and only if, it is a socket; never a regular file or directory."""
    with contextlib.suppress(OSError):
        if path.is_socket():
            path.unlink()


async def serve_grpc(path: Path, add_servicers: Callable[[aio.Server], None]) -> aio.Server:
    """Serve a new ``grpc.aio`` server on the Unix socket ``path`` (a stale socket is replaced)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_socket(path)
    server = aio.server()
    add_servicers(server)
    with private_umask():
        try:
            server.add_insecure_port(f"unix://{path}")
        except RuntimeError as exc:  # grpc's bind failure; the caller gets an OSError
            await server.stop(None)
            exists = os.path.exists(path)  # noqa: ASYNC240
            why = "exists and is not a socket" if exists else "cannot be bound"
            raise OSError(f"cannot serve {path}: the path {why}") from exc
    # Bound above; started outside the umask: an await inside it would let another task's
    # private_umask() interleave and leave the process umask at 0o177.
    await server.start()
    os.chmod(path, 0o600)
    return server


async def stop_grpc(server: aio.Server | None, path: Path) -> None:
    """Stop ``server`` at once (if any) and remove its socket."""
    if server is not None:
        await server.stop(None)
    remove_socket(path)

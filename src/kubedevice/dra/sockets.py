"""A gRPC server on a Unix socket of mode 0600, for the kit's two sockets.

gRPC binds under a temporary name (umask 0177) that is hard-linked into place and then
dropped, so the socket appears at its path with its final mode; a stale socket at the path
is replaced, anything else there (a file, a directory, a symlink) is refused. Only the
socket we bound is ever removed.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Final

import grpc

from kubedevice.errors import PluginServerError

__all__ = ["MAX_SOCKET_PATH_BYTES", "UnixGrpcServer"]

log = logging.getLogger(__name__)

#: sun_path is 108 bytes on Linux, with the terminating NUL.
MAX_SOCKET_PATH_BYTES: Final = 107
_NO_HARD_LINKS: Final = (errno.EPERM, errno.EOPNOTSUPP, errno.EMLINK)
_names = itertools.count()


def _identity(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.lstat()
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino, st.st_mtime_ns) if stat.S_ISSOCK(st.st_mode) else None


class UnixGrpcServer:
    """One ``grpc.aio`` server bound to ``path``; ``add`` registers its services.

    Args:
        path: The socket path.
        add: Called with the new server to add the services, on every (re)start.
    """

    def __init__(self, path: Path, add: Callable[[grpc.aio.Server], None]) -> None:
        self.path = path
        self._add = add
        self._server: grpc.aio.Server | None = None
        self._bound: tuple[int, int, int] | None = None

    @property
    def serving(self) -> bool:
        """Whether our socket is still at its path."""
        return self._bound is not None and _identity(self.path) == self._bound

    async def start(self) -> None:
        """Bind and serve (stopping a previous server of ours first).

        Raises:
            PluginServerError: The path is too long, is not a socket, or cannot be bound.
        """
        await self.stop()
        path = self.path
        tmp = path.with_name(f".kd-{os.getpid()}-{next(_names)}.sock")
        if len(os.fsencode(tmp)) > MAX_SOCKET_PATH_BYTES:
            raise PluginServerError(
                f"socket path {tmp} is longer than {MAX_SOCKET_PATH_BYTES} bytes; use a "
                "shorter kubelet directory or driver name"
            )
        try:
            path.parent.mkdir(mode=0o750, parents=True, exist_ok=True)
            st = path.lstat()
        except FileNotFoundError:
            st = None
        except OSError as exc:
            raise PluginServerError(f"cannot serve on {path}: {exc}") from None
        if st is not None and not stat.S_ISSOCK(st.st_mode):
            raise PluginServerError(f"{path} exists and is not a socket; refusing to remove it")
        server = grpc.aio.server(options=[("grpc.max_send_message_length", -1)])
        self._add(server)
        old_umask = os.umask(0o177)
        try:
            port = server.add_insecure_port(f"unix:{tmp}")
        except RuntimeError as exc:
            raise PluginServerError(f"cannot listen on {path}: {exc}") from None
        finally:
            os.umask(old_umask)
        if not port:
            raise PluginServerError(f"cannot listen on {path}")
        try:
            os.chmod(tmp, 0o600)
            if st is not None and _identity(path) is not None:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()  # a stale socket (of a previous run)
            try:
                os.link(tmp, path)
            except OSError as exc:
                if exc.errno not in _NO_HARD_LINKS:
                    raise
                os.rename(tmp, path)
        except OSError as exc:
            await server.stop(None)
            raise PluginServerError(f"cannot serve on {path}: {exc}") from None
        finally:
            with contextlib.suppress(OSError):
                tmp.unlink()
        self._bound = _identity(path)
        self._server = server
        await server.start()
        log.debug("serving on %s", path)

    async def stop(self, grace: float | None = None) -> None:
        """Stop serving and remove our socket (only ours). Idempotent."""
        server, self._server = self._server, None
        bound, self._bound = self._bound, None
        if bound is not None and _identity(self.path) == bound:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
        if server is not None:
            await server.stop(grace)

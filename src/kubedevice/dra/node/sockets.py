"""A gRPC server on a Unix socket of mode 0600, for the kit's two sockets.

The socket is put in place as the device-plugin server's is (:mod:`kubedevice.plugin.unixsock`);
a stale socket at the path is replaced, anything else there (a file, a directory, a symlink)
is refused. Only the socket we bound is ever removed.
"""

from __future__ import annotations

import contextlib
import logging
import stat
from collections.abc import Callable
from pathlib import Path

import grpc

from kubedevice.errors import PluginServerError
from kubedevice.plugin.unixsock import (
    SocketIdentity,
    bind_in_place,
    check_path_length,
    socket_identity,
    temp_path,
)

__all__ = ["UnixGrpcServer"]

log = logging.getLogger(__name__)


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
        self._bound: SocketIdentity | None = None

    @property
    def serving(self) -> bool:
        """Whether our socket is still at its path."""
        return self._bound is not None and socket_identity(self.path) == self._bound

    async def start(self) -> None:
        """Bind and serve (stopping a previous server of ours first).

        Raises:
            PluginServerError: The path is too long, is not a socket, or cannot be bound.
        """
        await self.stop()
        path = self.path
        tmp = temp_path(path)
        check_path_length(path, tmp, hint="use a shorter kubelet directory or driver name")
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
        try:
            self._bound = bind_in_place(server, path, tmp, replace=st is not None)
        except PluginServerError:
            await server.stop(None)
            raise
        self._server = server
        await server.start()
        log.debug("serving on %s", path)

    async def stop(self, grace: float | None = None) -> None:
        """Stop serving and remove our socket (only ours). Idempotent."""
        server, self._server = self._server, None
        bound, self._bound = self._bound, None
        if bound is not None and socket_identity(self.path) == bound:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
        if server is not None:
            await server.stop(grace)

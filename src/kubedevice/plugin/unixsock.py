"""Putting a gRPC server's Unix socket in place with mode 0600, for every daemon that serves one.

gRPC binds under a temporary name (umask 0177, then chmod 0600) that is hard-linked into
place and then dropped: the socket appears at its path atomically with its final mode,
nothing that appeared at the path meanwhile is replaced (the link fails instead), and
gRPC's own unlink at shutdown (by path) hits the temporary name, never a socket someone
else has put at the path. Only a socket is ever removed, and only one the caller says is
stale. Used by the device-plugin server and by the DRA kit's two sockets.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import stat
from pathlib import Path
from typing import Final

import grpc

from kubedevice.errors import PluginServerError
from kubedevice.plugin.config import MAX_SOCKET_PATH_BYTES

__all__ = [
    "SocketIdentity",
    "SocketWiped",
    "bind_in_place",
    "check_path_length",
    "socket_identity",
    "temp_path",
]

#: Device, inode and modification time of a socket file.
SocketIdentity = tuple[int, int, int]


class SocketWiped(PluginServerError):
    """Our temporary socket was deleted between bind and link (a kubelet restarting)."""


_NO_HARD_LINKS: Final = (errno.EPERM, errno.EOPNOTSUPP, errno.EMLINK)
_names = itertools.count()


def socket_identity(path: Path) -> SocketIdentity | None:
    """Identity of the socket at ``path``, or None if there is no socket.

    Device and inode number, plus the modification time because inode numbers are reused.
    Not the change time: chmod, chown, an SELinux relabel or a rename change that, and
    mistaking one for a re-created ``kubelet.sock`` means a second Register to the same
    kubelet, which released kubelets answer by dropping us (kubernetes#121994).
    """
    try:
        st = path.lstat()
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino, st.st_mtime_ns) if stat.S_ISSOCK(st.st_mode) else None


def temp_path(path: Path) -> Path:
    """A fresh temporary name beside ``path`` for gRPC to bind under."""
    return path.with_name(f".kd-{os.getpid()}-{next(_names)}.sock")


def check_path_length(*paths: Path, hint: str) -> None:
    """Raise :class:`PluginServerError` if a path does not fit in ``sun_path``."""
    for candidate in paths:
        if len(os.fsencode(candidate)) > MAX_SOCKET_PATH_BYTES:
            raise PluginServerError(
                f"socket path {candidate} is longer than {MAX_SOCKET_PATH_BYTES} bytes; {hint}"
            )


def bind_in_place(
    server: grpc.aio.Server, path: Path, tmp: Path, *, replace: bool
) -> SocketIdentity:
    """Bind ``server`` (not started) under ``tmp`` and link the socket to ``path``.

    Args:
        server: The server to bind; the caller starts it, or stops it on an error.
        path: Where the socket must appear.
        tmp: The temporary name (:func:`temp_path`), removed before this returns.
        replace: Remove the socket found at ``path`` first (one the caller judged stale).

    Returns:
        The identity of our socket, to tell it later from one someone else put there.

    Raises:
        SocketWiped: Our new socket was removed before it was linked into place.
        PluginServerError: gRPC could not listen, something appeared at ``path`` while
            we were binding, or the socket could not be put in place.
    """
    old_umask = os.umask(0o177)
    try:
        port = server.add_insecure_port(f"unix:{tmp}")
    except RuntimeError as exc:
        raise PluginServerError(f"cannot listen on {path}: {exc}") from exc
    finally:
        os.umask(old_umask)
    if not port:
        raise PluginServerError(f"cannot listen on {path}")
    try:
        os.chmod(tmp, 0o600)
        bound = socket_identity(tmp)  # the link below shares it: the identity of our socket
        if bound is None:
            raise FileNotFoundError(errno.ENOENT, "our new socket is gone", str(tmp))
        if replace and socket_identity(path) is not None:  # still a socket: nothing else
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        try:
            os.link(tmp, path)
        except OSError as exc:
            if exc.errno not in _NO_HARD_LINKS:
                raise
            os.rename(tmp, path)  # a file system without hard links
    except OSError as exc:
        if exc.errno == errno.EEXIST:
            raise PluginServerError(
                f"{path} appeared while we were binding; refusing to replace it"
            ) from exc
        if exc.errno == errno.ENOENT and socket_identity(tmp) is None:
            raise SocketWiped(
                f"our new socket for {path} was removed while we were binding (the "
                "kubelet cleaning its directory as it restarts?)"
            ) from exc
        raise PluginServerError(f"cannot serve on {path}: {exc}") from exc
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()
    return bound

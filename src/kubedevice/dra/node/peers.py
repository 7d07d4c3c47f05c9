"""Other instances of this driver on the node (the newer pod of a rolling upgrade), told
apart from any other socket that appears in the plugin dir.

With a pod UID, an instance serves ``plugins/<driver>/dra-<pod UID>.sock`` and registers
through ``plugins_registry/<driver>-<pod UID>-reg.sock``. Another pod UID's DRA socket
counts as an instance of this driver only when it answers as one: the DRA socket accepts a
connection and the registration socket's ``GetInfo`` names this driver (type ``DRAPlugin``),
with that DRA socket
as its endpoint, within :data:`PEER_TIMEOUT_S`. A socket that answers as something else, or
not at all (a hung process), does not count; a hung one costs the check that long, never
the event loop.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Final

import grpc

from kubedevice._api.pluginregistration.v1 import api_pb2 as reg_pb, api_pb2_grpc as reg_grpc
from kubedevice.dra.model.names import check_pod_uid, dra_socket_path, registration_socket_path
from kubedevice.errors import ConfigError

__all__ = ["PEER_TIMEOUT_S", "accepts", "peer_uid", "serves_as"]

#: Seconds the registration socket of another instance has to answer ``GetInfo``.
PEER_TIMEOUT_S: Final = 1.0


def peer_uid(name: str, driver: str, own_uid: str) -> str | None:
    """The pod UID of another instance named by ``name``: a DRA socket's
    (``dra-<pod UID>.sock``) or a registration socket's (``<driver>-<pod UID>-reg.sock``)
    file name; ``None`` for any other name and for this instance's own."""
    uid: str | None = None
    if name.startswith("dra-") and name.endswith(".sock"):
        uid = name[len("dra-") : -len(".sock")]
    elif name.startswith(f"{driver}-") and name.endswith("-reg.sock"):
        uid = name[len(driver) + 1 : -len("-reg.sock")]
    if not uid or uid == own_uid:
        return None
    try:
        check_pod_uid(uid)
    except ConfigError:
        return None
    return uid


def accepts(path: Path) -> bool:
    """Whether a Unix socket at ``path`` accepts a connection (it does not block: a
    listening socket's backlog takes it, a dead one refuses at once)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.setblocking(False)
        try:
            probe.connect(str(path))
        except BlockingIOError:  # the backlog is full: it is alive
            return True
        except OSError:
            return False
    return True


async def serves_as(
    driver: str, kubelet_dir: Path, uid: str, timeout_s: float = PEER_TIMEOUT_S
) -> bool:
    """Whether the instance of pod ``uid`` serves as ``driver``: its DRA socket accepts and
    its registration socket's ``GetInfo`` names ``driver`` and that DRA socket."""
    dra = dra_socket_path(kubelet_dir, driver, uid)
    if not accepts(dra):
        return False
    registration = registration_socket_path(kubelet_dir, driver, uid)
    try:
        async with grpc.aio.insecure_channel(f"unix:{registration}") as channel:
            info = await reg_grpc.RegistrationStub(channel).GetInfo(
                reg_pb.InfoRequest(), timeout=timeout_s
            )
    except (grpc.RpcError, OSError, ValueError):
        return False
    return bool(info.type == "DRAPlugin" and info.name == driver and info.endpoint == str(dra))

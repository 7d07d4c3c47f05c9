"""Name rules of the DRA API that the kit checks before any network call.

Driver names are DNS subdomains (at most 63 characters, as ``ResourceSlice.spec.driver``);
node names are DNS subdomains. Socket and file names built from them live here too.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Final

from kubedevice.errors import ConfigError

__all__ = [
    "MAX_DRIVER_NAME_LENGTH",
    "check_driver_name",
    "check_node_name",
    "check_pod_uid",
    "dra_socket_path",
    "registration_socket_path",
]

#: ``ResourceSlice.spec.driver`` and ``DeviceClass`` selectors: at most 63 characters.
MAX_DRIVER_NAME_LENGTH: Final = 63

_DNS_SUBDOMAIN: Final = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)


def check_driver_name(name: str) -> None:
    """Raise :class:`ConfigError` unless ``name`` is a driver name the API server accepts."""
    if len(name) > MAX_DRIVER_NAME_LENGTH or not _DNS_SUBDOMAIN.match(name):
        raise ConfigError(
            f"driver name {name!r} must be a DNS subdomain (lower-case, dots) of at most "
            f"{MAX_DRIVER_NAME_LENGTH} characters, like gpu.example.com"
        )


def check_node_name(name: str) -> None:
    """Raise :class:`ConfigError` unless ``name`` is a node name (a DNS subdomain)."""
    if len(name) > 253 or not _DNS_SUBDOMAIN.match(name):
        raise ConfigError(f"node name {name!r} is not a DNS subdomain")


_POD_UID: Final = re.compile(r"^[a-z0-9]([-a-z0-9]{0,62}[a-z0-9])?$")


def check_pod_uid(uid: str) -> None:
    """Raise :class:`ConfigError` unless ``uid`` can name a socket (a pod UID is a UUID)."""
    if not _POD_UID.match(uid):
        raise ConfigError(
            f"pod UID {uid[:80]!r} must be lower-case letters, digits and '-' (at most 64), "
            "like the UUID the downward API gives (fieldRef: metadata.uid)"
        )


def registration_socket_path(kubelet_dir: Path, driver_name: str, pod_uid: str = "") -> Path:
    """``<kubelet dir>/plugins_registry/<driver>[-<pod UID>]-reg.sock``: the kubelet's
    plugin watcher (with a pod UID, each instance of a DaemonSet rolling over its own)."""
    suffix = f"-{pod_uid}" if pod_uid else ""
    return kubelet_dir / "plugins_registry" / f"{driver_name}{suffix}-reg.sock"


def dra_socket_path(kubelet_dir: Path, driver_name: str, pod_uid: str = "") -> Path:
    """``<kubelet dir>/plugins/<driver>/dra[-<pod UID>].sock``: the DRA services' endpoint."""
    suffix = f"-{pod_uid}" if pod_uid else ""
    return kubelet_dir / "plugins" / driver_name / f"dra{suffix}.sock"

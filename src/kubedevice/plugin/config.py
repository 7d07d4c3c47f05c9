"""Plugin-side settings that need no network: resource-name rule, socket names, plugin dir.

Everything here is checked before any gRPC call, so a bad value fails fast with a
:class:`~kubedevice.errors.ConfigError` that says which rule failed.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Final

from kubedevice._api.constants import (
    DEFAULT_DEVICE_PLUGIN_DIR,
    ENV_DEVICE_PLUGIN_DIR,
    KUBELET_SOCKET,
)
from kubedevice.errors import ConfigError, InvalidResourceNameError

__all__ = [
    "MAX_SOCKET_PATH_BYTES",
    "default_socket_name",
    "resolve_device_plugin_dir",
    "validate_resource_name",
    "validate_socket_name",
]

#: Longest AF_UNIX path Linux accepts (``sun_path`` is 108 bytes including the NUL).
MAX_SOCKET_PATH_BYTES: Final = 107

_DNS1123_LABEL = r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN = re.compile(rf"{_DNS1123_LABEL}(?:\.{_DNS1123_LABEL})*")
_QUALIFIED_NAME = re.compile(r"(?:[A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")


def validate_resource_name(name: str) -> str:
    """Check ``name`` with the kubelet's extended-resource-name rule (contract.md#resource-names).

    Args:
        name: A resource name such as ``example.com/gpu``.

    Returns:
        ``name`` unchanged, so the call can be used inline.

    Raises:
        InvalidResourceNameError: The kubelet would reject ``name``; the message says
            which rule failed.
    """
    if not isinstance(name, str) or not name:
        raise InvalidResourceNameError(str(name), "it is empty")
    if "/" not in name:
        raise InvalidResourceNameError(
            name, "it has no domain: an extended resource name looks like 'example.com/name'"
        )
    if "kubernetes.io/" in name:
        raise InvalidResourceNameError(name, "the 'kubernetes.io/' domain is reserved")
    if name.startswith("requests."):
        raise InvalidResourceNameError(name, "it must not start with 'requests.'")
    if name.count("/") != 1:
        raise InvalidResourceNameError(name, "it must contain exactly one '/'")
    domain, _, short = name.partition("/")
    prefix = "requests." + domain
    if len(prefix) > 253:
        raise InvalidResourceNameError(
            name, f"the domain {domain!r} is too long (at most 244 characters)"
        )
    if not _DNS1123_SUBDOMAIN.fullmatch(prefix):
        raise InvalidResourceNameError(
            name,
            f"the domain {domain!r} is not a DNS-1123 subdomain (lower-case a-z, 0-9, '-' "
            "and '.', starting and ending with an alphanumeric character)",
        )
    if not short:
        raise InvalidResourceNameError(name, "the part after '/' is empty")
    if len(short) > 63:
        raise InvalidResourceNameError(
            name, f"the part after '/' is {len(short)} characters long (at most 63)"
        )
    if not _QUALIFIED_NAME.fullmatch(short):
        raise InvalidResourceNameError(
            name,
            f"the part after '/' ({short!r}) must consist of alphanumeric characters, '-', "
            "'_' or '.', and start and end with an alphanumeric character",
        )
    return name


def default_socket_name(resource_name: str) -> str:
    """The socket file name used when a plugin does not choose one.

    Args:
        resource_name: A valid resource name.

    Returns:
        ``resource_name`` with ``/`` replaced by ``-`` plus ``.sock``, for example
        ``example.com-gpu.sock``.
    """
    return resource_name.replace("/", "-") + ".sock"


def validate_socket_name(socket_name: str) -> str:
    """Check a plugin socket's file name (relative to the device plugin directory).

    Args:
        socket_name: A bare file name such as ``example.com-gpu.sock``.

    Returns:
        ``socket_name`` unchanged.

    Raises:
        ConfigError: It is empty, contains ``/``, is hidden, or is the kubelet's socket.
    """
    if not socket_name or "/" in socket_name or "\0" in socket_name:
        raise ConfigError(
            f"socket name {socket_name!r} must be a bare file name, relative to the "
            "device plugin directory"
        )
    if socket_name.startswith("."):
        raise ConfigError(f"socket name {socket_name!r} must not start with '.'")
    if socket_name == KUBELET_SOCKET:
        raise ConfigError(f"socket name {socket_name!r} is the kubelet's own socket")
    return socket_name


def resolve_device_plugin_dir(explicit: str | os.PathLike[str] | None = None) -> Path:
    """Pick the device plugin directory: ``explicit`` > ``$DP_DEVICE_PLUGIN_DIR`` > default.

    Args:
        explicit: A directory given in code or by ``--device-plugin-dir``; ``None`` or
            empty means "not given".

    Returns:
        The directory as an absolute :class:`~pathlib.Path`
        (default ``/var/lib/kubelet/device-plugins``).
    """
    chosen: str | os.PathLike[str] = (
        explicit or os.environ.get(ENV_DEVICE_PLUGIN_DIR) or DEFAULT_DEVICE_PLUGIN_DIR
    )
    return Path(chosen).absolute()

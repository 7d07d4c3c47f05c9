"""The API server's rules for one ResourceSlice device, checked before publishing.

The API server measures strings in bytes (UTF-8), not characters: a 40-character value
in a non-Latin script is over the 64-byte limit. It refuses a whole ResourceSlice for one
bad device, which would leave the node's whole pool unpublished; the publisher checks each
device here first, publishes the valid ones and reports the others (device and field).
The rules follow k8s.io/kubernetes ``pkg/apis/resource/validation`` (resource.k8s.io/v1).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

__all__ = ["MAX_ATTRIBUTE_VALUE_BYTES", "MAX_DOMAIN_BYTES", "device_problems"]

#: A string or version attribute value: at most 64 bytes.
MAX_ATTRIBUTE_VALUE_BYTES: Final = 64
#: The domain of a qualified attribute or capacity name (``<domain>/<name>``): a driver
#: name, at most 63 bytes.
MAX_DOMAIN_BYTES: Final = 63
_MAX_ID_BYTES: Final = 32
_DNS_LABEL: Final = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN: Final = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)
_C_IDENTIFIER: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _bytes(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def _name_problems(field: str, key: str) -> list[str]:
    domain, slash, name = key.rpartition("/")
    out = []
    if not _C_IDENTIFIER.match(name) or _bytes(name) > _MAX_ID_BYTES:
        out.append(f"{field} {key!r}: the name must be a C identifier of at most 32 bytes")
    if slash and (
        not domain or not _DNS_SUBDOMAIN.match(domain) or _bytes(domain) > MAX_DOMAIN_BYTES
    ):
        out.append(
            f"{field} {key!r}: the domain must be a DNS subdomain of at most "
            f"{MAX_DOMAIN_BYTES} bytes ({_bytes(domain)})"
        )
    return out


def device_problems(device: Mapping[str, Any]) -> list[str]:
    """What the API server would refuse in ``device`` (a ResourceSlice device, JSON): one
    line per field, naming it; empty when the device is valid."""
    out: list[str] = []
    name = str(device.get("name", ""))
    if _bytes(name) > 63 or not _DNS_LABEL.match(name):
        out.append(f"name {name[:80]!r}: must be a DNS label of at most 63 bytes")
    for key, value in (device.get("attributes") or {}).items():
        out += _name_problems("attribute", key)
        for kind in ("string", "version"):
            text = value.get(kind) if isinstance(value, Mapping) else None
            if isinstance(text, str) and _bytes(text) > MAX_ATTRIBUTE_VALUE_BYTES:
                out.append(
                    f"attribute {key!r}: the {kind} is {_bytes(text)} bytes, more than "
                    f"{MAX_ATTRIBUTE_VALUE_BYTES} ({len(text)} characters)"
                )
    for key in device.get("capacity") or {}:
        out += _name_problems("capacity", key)
    return out

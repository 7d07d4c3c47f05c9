"""The JSON patch that advertises or removes extended resources in a node's status capacity.

Pure functions: argument parsing with the package's resource-name rule, whole-number counts,
JSON-pointer escaping (RFC 6901: ``~`` -> ``~0``, ``/`` -> ``~1``), and the request as
``PATCH /api/v1/nodes/<node>/status`` with ``Content-Type: application/json-patch+json``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

from kubedevice import __version__
from kubedevice.errors import ConfigError
from kubedevice.plugin.config import validate_resource_name

__all__ = [
    "CONTENT_TYPE",
    "USER_AGENT",
    "PatchRequest",
    "build_patch",
    "escape_pointer",
    "parse_assignment",
    "validate_node_name",
]

CONTENT_TYPE = "application/json-patch+json"
USER_AGENT = f"kubedevice/{__version__}"
#: The API server caps quantities at the int64 maximum.
_MAX_COUNT = 2**63 - 1
_NODE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def escape_pointer(token: str) -> str:
    """One JSON-pointer reference token: ``~`` -> ``~0`` then ``/`` -> ``~1``."""
    return token.replace("~", "~0").replace("/", "~1")


def validate_node_name(name: str) -> str:
    """A node name (DNS subdomain, at most 253 characters); ConfigError otherwise."""
    if not name or len(name) > 253 or not _NODE_NAME.fullmatch(name):
        raise ConfigError(
            f"invalid node name {name!r}: lower-case letters, digits, '-' and '.', "
            "at most 253 characters"
        )
    return name


def parse_assignment(text: str) -> tuple[str, int]:
    """``example.com/foo=4`` -> ``("example.com/foo", 4)``; ConfigError naming the problem."""
    name, sep, count = text.partition("=")
    if not sep:
        raise ConfigError(f"{text!r}: expected RESOURCE=COUNT, like example.com/foo=4")
    validate_resource_name(name)
    if not count.isascii() or not count.isdigit():
        raise ConfigError(f"{name}: count {count!r} must be a whole number of devices, like 4")
    if len(count.lstrip("0")) > 19 or int(count) > _MAX_COUNT:
        raise ConfigError(f"{name}: count {count[:24]}... is larger than {_MAX_COUNT}")
    return name, int(count)


@dataclass(frozen=True, slots=True)
class PatchRequest:
    """The HTTP request ``advertise`` sends."""

    node: str
    operations: tuple[dict[str, Any], ...]
    #: The resource name of each operation, in the same order (unescaped).
    resources: tuple[str, ...]

    @property
    def path(self) -> str:
        """The request path."""
        return f"/api/v1/nodes/{quote(self.node, safe='')}/status"

    def body(self) -> str:
        """The JSON body (``json.dumps`` of the operations)."""
        return json.dumps(list(self.operations))

    def url(self, server: str) -> str:
        """The full URL on ``server`` (which may carry a path prefix)."""
        return server.rstrip("/") + self.path

    def headers(self, server: str, authorization: str) -> list[tuple[str, str]]:
        """Every header sent, in order (the Authorization header only when ``authorization``
        is not empty)."""
        out = [
            ("Host", urlsplit(server).netloc),
            ("User-Agent", USER_AGENT),
            ("Accept", "application/json"),
            ("Content-Type", CONTENT_TYPE),
            ("Content-Length", str(len(self.body().encode()))),
        ]
        if authorization:
            out.append(("Authorization", authorization))
        return out

    def render(self, server: str, authorization: str) -> str:
        """The request as text: ``PATCH URL``, every header, a blank line, the body."""
        lines = [f"PATCH {self.url(server)}"]
        lines += [f"{k}: {v}" for k, v in self.headers(server, authorization)]
        return "\n".join([*lines, "", self.body()])


def build_patch(node: str, add: Sequence[str], remove: Sequence[str]) -> PatchRequest:
    """The patch for ``NODE RESOURCE=COUNT... --remove RESOURCE...``; ConfigError if invalid."""
    validate_node_name(node)
    if not add and not remove:
        raise ConfigError("nothing to do: give RESOURCE=COUNT and/or --remove RESOURCE")
    ops: list[dict[str, Any]] = []
    seen: dict[str, None] = {}  # ordered: one name per operation
    for text in add:
        name, count = parse_assignment(text)
        if name in seen:
            raise ConfigError(f"{name} is given twice")
        seen[name] = None
        path = "/status/capacity/" + escape_pointer(name)
        ops.append({"op": "add", "path": path, "value": str(count)})
    for name in remove:
        validate_resource_name(name)
        if name in seen:
            raise ConfigError(f"{name} is given twice")
        seen[name] = None
        ops.append({"op": "remove", "path": "/status/capacity/" + escape_pointer(name)})
    return PatchRequest(node, tuple(ops), tuple(seen))

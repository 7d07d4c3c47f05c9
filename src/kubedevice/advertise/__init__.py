"""``kubedevice advertise``: advertise extended resources on a node without a device plugin.

The classic manual way: a JSON patch on the node's status capacity. :mod:`.patch` builds the
request (pure), :mod:`.target` reads where it would go without running anything (a dry run),
:mod:`.client` loads credentials and sends it under one deadline.
"""

from kubedevice.advertise.client import MAX_BODY, Connection, load_connection, send
from kubedevice.advertise.patch import (
    CONTENT_TYPE,
    USER_AGENT,
    PatchRequest,
    build_patch,
    escape_pointer,
    parse_assignment,
)
from kubedevice.advertise.target import Target, read_target

__all__ = [
    "CONTENT_TYPE",
    "MAX_BODY",
    "USER_AGENT",
    "Connection",
    "PatchRequest",
    "Target",
    "build_patch",
    "escape_pointer",
    "load_connection",
    "parse_assignment",
    "read_target",
    "send",
]

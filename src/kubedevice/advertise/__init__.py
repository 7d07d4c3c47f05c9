"""``kubedevice advertise``: advertise extended resources on a node without a device plugin.

The classic manual way: a JSON patch on the node's status capacity, sent with the official
Kubernetes client (kubeconfig or in-cluster). :mod:`.patch` builds the request (pure),
:mod:`.client` sends it.
"""

from kubedevice.advertise.client import api_host, load_client, send
from kubedevice.advertise.patch import (
    CONTENT_TYPE,
    PatchRequest,
    build_patch,
    escape_pointer,
    parse_assignment,
)

__all__ = [
    "CONTENT_TYPE",
    "PatchRequest",
    "api_host",
    "build_patch",
    "escape_pointer",
    "load_client",
    "parse_assignment",
    "send",
]

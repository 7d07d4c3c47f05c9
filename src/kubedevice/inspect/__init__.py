"""``kubedevice inspect``: a read-only doctor for a node's device plugins.

Works on a real kubelet's node and on the emulator alike: the device plugin directory (its
sockets and ``kubelet_internal_checkpoint``) and the PodResources socket. Independent of both
the plugin side and the kubelet side (import-linter checks it); it shares only
:mod:`kubedevice._api` with them and decodes the checkpoint itself.
"""

from kubedevice.inspect.checkpoint import Checkpoint, CheckpointAllocation, read_checkpoint
from kubedevice.inspect.node import Finding, NodeReport, inspect_node
from kubedevice.inspect.probe import PluginProbe
from kubedevice.inspect.render import safe, to_json, to_text

__all__ = [
    "Checkpoint",
    "CheckpointAllocation",
    "Finding",
    "NodeReport",
    "PluginProbe",
    "inspect_node",
    "read_checkpoint",
    "safe",
    "to_json",
    "to_text",
]

"""The generated kubelet API layer: the only code the plugin side and the kubelet side share.

Re-exports the generated protobuf/gRPC modules under short names and the contract's
constants. Nothing here has behaviour; both sides build their own logic on top, so a
misreading of the contract cannot hide on both sides at once.
"""

from kubedevice._api.constants import (
    CHECKPOINT_FILE,
    DEFAULT_DEVICE_PLUGIN_DIR,
    DIAL_TIMEOUT_S,
    ENDPOINT_STOP_GRACE_PERIOD_S,
    ENV_DEVICE_PLUGIN_DIR,
    HEALTHY,
    KUBELET_MAX_RECV_MESSAGE_BYTES,
    KUBELET_SOCKET,
    NODE_WITHOUT_TOPOLOGY,
    PRESTART_TIMEOUT_S,
    SUPPORTED_VERSIONS,
    UNHEALTHY,
    VERSION,
)
from kubedevice._api.deviceplugin.v1beta1 import api_pb2 as dp, api_pb2_grpc as dp_grpc
from kubedevice._api.podresources.v1 import api_pb2 as pr, api_pb2_grpc as pr_grpc

__all__ = [
    "CHECKPOINT_FILE",
    "DEFAULT_DEVICE_PLUGIN_DIR",
    "DIAL_TIMEOUT_S",
    "ENDPOINT_STOP_GRACE_PERIOD_S",
    "ENV_DEVICE_PLUGIN_DIR",
    "HEALTHY",
    "KUBELET_MAX_RECV_MESSAGE_BYTES",
    "KUBELET_SOCKET",
    "NODE_WITHOUT_TOPOLOGY",
    "PRESTART_TIMEOUT_S",
    "SUPPORTED_VERSIONS",
    "UNHEALTHY",
    "VERSION",
    "dp",
    "dp_grpc",
    "pr",
    "pr_grpc",
]

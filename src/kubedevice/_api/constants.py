"""Constants of the kubelet device plugin contract (docs/contract.md#constants), as plain values.

Facts only: names, numbers and paths that are part of the wire contract or of the
kubelet's documented behaviour. No logic lives here.
"""

from typing import Final

#: The only API version the kubelet accepts in RegisterRequest.version.
VERSION: Final = "v1beta1"
SUPPORTED_VERSIONS: Final = ("v1beta1",)

#: Default device plugin directory (hard-coded in the kubelet; trailing slash as upstream).
DEFAULT_DEVICE_PLUGIN_DIR: Final = "/var/lib/kubelet/device-plugins/"
#: Base name of the kubelet's Registration socket inside the device plugin directory.
KUBELET_SOCKET: Final = "kubelet.sock"
#: Environment variable that overrides the device plugin directory everywhere in kubedevice.
ENV_DEVICE_PLUGIN_DIR: Final = "DP_DEVICE_PLUGIN_DIR"
#: The device manager's checkpoint file, in the device plugin directory.
CHECKPOINT_FILE: Final = "kubelet_internal_checkpoint"

#: Exact health strings; anything other than HEALTHY counts as unhealthy.
HEALTHY: Final = "Healthy"
UNHEALTHY: Final = "Unhealthy"

#: Kubelet deadline for PreStartContainer.
PRESTART_TIMEOUT_S: Final = 30.0
#: Kubelet deadline for dialing a plugin's socket during Register.
DIAL_TIMEOUT_S: Final = 10.0
#: How long a disconnected plugin's resource is kept (allocatable 0) before removal.
ENDPOINT_STOP_GRACE_PERIOD_S: Final = 300.0
#: NUMA key used in the checkpoint for devices without topology.
NODE_WITHOUT_TOPOLOGY: Final = -1
#: grpc-go's default receive limit, which the kubelet keeps for ListAndWatch.
KUBELET_MAX_RECV_MESSAGE_BYTES: Final = 4 * 1024 * 1024

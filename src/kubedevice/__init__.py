"""kubedevice: Kubernetes device plugins in Python.

The public API for plugin authors is re-exported here (``import kubedevice``); the
kubelet emulator lives in :mod:`kubedevice.kubelet`, the conformance kit in
:mod:`kubedevice.conformance` and the generic /dev plugin in :mod:`kubedevice.generic`.
"""

from typing import TYPE_CHECKING, Any

from kubedevice.errors import (
    AllocationError as AllocationError,
    ConfigError as ConfigError,
    InvalidResourceNameError as InvalidResourceNameError,
    KubeDeviceError as KubeDeviceError,
    PluginServerError as PluginServerError,
    RegistrationError as RegistrationError,
)
from kubedevice.plugin import (
    DEFAULT as DEFAULT,
    AllocateResult as AllocateResult,
    ContainerAllocation as ContainerAllocation,
    DefaultType as DefaultType,
    Device as Device,
    DevicePlugin as DevicePlugin,
    DeviceSpec as DeviceSpec,
    Health as Health,
    Mount as Mount,
    PluginOptions as PluginOptions,
    PluginServer as PluginServer,
    ServerState as ServerState,
    argument_parser as argument_parser,
    default_preferred_allocation as default_preferred_allocation,
    default_socket_name as default_socket_name,
    main as main,
    resolve_device_plugin_dir as resolve_device_plugin_dir,
    run as run,
    serve as serve,
    validate_resource_name as validate_resource_name,
)

if TYPE_CHECKING:
    from kubedevice.plugin.metrics import PluginMetrics as PluginMetrics

__version__ = "0.1.0"

__all__ = [
    "DEFAULT",
    "AllocateResult",
    "AllocationError",
    "ConfigError",
    "ContainerAllocation",
    "DefaultType",
    "Device",
    "DevicePlugin",
    "DeviceSpec",
    "Health",
    "InvalidResourceNameError",
    "KubeDeviceError",
    "Mount",
    "PluginMetrics",
    "PluginOptions",
    "PluginServer",
    "PluginServerError",
    "RegistrationError",
    "ServerState",
    "__version__",
    "argument_parser",
    "default_preferred_allocation",
    "default_socket_name",
    "main",
    "resolve_device_plugin_dir",
    "run",
    "serve",
    "validate_resource_name",
]


def __getattr__(name: str) -> Any:
    # PluginMetrics imports prometheus_client; load it only when asked for.
    if name == "PluginMetrics":
        from kubedevice.plugin.metrics import PluginMetrics

        return PluginMetrics
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

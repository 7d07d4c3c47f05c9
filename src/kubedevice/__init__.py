"""kubedevice: Kubernetes device plugins in Python.

The public API for plugin authors is re-exported here (``import kubedevice``); the
kubelet emulator lives in :mod:`kubedevice.kubelet`, the conformance kit in
:mod:`kubedevice.conformance` and the generic /dev plugin in :mod:`kubedevice.generic`.
"""

from typing import TYPE_CHECKING, Any

from kubedevice.errors import (
    AllocationError as AllocationError,
)
from kubedevice.errors import (
    ConfigError as ConfigError,
)
from kubedevice.errors import (
    InvalidResourceNameError as InvalidResourceNameError,
)
from kubedevice.errors import (
    KubeDeviceError as KubeDeviceError,
)
from kubedevice.errors import (
    PluginServerError as PluginServerError,
)
from kubedevice.errors import (
    RegistrationError as RegistrationError,
)
from kubedevice.plugin import (
    DEFAULT as DEFAULT,
)
from kubedevice.plugin import (
    AllocateResult as AllocateResult,
)
from kubedevice.plugin import (
    ContainerAllocation as ContainerAllocation,
)
from kubedevice.plugin import (
    DefaultType as DefaultType,
)
from kubedevice.plugin import (
    Device as Device,
)
from kubedevice.plugin import (
    DevicePlugin as DevicePlugin,
)
from kubedevice.plugin import (
    DeviceSpec as DeviceSpec,
)
from kubedevice.plugin import (
    Health as Health,
)
from kubedevice.plugin import (
    Mount as Mount,
)
from kubedevice.plugin import (
    PluginOptions as PluginOptions,
)
from kubedevice.plugin import (
    PluginServer as PluginServer,
)
from kubedevice.plugin import (
    ServerState as ServerState,
)
from kubedevice.plugin import (
    default_preferred_allocation as default_preferred_allocation,
)
from kubedevice.plugin import (
    default_socket_name as default_socket_name,
)
from kubedevice.plugin import (
    main as main,
)
from kubedevice.plugin import (
    resolve_device_plugin_dir as resolve_device_plugin_dir,
)
from kubedevice.plugin import (
    run as run,
)
from kubedevice.plugin import (
    serve as serve,
)
from kubedevice.plugin import (
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

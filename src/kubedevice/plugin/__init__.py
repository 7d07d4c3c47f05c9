"""The device plugin SDK (plugin side): typed values, the plugin base class, the server.

Plugin authors use it through ``import kubedevice``. Nothing here imports the kubelet side
(:mod:`kubedevice.kubelet`, :mod:`kubedevice.conformance`); both share only ``_api``.
"""

from kubedevice.plugin.base import (
    DevicePlugin as DevicePlugin,
)
from kubedevice.plugin.config import (
    default_socket_name as default_socket_name,
)
from kubedevice.plugin.config import (
    resolve_device_plugin_dir as resolve_device_plugin_dir,
)
from kubedevice.plugin.config import (
    validate_resource_name as validate_resource_name,
)
from kubedevice.plugin.policy import (
    default_preferred_allocation as default_preferred_allocation,
)
from kubedevice.plugin.runner import (
    main as main,
)
from kubedevice.plugin.runner import (
    run as run,
)
from kubedevice.plugin.runner import (
    serve as serve,
)
from kubedevice.plugin.server import (
    PluginServer as PluginServer,
)
from kubedevice.plugin.server import (
    ServerState as ServerState,
)
from kubedevice.plugin.types import (
    DEFAULT as DEFAULT,
)
from kubedevice.plugin.types import (
    AllocateResult as AllocateResult,
)
from kubedevice.plugin.types import (
    ContainerAllocation as ContainerAllocation,
)
from kubedevice.plugin.types import (
    DefaultType as DefaultType,
)
from kubedevice.plugin.types import (
    Device as Device,
)
from kubedevice.plugin.types import (
    DeviceSpec as DeviceSpec,
)
from kubedevice.plugin.types import (
    Health as Health,
)
from kubedevice.plugin.types import (
    Mount as Mount,
)
from kubedevice.plugin.types import (
    PluginOptions as PluginOptions,
)

__all__ = [
    "DEFAULT",
    "AllocateResult",
    "ContainerAllocation",
    "DefaultType",
    "Device",
    "DevicePlugin",
    "DeviceSpec",
    "Health",
    "Mount",
    "PluginOptions",
    "PluginServer",
    "ServerState",
    "default_preferred_allocation",
    "default_socket_name",
    "main",
    "resolve_device_plugin_dir",
    "run",
    "serve",
    "validate_resource_name",
]

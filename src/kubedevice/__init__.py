"""kubedevice: Kubernetes device plugins in Python.

The public API for plugin authors is re-exported here (``import kubedevice``); the
kubelet emulator lives in :mod:`kubedevice.kubelet`, the conformance kit in
:mod:`kubedevice.conformance` and the generic /dev plugin in :mod:`kubedevice.generic`.
"""

from kubedevice.errors import (
    AllocationError,
    ConfigError,
    InvalidResourceNameError,
    KubeDeviceError,
    PluginServerError,
    RegistrationError,
)

__version__ = "0.1.0"

__all__ = [
    "AllocationError",
    "ConfigError",
    "InvalidResourceNameError",
    "KubeDeviceError",
    "PluginServerError",
    "RegistrationError",
    "__version__",
]

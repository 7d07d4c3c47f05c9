"""The one exception tree of kubedevice; every error the package raises on purpose is here.

::

    KubeDeviceError
    ├── ConfigError                  bad configuration or argument (permanent, never retried)
    │   └── InvalidResourceNameError a resource name the kubelet would reject (contract.md)
    ├── RegistrationError            Register with the kubelet failed (retryable)
    ├── PluginServerError            a plugin's gRPC server could not bind/serve
    ├── AllocationError              an Allocate / GetPreferredAllocation request is invalid
    ├── EmulatorError                the kubelet emulator failed or refused an operation
    │   ├── AdmissionError           a pod was rejected at admission (carries the reason)
    │   ├── CheckpointError          a checkpoint file is corrupt or foreign
    │   ├── ManifestError            a pod manifest is malformed or fails API validation
    │   └── PluginRpcError           an RPC the emulator issued to a plugin failed
    ├── NvmlError                    an NVML call failed (GPU plugin; NotSupported is not one)
    ├── ConformanceFailure           a conformance run found a MUST failure
    ├── ClaimError                   a DRA claim cannot be prepared (its text goes to the kubelet)
    │   └── DeviceHeldError          its device is prepared for another claim on the node
    ├── KubeApiError                 the Kubernetes API server refused a DRA driver's call
    ├── InstanceLockError            another instance of the DRA driver runs on this node
    └── AdvertiseError               the API server refused a node-status patch or was unreachable

Library code raises these and never exits the process; only the CLI maps them to exit
codes. Third-party errors are chained with ``raise ... from``.
"""

from __future__ import annotations

__all__ = [
    "AdmissionError",
    "AdvertiseError",
    "AllocationError",
    "CheckpointError",
    "ClaimError",
    "ConfigError",
    "ConformanceFailure",
    "DeviceHeldError",
    "EmulatorError",
    "InstanceLockError",
    "InvalidResourceNameError",
    "KubeApiError",
    "KubeDeviceError",
    "ManifestError",
    "NvmlError",
    "PluginRpcError",
    "PluginServerError",
    "RegistrationError",
]


class KubeDeviceError(Exception):
    """Base class of every error kubedevice raises on purpose."""


class ConfigError(KubeDeviceError):
    """A configuration file, option or argument is invalid. Permanent: never retried."""


class InvalidResourceNameError(ConfigError):
    """A resource name the kubelet would reject (contract.md#resource-names)."""

    def __init__(self, name: str, reason: str) -> None:
        self.name = name
        self.reason = reason
        super().__init__(f"invalid resource name {name!r}: {reason}")


class RegistrationError(KubeDeviceError):
    """Registering with the kubelet failed; usually retried with backoff."""


class PluginServerError(KubeDeviceError):
    """A plugin's gRPC server could not be started or served."""


class AllocationError(KubeDeviceError):
    """An allocation request names unknown, unhealthy or duplicate devices, or is empty."""

    def __init__(self, message: str, device_ids: tuple[str, ...] = ()) -> None:
        self.device_ids = device_ids
        super().__init__(message)


class EmulatorError(KubeDeviceError):
    """The kubelet emulator failed or refused an operation."""


class AdmissionError(EmulatorError):
    """A pod was rejected at admission, with the kubelet's reason and message."""

    def __init__(self, reason: str, message: str) -> None:
        self.reason = reason
        self.message = message
        super().__init__(f"{reason}: {message}")


class CheckpointError(EmulatorError):
    """A checkpoint file could not be read: corrupt, bad checksum, or foreign."""


class ManifestError(EmulatorError):
    """A pod manifest is malformed, or the API server's validation would refuse it."""


class PluginRpcError(EmulatorError):
    """An RPC the emulator issued to a plugin failed; carries the gRPC status.

    ``code`` is the gRPC status name (e.g. ``"INVALID_ARGUMENT"``), ``details`` its text.
    """

    def __init__(self, rpc: str, resource: str, code: str, details: str) -> None:
        self.rpc = rpc
        self.resource = resource
        self.code = code
        self.details = details
        super().__init__(f"{rpc} on {resource}: {code}: {details}")


class ConformanceFailure(KubeDeviceError):
    """A conformance run found at least one MUST failure."""


class ClaimError(KubeDeviceError):
    """A DRA claim cannot be prepared or unprepared; the text is that claim's ``error``."""


class DeviceHeldError(ClaimError):
    """A device of a DRA claim is prepared for another claim on this node.

    ``holder`` is that claim's UID, ``device`` the device's name.
    """

    def __init__(self, message: str, holder: str, device: str) -> None:
        self.holder = holder
        self.device = device
        super().__init__(message)


class KubeApiError(KubeDeviceError):
    """The Kubernetes API server refused a DRA driver's request or was unreachable.

    ``status`` is the HTTP status (0 when the server was not reached).
    """

    def __init__(self, message: str, status: int = 0) -> None:
        self.status = status
        super().__init__(message)


class InstanceLockError(KubeDeviceError):
    """Another instance of the same DRA driver holds the node's lock file: this one must
    not serve (the two would take each other's sockets and overwrite one checkpoint)."""


class NvmlError(KubeDeviceError):
    """An NVML call failed (other than NotSupported, which is never an error).

    ``code`` is NVML's error name without prefix (``"GpuIsLost"``, ``"DriverNotLoaded"``,
    ``"LibraryNotFound"``, ``"Unknown"`` ...); ``uuid`` the GPU concerned, if one is.
    """

    def __init__(self, code: str, message: str, uuid: str | None = None) -> None:
        self.code = code
        self.uuid = uuid
        super().__init__(f"NVML {code}: {message}" + (f" (GPU {uuid})" if uuid else ""))


class AdvertiseError(KubeDeviceError):
    """The API server refused a node-status patch (401, 403, 404, 409...) or was unreachable."""

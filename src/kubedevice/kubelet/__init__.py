"""Kubelet device-manager emulator (kubelet side); imports nothing from ``kubedevice.plugin``.

Public API: ``Emulator`` (async context manager) and the value/event types it returns.
Modules mirror the kubelet's split: ``registration`` (Registration server), ``endpoint``
(per-plugin connection), ``manager`` (device sets, capacity, grace period), ``admission``
(pod admission + device choice), ``pods`` (manifest parsing and API validation),
``runtime`` (merged container view), ``podresources``, ``checkpoint``, ``control`` (control
socket for the CLI) and ``emulator`` (the façade).
"""

from kubedevice.kubelet.emulator import Emulator
from kubedevice.kubelet.endpoint import DeviceStream, PluginEndpoint
from kubedevice.kubelet.events import EventLog
from kubedevice.kubelet.types import (
    AdmissionEvent,
    AllocateResult,
    ContainerAllocation,
    ContainerStatus,
    DeviceSpec,
    DeviceStatus,
    EmulatorEvent,
    KubeletStartedEvent,
    ListAndWatchEvent,
    Mount,
    NodeStatus,
    PluginOptions,
    PodStatus,
    ReadmissionEvent,
    RegistrationEvent,
    ResourceRemovedEvent,
    ResourceStatus,
    RpcEvent,
    RuntimeView,
    StreamEndEvent,
)

__all__ = [
    "AdmissionEvent",
    "AllocateResult",
    "ContainerAllocation",
    "ContainerStatus",
    "DeviceSpec",
    "DeviceStatus",
    "DeviceStream",
    "Emulator",
    "EmulatorEvent",
    "EventLog",
    "KubeletStartedEvent",
    "ListAndWatchEvent",
    "Mount",
    "NodeStatus",
    "PluginEndpoint",
    "PluginOptions",
    "PodStatus",
    "ReadmissionEvent",
    "RegistrationEvent",
    "ResourceRemovedEvent",
    "ResourceStatus",
    "RpcEvent",
    "RuntimeView",
    "StreamEndEvent",
]

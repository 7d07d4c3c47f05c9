"""Public, immutable value types of the kubelet emulator (no protobuf type ever leaks out).

Everything the emulator returns to callers (node status, pod status, typed RPC results,
event records) is a frozen dataclass defined here, with a ``to_dict()`` for JSON output.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "AdmissionEvent",
    "AllocateResult",
    "ContainerAllocation",
    "ContainerStatus",
    "DeviceSpec",
    "DeviceStatus",
    "EmulatorEvent",
    "KubeletStartedEvent",
    "ListAndWatchEvent",
    "Mount",
    "NodeStatus",
    "PluginOptions",
    "PodStatus",
    "ReadmissionEvent",
    "RegistrationEvent",
    "ResourceRemovedEvent",
    "ResourceStatus",
    "RpcEvent",
    "RuntimeView",
    "StreamEndEvent",
    "to_jsonable",
]


_SCALARS = (str, int, float, bool, type(None))
#: Per type: its dataclass field names, or None for a type that is not a dataclass (the
#: node status of 200 resources is converted on every ``kubedevice node`` and every poll of
#: it; ``dataclasses.fields`` on each value took most of that).
_FIELD_NAMES: dict[type, tuple[str, ...] | None] = {}


def _field_names(value: Any) -> tuple[str, ...] | None:
    cls = type(value)
    try:
        return _FIELD_NAMES[cls]
    except KeyError:
        pass
    names = (
        tuple(f.name for f in dataclasses.fields(value))
        if dataclasses.is_dataclass(value) and not isinstance(value, type)
        else None
    )
    _FIELD_NAMES[cls] = names
    return names


def to_jsonable(value: Any) -> Any:
    """Convert (nested) dataclasses, tuples and dicts into JSON-ready values."""
    if type(value) in _SCALARS:
        return value
    names = _field_names(value)
    if names is not None:
        out = {name: to_jsonable(getattr(value, name)) for name in names}
        kind = getattr(value, "kind", None)
        if isinstance(kind, str):
            out["kind"] = kind
        return out
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | frozenset | set):
        return [to_jsonable(v) for v in value]
    return value


class _Jsonable:
    def to_dict(self) -> dict[str, Any]:
        """This value as plain JSON-ready data."""
        out = to_jsonable(self)
        assert isinstance(out, dict)
        return out


@dataclass(frozen=True, slots=True)
class PluginOptions(_Jsonable):
    """The plugin's answer to GetDevicePluginOptions."""

    pre_start_required: bool = False
    get_preferred_allocation_available: bool = False


@dataclass(frozen=True, slots=True)
class DeviceStatus(_Jsonable):
    """One device as the last ListAndWatch message reported it."""

    id: str
    health: str
    numa: tuple[int, ...] = ()

    @property
    def healthy(self) -> bool:
        """True only for the exact string ``Healthy`` (contract.md#listandwatch)."""
        return self.health == "Healthy"


@dataclass(frozen=True, slots=True)
class ResourceStatus(_Jsonable):
    """One extended resource on the emulated node.

    ``capacity`` counts every device of the last message, ``allocatable`` the healthy ones
    (0 while the plugin is disconnected). ``allocated`` is the number of devices held by
    admitted pods. ``connected`` is False for a stopped endpoint (stream ended, or known only
    from the checkpoint); ``stopped_for_s`` says since when.
    """

    name: str
    capacity: int
    allocatable: int
    allocated: int
    connected: bool
    endpoint: str | None
    devices: tuple[DeviceStatus, ...]
    options: PluginOptions
    stopped_for_s: float | None = None


@dataclass(frozen=True, slots=True)
class NodeStatus(_Jsonable):
    """All resources of the emulated node, keyed by resource name."""

    resources: dict[str, ResourceStatus]
    numa_nodes: tuple[int, ...] = ()

    def capacity(self) -> dict[str, int]:
        """``{resource: capacity}`` like ``node.status.capacity``."""
        return {n: r.capacity for n, r in self.resources.items()}

    def allocatable(self) -> dict[str, int]:
        """``{resource: allocatable}`` like ``node.status.allocatable``."""
        return {n: r.allocatable for n, r in self.resources.items()}


@dataclass(frozen=True, slots=True)
class Mount(_Jsonable):
    """A host bind mount from an Allocate response."""

    container_path: str
    host_path: str
    read_only: bool = False


@dataclass(frozen=True, slots=True)
class DeviceSpec(_Jsonable):
    """A device node from an Allocate response."""

    container_path: str
    host_path: str
    permissions: str = ""


@dataclass(frozen=True, slots=True)
class ContainerAllocation(_Jsonable):
    """One ContainerAllocateResponse, typed."""

    envs: dict[str, str] = field(default_factory=dict)
    mounts: tuple[Mount, ...] = ()
    devices: tuple[DeviceSpec, ...] = ()
    annotations: dict[str, str] = field(default_factory=dict)
    cdi_devices: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class AllocateResult(_Jsonable):
    """A whole AllocateResponse: one element per container response the plugin sent."""

    containers: tuple[ContainerAllocation, ...]


@dataclass(frozen=True, slots=True)
class RuntimeView(_Jsonable):
    """What the container runtime would get for one container (contract.md#container-view).

    ``conflicts`` holds one line per conflict, worded like the kubelet's log lines.
    """

    envs: dict[str, str] = field(default_factory=dict)
    mounts: tuple[Mount, ...] = ()
    devices: tuple[DeviceSpec, ...] = ()
    annotations: dict[str, str] = field(default_factory=dict)
    cdi_devices: tuple[str, ...] = ()
    conflicts: tuple[str, ...] = ()


ContainerKind = Literal["init", "sidecar", "app"]


@dataclass(frozen=True, slots=True)
class ContainerStatus(_Jsonable):
    """One container of an admitted pod: its devices per resource and its runtime view.

    ``started`` is False when a PreStartContainer call failed (``start_error`` says why).
    """

    name: str
    kind: ContainerKind
    devices: dict[str, tuple[str, ...]]
    runtime: RuntimeView
    started: bool = True
    start_error: str | None = None


@dataclass(frozen=True, slots=True)
class PodStatus(_Jsonable):
    """An admitted pod and what each of its containers got."""

    name: str
    namespace: str
    uid: str
    containers: tuple[ContainerStatus, ...]

    def container(self, name: str) -> ContainerStatus:
        """The container called ``name`` (KeyError if absent)."""
        for c in self.containers:
            if c.name == name:
                return c
        raise KeyError(name)


# ---------------------------------------------------------------------------- events


@dataclass(frozen=True, slots=True)
class EmulatorEvent(_Jsonable):
    """Base of every event record; ``t`` is ``time.monotonic()`` when it happened."""

    t: float

    @property
    def kind(self) -> str:
        """Short name of the record type."""
        return "event"


@dataclass(frozen=True, slots=True)
class KubeletStartedEvent(EmulatorEvent):
    """kubelet.sock is served (at start and after every simulated restart)."""

    socket: str = ""
    restart: bool = False

    @property
    def kind(self) -> str:
        return "kubelet_started"


@dataclass(frozen=True, slots=True)
class ReadmissionEvent(EmulatorEvent):
    """The pods were admitted again after a (re)start; ``rejected`` names those refused."""

    kept: int = 0
    rejected: tuple[str, ...] = ()

    @property
    def kind(self) -> str:
        return "readmission"


@dataclass(frozen=True, slots=True)
class RegistrationEvent(EmulatorEvent):
    """One Register call: the request fields and what the emulator answered."""

    version: str = ""
    endpoint: str = ""
    resource: str = ""
    request_options: PluginOptions = PluginOptions()
    dialed: bool = False
    options: PluginOptions | None = None
    error: str | None = None

    @property
    def kind(self) -> str:
        return "registration"

    @property
    def ok(self) -> bool:
        """True when Register returned Empty."""
        return self.error is None


@dataclass(frozen=True, slots=True)
class ListAndWatchEvent(EmulatorEvent):
    """One ListAndWatch message received by the reader of ``socket``."""

    resource: str = ""
    socket: str = ""
    devices: int = 0
    healthy: int = 0

    @property
    def kind(self) -> str:
        return "list_and_watch"


@dataclass(frozen=True, slots=True)
class StreamEndEvent(EmulatorEvent):
    """A reader's ListAndWatch stream ended; ``disconnected`` says whether the resource dropped."""

    resource: str = ""
    socket: str = ""
    reason: str = ""
    disconnected: bool = False

    @property
    def kind(self) -> str:
        return "stream_end"


@dataclass(frozen=True, slots=True)
class RpcEvent(EmulatorEvent):
    """An RPC the emulator issued to a plugin (``error`` is None on success)."""

    rpc: str = ""
    resource: str = ""
    error: str | None = None
    duration_s: float = 0.0

    @property
    def kind(self) -> str:
        return "rpc"


@dataclass(frozen=True, slots=True)
class ResourceRemovedEvent(EmulatorEvent):
    """A stopped resource was removed after the grace period."""

    resource: str = ""

    @property
    def kind(self) -> str:
        return "resource_removed"


@dataclass(frozen=True, slots=True)
class AdmissionEvent(EmulatorEvent):
    """A pod was admitted (``reason`` None) or rejected."""

    pod: str = ""
    namespace: str = ""
    reason: str | None = None
    message: str | None = None

    @property
    def kind(self) -> str:
        return "admission"

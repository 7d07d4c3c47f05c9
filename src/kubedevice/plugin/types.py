"""Typed values a plugin author works with: devices, their container artefacts, options.

Plain frozen dataclasses and enums; no gRPC or protobuf type appears here (conversion to
the wire happens in :mod:`kubedevice.plugin._convert`). Imports nothing from the kubelet side.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Final, TypeAlias

from kubedevice.errors import ConfigError

__all__ = [
    "DEFAULT",
    "MAX_DEVICE_ID_LENGTH",
    "MAX_NUMA_NODE",
    "AllocateResult",
    "ContainerAllocation",
    "DefaultType",
    "Device",
    "DeviceSpec",
    "Health",
    "Mount",
    "PluginOptions",
    "checked_snapshot",
]

#: Documented maximum length of a device ID (v1beta1 proto comment); enforced plugin-side.
MAX_DEVICE_ID_LENGTH: Final = 63

#: Largest NUMA node ID the wire can carry (``TopologyInfo`` node IDs are int64).
MAX_NUMA_NODE: Final = 2**63 - 1

_EMPTY: Final[Mapping[str, str]] = MappingProxyType({})


def _empty() -> Mapping[str, str]:
    return _EMPTY


class Health(enum.StrEnum):
    """Health of a device, with the exact strings the kubelet compares against."""

    HEALTHY = "Healthy"
    UNHEALTHY = "Unhealthy"


class DefaultType(enum.Enum):
    """Type of :data:`DEFAULT`; use ``kubedevice.DEFAULT`` itself, never this class."""

    DEFAULT = "DEFAULT"

    def __repr__(self) -> str:
        return "kubedevice.DEFAULT"


#: Returned by :meth:`DevicePlugin.allocate` to ask for the default response, built from
#: the devices' declared device nodes, mounts, envs, annotations and CDI names.
DEFAULT: Final = DefaultType.DEFAULT


def _frozen_map(value: Mapping[str, str], what: str) -> Mapping[str, str]:
    if not value:
        return _EMPTY
    for key, item in value.items():
        if not isinstance(key, str) or not isinstance(item, str):
            raise ConfigError(f"{what} must map str to str, got {key!r}: {item!r}")
    return MappingProxyType(dict(value))


def _map_key(value: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(value.items()))


@dataclass(frozen=True, slots=True)
class DeviceSpec:
    """A device node to create in the container.

    Attributes:
        container_path: Path of the node inside the container.
        host_path: Path of the node on the host.
        permissions: cgroup permissions, any non-empty combination of ``r``, ``w``, ``m``.
    """

    container_path: str
    host_path: str
    permissions: str = "rw"

    def __post_init__(self) -> None:
        if not self.container_path or not self.host_path:
            raise ConfigError(f"DeviceSpec needs container_path and host_path: {self!r}")
        if not self.permissions or set(self.permissions) - set("rwm"):
            raise ConfigError(
                f"DeviceSpec permissions must be a combination of 'r', 'w', 'm', "
                f"got {self.permissions!r}"
            )


@dataclass(frozen=True, slots=True)
class Mount:
    """A host path to bind-mount into the container.

    Attributes:
        container_path: Mount point inside the container.
        host_path: Source path on the host.
        read_only: Mount read-only.
    """

    container_path: str
    host_path: str
    read_only: bool = False

    def __post_init__(self) -> None:
        if not self.container_path or not self.host_path:
            raise ConfigError(f"Mount needs container_path and host_path: {self!r}")


@dataclass(frozen=True, slots=True)
class Device:
    """One schedulable device and what a container that gets it needs.

    Sequences are stored as tuples and mappings as read-only mappings, so a ``Device``
    can be shared freely between snapshots.

    Attributes:
        id: Unique ID within the resource (1 to 63 characters).
        health: :class:`Health` (a plain ``"Healthy"``/``"Unhealthy"`` string is accepted).
        numa_nodes: NUMA nodes the device is attached to; empty means no topology.
        device_specs: Device nodes the default allocation adds.
        mounts: Mounts the default allocation adds.
        envs: Environment variables the default allocation adds.
        annotations: CRI annotations the default allocation adds.
        cdi_devices: Fully qualified CDI device names the default allocation adds.
    """

    id: str
    health: Health = Health.HEALTHY
    numa_nodes: tuple[int, ...] = ()
    device_specs: tuple[DeviceSpec, ...] = ()
    mounts: tuple[Mount, ...] = ()
    envs: Mapping[str, str] = field(default_factory=_empty)
    annotations: Mapping[str, str] = field(default_factory=_empty)
    cdi_devices: tuple[str, ...] = ()

    if TYPE_CHECKING:
        # What the constructor accepts (any sequence, a health string); the attributes
        # are always the frozen forms declared above.
        def __init__(
            self,
            id: str,
            health: Health | str = Health.HEALTHY,
            numa_nodes: Sequence[int] = (),
            device_specs: Sequence[DeviceSpec] = (),
            mounts: Sequence[Mount] = (),
            envs: Mapping[str, str] = _EMPTY,
            annotations: Mapping[str, str] = _EMPTY,
            cdi_devices: Sequence[str] = (),
        ) -> None: ...

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id:
            raise ConfigError(f"device id must be a non-empty string, got {self.id!r}")
        if len(self.id) > MAX_DEVICE_ID_LENGTH:
            raise ConfigError(
                f"device id {self.id!r} is {len(self.id)} characters long; "
                f"the maximum is {MAX_DEVICE_ID_LENGTH}"
            )
        if type(self.health) is not Health:
            try:
                object.__setattr__(self, "health", Health(self.health))
            except ValueError:
                raise ConfigError(
                    f"device {self.id!r}: health must be 'Healthy' or 'Unhealthy', "
                    f"got {self.health!r}"
                ) from None
        if self.numa_nodes:
            if type(self.numa_nodes) is not tuple:
                object.__setattr__(self, "numa_nodes", tuple(self.numa_nodes))
            for node in self.numa_nodes:
                if not isinstance(node, int) or isinstance(node, bool):
                    raise ConfigError(f"device {self.id!r}: bad NUMA node {node!r}")
                if not 0 <= node <= MAX_NUMA_NODE:
                    shown = str(node) if node.bit_length() <= 128 else "of more than 38 digits"
                    raise ConfigError(
                        f"device {self.id!r}: NUMA node {shown} is out of range: the wire "
                        f"carries 0 to {MAX_NUMA_NODE} (int64)"
                    )
        elif type(self.numa_nodes) is not tuple:
            object.__setattr__(self, "numa_nodes", ())
        if self.device_specs or type(self.device_specs) is not tuple:
            _tuple_of(self, "device_specs", DeviceSpec)
        if self.mounts or type(self.mounts) is not tuple:
            _tuple_of(self, "mounts", Mount)
        if self.cdi_devices or type(self.cdi_devices) is not tuple:
            _tuple_of(self, "cdi_devices", str)
        if self.envs is not _EMPTY:
            object.__setattr__(self, "envs", _frozen_map(self.envs, f"device {self.id!r} envs"))
        if self.annotations is not _EMPTY:
            object.__setattr__(
                self,
                "annotations",
                _frozen_map(self.annotations, f"device {self.id!r} annotations"),
            )

    def __hash__(self) -> int:
        return hash(
            (
                self.id,
                self.health,
                self.numa_nodes,
                self.device_specs,
                self.mounts,
                _map_key(self.envs),
                _map_key(self.annotations),
                self.cdi_devices,
            )
        )

    @property
    def healthy(self) -> bool:
        """True when :attr:`health` is :attr:`Health.HEALTHY`."""
        return self.health is Health.HEALTHY


def _tuple_of(obj: object, name: str, kind: type) -> None:
    value = getattr(obj, name)
    if type(value) is not tuple:
        if isinstance(value, str):
            raise ConfigError(f"{name} must be a sequence, not a string: {value!r}")
        value = tuple(value)
        object.__setattr__(obj, name, value)
    for item in value:
        if not isinstance(item, kind):
            raise ConfigError(f"{name} items must be {kind.__name__}, got {item!r}")


def checked_snapshot(devices: Iterable[Device], resource: str = "") -> tuple[Device, ...]:
    """A full device list as a tuple, refused when it could not be served as it is.

    Args:
        devices: The complete device list.
        resource: Resource name, for the message.

    Returns:
        The devices, in order.

    Raises:
        ConfigError: It is not iterable, has an item that is not a :class:`Device`, or
            has a device ID twice (the kubelet would count the device once, and every
            Allocate of it would be ambiguous).
    """
    of = f"device list of {resource}" if resource else "device list"
    if isinstance(devices, str | bytes | Device):
        raise ConfigError(f"{of} refused: {devices!r} is not a sequence of devices")
    try:
        snapshot = tuple(devices)
    except TypeError:
        raise ConfigError(
            f"{of} refused: a {type(devices).__name__} is not a sequence of devices"
        ) from None
    seen: set[str] = set()
    for index, dev in enumerate(snapshot):
        if not isinstance(dev, Device):
            raise ConfigError(
                f"{of} refused: item {index} is a {type(dev).__name__}, not a kubedevice.Device"
            )
        if dev.id in seen:
            raise ConfigError(f"{of} refused: device ID {dev.id!r} appears twice")
        seen.add(dev.id)
    return snapshot


@dataclass(frozen=True, slots=True)
class ContainerAllocation:
    """What one container gets for its devices: the answer of an allocate hook.

    Attributes:
        envs: Environment variables.
        mounts: Host bind mounts.
        device_specs: Device nodes.
        annotations: CRI container annotations.
        cdi_devices: Fully qualified CDI device names (``vendor.com/class=name``).
    """

    envs: Mapping[str, str] = field(default_factory=_empty)
    mounts: tuple[Mount, ...] = ()
    device_specs: tuple[DeviceSpec, ...] = ()
    annotations: Mapping[str, str] = field(default_factory=_empty)
    cdi_devices: tuple[str, ...] = ()

    if TYPE_CHECKING:

        def __init__(
            self,
            envs: Mapping[str, str] = _EMPTY,
            mounts: Sequence[Mount] = (),
            device_specs: Sequence[DeviceSpec] = (),
            annotations: Mapping[str, str] = _EMPTY,
            cdi_devices: Sequence[str] = (),
        ) -> None: ...

    def __post_init__(self) -> None:
        _tuple_of(self, "mounts", Mount)
        _tuple_of(self, "device_specs", DeviceSpec)
        _tuple_of(self, "cdi_devices", str)
        if self.envs is not _EMPTY:
            object.__setattr__(self, "envs", _frozen_map(self.envs, "envs"))
        if self.annotations is not _EMPTY:
            object.__setattr__(self, "annotations", _frozen_map(self.annotations, "annotations"))

    def __hash__(self) -> int:
        return hash(
            (
                _map_key(self.envs),
                self.mounts,
                self.device_specs,
                _map_key(self.annotations),
                self.cdi_devices,
            )
        )

    @classmethod
    def merge(cls, devices: Iterable[Device]) -> ContainerAllocation:
        """The default allocation: the union of what ``devices`` declare, in order.

        Identical device nodes, mounts and CDI names appear once. When several devices set
        the same env or annotation key to different values, the values are joined with
        ``,`` in device order (the usual ``*_VISIBLE_DEVICES`` convention).

        Args:
            devices: The allocated devices, in request order.

        Returns:
            The merged allocation.
        """
        envs: dict[str, list[str]] = {}
        annotations: dict[str, list[str]] = {}
        specs: dict[DeviceSpec, None] = {}
        mounts: dict[Mount, None] = {}
        cdi: dict[str, None] = {}
        for dev in devices:
            for spec in dev.device_specs:
                specs[spec] = None
            for mount in dev.mounts:
                mounts[mount] = None
            for name in dev.cdi_devices:
                cdi[name] = None
            for target, source in ((envs, dev.envs), (annotations, dev.annotations)):
                for key, value in source.items():
                    values = target.setdefault(key, [])
                    if value not in values:
                        values.append(value)
        return cls(
            envs={k: ",".join(v) for k, v in envs.items()},
            mounts=tuple(mounts),
            device_specs=tuple(specs),
            annotations={k: ",".join(v) for k, v in annotations.items()},
            cdi_devices=tuple(cdi),
        )


@dataclass(frozen=True, slots=True)
class PluginOptions:
    """The optional RPCs a plugin advertises (``DevicePluginOptions`` on the wire).

    Attributes:
        pre_start_required: The kubelet calls ``PreStartContainer`` before each start.
        get_preferred_allocation_available: The kubelet may call ``GetPreferredAllocation``.
    """

    pre_start_required: bool = False
    get_preferred_allocation_available: bool = False


#: What an allocate hook may return: an allocation, or :data:`DEFAULT`.
AllocateResult: TypeAlias = ContainerAllocation | DefaultType

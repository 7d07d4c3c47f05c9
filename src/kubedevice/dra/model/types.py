"""The DRA device model and what the prepare hook receives and returns.

Plain frozen dataclasses, validated when built (a bad name or value is a
:class:`~kubedevice.errors.ConfigError` naming the device and field). No gRPC, protobuf or
Kubernetes client type appears here. Imports nothing from the kubelet side.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final, TypeAlias

from kubedevice.dra.model.capacity import RequestPolicy
from kubedevice.errors import ConfigError

__all__ = [
    "MAX_ATTRIBUTES_AND_CAPACITIES",
    "MAX_CONSUMPTIONS_PER_DEVICE",
    "MAX_COUNTERS",
    "MAX_DEVICE_DATA_BYTES",
    "AllocatedDevice",
    "AttributeValue",
    "Claim",
    "ClaimRef",
    "ContainerEdits",
    "CounterConsumption",
    "CounterSet",
    "Device",
    "DeviceNode",
    "Fault",
    "Health",
    "Mount",
    "OpaqueConfig",
    "PreparedClaim",
    "PreparedDevice",
    "Quantity",
    "RequestPolicy",
    "Version",
]

#: resource.k8s.io/v1: at most 32 attributes and capacities together per device.
MAX_ATTRIBUTES_AND_CAPACITIES: Final = 32
#: resource.k8s.io/v1: at most 32 counters in a counter set or in one device's consumption.
MAX_COUNTERS: Final = 32
#: ...and at most 2 counter sets a device consumes from.
MAX_CONSUMPTIONS_PER_DEVICE: Final = 2
#: At most this many bytes of :attr:`PreparedDevice.data` per device, encoded as JSON.
MAX_DEVICE_DATA_BYTES: Final = 10 * 1024

# A DNS label: the device name in a ResourceSlice (and a pool/claim-request name).
_DNS_LABEL: Final = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
# A DNS subdomain (attribute prefixes, driver names).
_DNS_SUBDOMAIN: Final = re.compile(
    r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)
# resource.k8s.io: an attribute/capacity name is a C identifier of at most 32 characters.
_C_IDENTIFIER: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,31}$")
# Semantic Versioning 2.0.0 (the grammar from semver.org), as the API server checks it.
_SEMVER: Final = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$"
)
# A Kubernetes resource.Quantity in its canonical string forms.
_QUANTITY: Final = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)(([KMGTPE]i)|[numkMGTPE]|[eE][+-]?\d+)?$")
_MAX_STRING_ATTRIBUTE: Final = 64  # resource.k8s.io/v1: a string or version attribute value
# A label name's name part and a label value (a device taint's key after "<driver>/", its value).
_LABEL_PART: Final = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9]$")
#: The kubelet keeps at most this many characters of a health message.
MAX_FAULT_MESSAGE: Final = 1024

_EMPTY: Final[Mapping[str, Any]] = MappingProxyType({})


def _empty() -> Mapping[str, Any]:
    return _EMPTY


class Health(enum.StrEnum):
    """Health of a DRA device, as the kubelet's health API names it."""

    HEALTHY = "Healthy"
    UNHEALTHY = "Unhealthy"
    UNKNOWN = "Unknown"


@dataclass(frozen=True, slots=True)
class Version:
    """A semantic-version attribute value (``version`` in a ResourceSlice), e.g. ``"12.4.0"``.

    CEL compares these with ``semver(...)``; a plain string attribute would compare as text.
    """

    value: str

    def __post_init__(self) -> None:
        if not isinstance(self.value, str) or not _SEMVER.match(self.value):
            raise ConfigError(f"version {self.value!r} is not a semantic version (like 1.2.3)")
        if len(self.value) > _MAX_STRING_ATTRIBUTE:
            raise ConfigError(f"version {self.value!r} is longer than {_MAX_STRING_ATTRIBUTE}")

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, slots=True)
class Quantity:
    """A capacity value (a Kubernetes quantity): ``Quantity("80Gi")`` or ``Quantity(8)``.

    Capacities may also be given as plain ``int`` or ``str`` in :attr:`Device.capacity`.
    """

    value: str

    def __post_init__(self) -> None:
        text = str(self.value) if isinstance(self.value, int) else self.value
        if isinstance(self.value, bool) or not isinstance(text, str) or not _QUANTITY.match(text):
            raise ConfigError(f"capacity {self.value!r} is not a Kubernetes quantity (like 80Gi)")
        object.__setattr__(self, "value", text)

    def __str__(self) -> str:
        return self.value


#: An attribute value: string, integer, boolean or semantic version.
AttributeValue: TypeAlias = str | int | bool | Version


@dataclass(frozen=True, slots=True)
class DeviceNode:
    """A device node the container gets (CDI ``deviceNodes``): ``path`` in the container."""

    path: str
    host_path: str | None = None
    permissions: str = "rw"

    def __post_init__(self) -> None:
        for name in ("path", "host_path"):
            value = getattr(self, name)
            if value is not None and not str(value).startswith("/"):
                raise ConfigError(f"device node {name} {value!r} must be an absolute path")
        if not self.permissions or set(self.permissions) - set("rwm"):
            raise ConfigError(f"device node permissions {self.permissions!r}: only r, w and m")


@dataclass(frozen=True, slots=True, init=False)
class Mount:
    """A bind mount the container gets (CDI ``mounts``), keywords only:
    ``Mount(container_path="/data", host_path="/srv/data", read_only=True)``.

    Positional arguments are refused with a :class:`TypeError`: the kit once took the host
    path first while :class:`DeviceNode` and the SDK's ``kubedevice.Mount`` take the
    container path first, so a positional call could be swapped without a word.
    """

    container_path: str
    host_path: str
    read_only: bool

    def __init__(
        self,
        *args: object,
        container_path: str | None = None,
        host_path: str | None = None,
        read_only: bool = True,
    ) -> None:
        if args or container_path is None or host_path is None:
            given = f"{len(args)} positional argument(s) given" if args else "a path missing"
            raise TypeError(
                "dra.Mount takes keyword arguments only: "
                f"Mount(container_path=..., host_path=..., read_only=...) ({given})"
            )
        object.__setattr__(self, "container_path", container_path)
        object.__setattr__(self, "host_path", host_path)
        object.__setattr__(self, "read_only", read_only)
        self.__post_init__()

    def __post_init__(self) -> None:
        for name in ("host_path", "container_path"):
            if not str(getattr(self, name)).startswith("/"):
                raise ConfigError(f"mount {name} {getattr(self, name)!r} must be absolute")


@dataclass(frozen=True, slots=True)
class ContainerEdits:
    """What a container gets for a device: env, device nodes, mounts (CDI ``containerEdits``)."""

    env: Mapping[str, str] = field(default_factory=_empty)
    device_nodes: Sequence[DeviceNode] = ()
    mounts: Sequence[Mount] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "env", MappingProxyType(dict(self.env)))
        object.__setattr__(self, "device_nodes", tuple(self.device_nodes))
        object.__setattr__(self, "mounts", tuple(self.mounts))
        for key in self.env:
            if not key or "=" in key:
                raise ConfigError(f"env name {key!r} is empty or contains '='")

    def __bool__(self) -> bool:
        return bool(self.env or self.device_nodes or self.mounts)


def _counters(what: str, counters: Mapping[str, Quantity | int | str]) -> Mapping[str, Quantity]:
    """Counter names (DNS labels) and values (quantities), checked; at most 32, at least 1."""
    if not counters:
        raise ConfigError(f"{what}: no counters (at least one is needed)")
    if len(counters) > MAX_COUNTERS:
        raise ConfigError(f"{what}: {len(counters)} counters (at most {MAX_COUNTERS})")
    out: dict[str, Quantity] = {}
    for key, value in counters.items():
        if not isinstance(key, str) or not _DNS_LABEL.match(key):
            raise ConfigError(f"{what}: counter name {key!r} is not a DNS label")
        try:
            out[key] = value if isinstance(value, Quantity) else Quantity(value)  # type: ignore[arg-type]
        except ConfigError as exc:
            raise ConfigError(f"{what}: counter {key}: {exc}") from None
    return MappingProxyType(out)


@dataclass(frozen=True, slots=True)
class CounterSet:
    """A named set of counters devices of the pool consume from (``sharedCounters``).

    The counters are not allocatable themselves: a device that consumes them is allocated
    only while every counter it names has enough left (the scheduler counts, across all
    the pool's allocated devices). Published in slices of their own.

    Args:
        name: Unique in the pool; a DNS label (``gpu-0``).
        counters: Counter name (a DNS label) -> value (a quantity); 1 to 32 of them.
    """

    name: str
    counters: Mapping[str, Quantity | int | str]

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _DNS_LABEL.match(self.name):
            raise ConfigError(f"counter set name {self.name!r} is not a DNS label")
        object.__setattr__(self, "counters", _counters(f"counter set {self.name}", self.counters))


@dataclass(frozen=True, slots=True)
class CounterConsumption:
    """What a device takes from one :class:`CounterSet` while it is allocated.

    Args:
        counter_set: The set's name.
        counters: Counter name -> amount; 1 to 32 of them, each a counter of the set.
    """

    counter_set: str
    counters: Mapping[str, Quantity | int | str]

    def __post_init__(self) -> None:
        if not isinstance(self.counter_set, str) or not _DNS_LABEL.match(self.counter_set):
            raise ConfigError(f"counter set name {self.counter_set!r} is not a DNS label")
        what = f"consumption of counter set {self.counter_set}"
        object.__setattr__(self, "counters", _counters(what, self.counters))


@dataclass(frozen=True, slots=True)
class Fault:
    """Why a device is not healthy: its taint in the ResourceSlices and its message.

    The device is published with the taint ``<driver>/<kind>`` (value ``value``), and the
    kubelet shows ``message`` in the pods' ``allocatedResourcesStatus``. ``--evict-on``
    names kinds (``xid``) or kinds with a value (``xid=79``) whose taint is ``NoExecute``.

    Args:
        kind: What went wrong, as a taint key's name part (``xid``, ``gpu-lost``,
            ``health-check``): letters, digits, ``-``, ``_``, ``.``; at most 63.
        value: Which one (``79``), a label value (same characters, at most 63), or empty.
        message: For people: ``XID 79: GPU has fallen off the bus`` (at most 1024
            characters are kept).
    """

    kind: str
    value: str = ""
    message: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.kind, str) or not _LABEL_PART.match(self.kind):
            raise ConfigError(
                f"fault kind {self.kind!r} is not a label name (letters, digits, '-', '_', "
                "'.'; at most 63; starting and ending with a letter or digit)"
            )
        if not isinstance(self.value, str) or (self.value and not _LABEL_PART.match(self.value)):
            raise ConfigError(f"fault value {self.value!r} is not a label value")
        if len(self.message) > MAX_FAULT_MESSAGE:
            object.__setattr__(self, "message", self.message[: MAX_FAULT_MESSAGE - 3] + "...")

    def __str__(self) -> str:
        return self.message or (f"{self.kind} {self.value}" if self.value else self.kind)


@dataclass(frozen=True, slots=True)
class Device:
    """One device of the driver, as published in the node's ResourceSlices.

    Args:
        name: Unique in the driver's pool on this node; a DNS label (``gpu-0``).
        attributes: Typed attributes. A bare name (``model``) is in the driver's domain
            (CEL: ``device.attributes["<driver>"].model``); a qualified one
            (``resource.kubernetes.io/pciBusID``) keeps its domain.
        capacity: Capacities as quantities (``{"memory": "80Gi"}``).
        health: A device that is not healthy is published with a ``NoSchedule`` taint
            (no new allocation unless tolerated; ``NoExecute`` for the faults the driver
            evicts on), or left out where the API server drops device taints, and reported
            on the health stream.
        edits: What a container using the device gets, unless the driver's ``prepare``
            hook says otherwise (the default hook uses these).
        fault: Why it is not healthy: the taint's key and value and the message users
            see. ``None``: the taint ``<driver>/unhealthy`` with the health as its value.
            Only for a device that is not healthy.
        consumes_counters: The counters it takes from the pool's counter sets (at most 2
            sets, one entry each) while allocated: partitions of one piece of hardware
            that exclude each other (see :meth:`Driver.counter_sets
            <kubedevice.dra.Driver.counter_sets>`).
        allow_multiple_allocations: The scheduler may give the device to several claims
            at once, each a share with its own share ID, adding up what the shares consume
            of each capacity (consumable capacity; Kubernetes 1.34+, on by default 1.36).
        request_policies: ``{capacity name: RequestPolicy}``: what one share may consume
            of that capacity (:mod:`kubedevice.dra.model.capacity`); only with
            ``allow_multiple_allocations``, checked against the API server's rules.
    """

    name: str
    attributes: Mapping[str, AttributeValue] = field(default_factory=_empty)
    capacity: Mapping[str, Quantity | int | str] = field(default_factory=_empty)
    health: Health = Health.HEALTHY
    edits: ContainerEdits = field(default_factory=ContainerEdits)
    fault: Fault | None = None
    consumes_counters: Sequence[CounterConsumption] = ()
    allow_multiple_allocations: bool = False
    request_policies: Mapping[str, RequestPolicy] = field(default_factory=_empty)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _DNS_LABEL.match(self.name):
            raise ConfigError(
                f"device name {self.name!r} is not a DNS label (lower-case a-z, 0-9, '-', "
                "at most 63)"
            )
        consumes = tuple(self.consumes_counters)
        if len(consumes) > MAX_CONSUMPTIONS_PER_DEVICE:
            raise ConfigError(
                f"device {self.name}: consumes from {len(consumes)} counter sets (at most "
                f"{MAX_CONSUMPTIONS_PER_DEVICE})"
            )
        sets = [c.counter_set for c in consumes]
        twice = sorted({n for n in sets if sets.count(n) > 1})
        if twice:
            raise ConfigError(f"device {self.name}: counter set {twice[0]} named twice")
        object.__setattr__(self, "consumes_counters", consumes)
        attributes: dict[str, AttributeValue] = {}
        for key, value in self.attributes.items():
            _check_qualified_name(self.name, "attribute", key)
            if isinstance(value, str) and len(value) > _MAX_STRING_ATTRIBUTE:
                raise ConfigError(
                    f"device {self.name}: attribute {key}: a string is at most "
                    f"{_MAX_STRING_ATTRIBUTE} characters"
                )
            is_int = isinstance(value, int) and not isinstance(value, bool)
            if is_int and not -(2**63) <= value < 2**63:  # type: ignore[operator]
                raise ConfigError(
                    f"device {self.name}: attribute {key}: {value} is not a 64-bit integer"
                )
            if not isinstance(value, str | int | bool | Version):
                raise ConfigError(
                    f"device {self.name}: attribute {key}: {type(value).__name__} is not "
                    "str, int, bool or Version"
                )
            attributes[key] = value
        capacity: dict[str, Quantity] = {}
        for key, quantity in self.capacity.items():
            _check_qualified_name(self.name, "capacity", key)
            try:
                capacity[key] = quantity if isinstance(quantity, Quantity) else Quantity(quantity)  # type: ignore[arg-type]
            except ConfigError as exc:
                raise ConfigError(f"device {self.name}: capacity {key}: {exc}") from None
        if len(attributes) + len(capacity) > MAX_ATTRIBUTES_AND_CAPACITIES:
            raise ConfigError(
                f"device {self.name}: more than {MAX_ATTRIBUTES_AND_CAPACITIES} attributes "
                "and capacities together"
            )
        object.__setattr__(self, "attributes", MappingProxyType(attributes))
        object.__setattr__(self, "capacity", MappingProxyType(capacity))
        object.__setattr__(self, "health", Health(self.health))
        if self.fault is not None:
            if not isinstance(self.fault, Fault):
                raise ConfigError(f"device {self.name}: fault must be a Fault")
            if self.health == Health.HEALTHY:
                raise ConfigError(f"device {self.name}: a Healthy device has no fault")
        self._check_policies(capacity)

    def _check_policies(self, capacity: Mapping[str, Quantity]) -> None:
        object.__setattr__(
            self, "allow_multiple_allocations", bool(self.allow_multiple_allocations)
        )
        policies = dict(self.request_policies)
        if policies and not self.allow_multiple_allocations:
            raise ConfigError(
                f"device {self.name}: capacity {next(iter(policies))}: a requestPolicy needs "
                "allow_multiple_allocations"
            )
        for key, policy in policies.items():
            if key not in capacity:
                raise ConfigError(
                    f"device {self.name}: requestPolicy for capacity {key!r}, which the "
                    "device does not have"
                )
            if not isinstance(policy, RequestPolicy):
                raise ConfigError(f"device {self.name}: capacity {key}: not a RequestPolicy")
            policy.check(self.name, key, str(capacity[key]))
        object.__setattr__(self, "request_policies", MappingProxyType(policies))


def _check_qualified_name(device: str, what: str, key: str) -> None:
    prefix, _, name = key.rpartition("/")
    if not _C_IDENTIFIER.match(name) or (prefix and not _DNS_SUBDOMAIN.match(prefix)):
        raise ConfigError(
            f"device {device}: {what} name {key!r} must be a C identifier of at most 32 "
            "characters, optionally after a DNS-subdomain prefix and '/'"
        )


@dataclass(frozen=True, slots=True)
class ClaimRef:
    """A ResourceClaim as the kubelet names it: namespace, name and UID."""

    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name} ({self.uid})"


@dataclass(frozen=True, slots=True)
class OpaqueConfig:
    """An opaque configuration for this driver from a claim's allocation.

    Args:
        parameters: The decoded JSON parameters (any JSON value; usually an object).
        requests: The claim's request names it applies to; empty means every request.
        source: ``"FromClass"`` (a DeviceClass's config) or ``"FromClaim"``.
    """

    parameters: Any
    requests: tuple[str, ...] = ()
    source: str = "FromClaim"

    def applies_to(self, request: str) -> bool:
        """Whether this config applies to ``request`` (a request or ``request/subrequest``)."""
        if not self.requests:
            return True
        return request in self.requests or request.split("/", 1)[0] in self.requests


@dataclass(frozen=True, slots=True)
class AllocatedDevice:
    """One device the scheduler allocated to a claim, for this driver and this node's pool.

    Args:
        request: The claim's request name (``gpu``, or ``gpu/subrequest``).
        pool: The pool (the node's name).
        name: The device's name in the pool.
        device: The device as the driver published it, ``None`` if it is gone now.
        configs: The opaque configs that apply to this request, in order: the classes'
            first, then the claim's; a later one overrides an earlier one.
        admin_access: The claim asked for admin access to the device.
        share_id: The share of a device with consumable capacity, if any.
        tolerations: The device taints the allocation tolerates (JSON, as in the claim's
            allocation result).
        consumed_capacity: What this share consumes of each capacity of a device that
            allows multiple allocations (``{"memory": "20Gi"}``), as the scheduler wrote
            it in the allocation (``consumedCapacity``); empty for a whole device.
    """

    request: str
    pool: str
    name: str
    device: Device | None
    configs: tuple[OpaqueConfig, ...] = ()
    admin_access: bool = False
    share_id: str | None = None
    tolerations: tuple[Mapping[str, Any], ...] = ()
    consumed_capacity: Mapping[str, str] = field(default_factory=_empty)


@dataclass(frozen=True, slots=True)
class Claim:
    """A claim to prepare: its reference, its devices for this driver, its configs.

    Args:
        ref: Namespace, name and UID.
        devices: The allocated devices for this driver and this node's pool, in the
            order of the allocation results.
        configs: Every opaque config for this driver, in order (classes' first, then
            the claim's).
        resource_claim: The ResourceClaim object as the API server returned it (JSON).
    """

    ref: ClaimRef
    devices: tuple[AllocatedDevice, ...]
    configs: tuple[OpaqueConfig, ...] = ()
    resource_claim: Mapping[str, Any] = field(default_factory=_empty)


@dataclass(frozen=True, slots=True)
class PreparedDevice:
    """The prepare hook's answer for one allocated device: what its containers get.

    Args:
        device: The allocated device (from :attr:`Claim.devices`).
        edits: Env, device nodes and mounts, written into the claim's CDI spec.
        data: The driver's own record of what it did for this device (a JSON object:
            ``str`` keys, JSON values, at most :data:`MAX_DEVICE_DATA_BYTES` encoded). The
            kit keeps it in the checkpoint with the claim and gives it back in
            :attr:`PreparedClaim.data`, to ``unprepare`` and, after a restart, to
            ``restore``.
    """

    device: AllocatedDevice
    edits: ContainerEdits = field(default_factory=ContainerEdits)
    data: Mapping[str, Any] = field(default_factory=_empty)


@dataclass(frozen=True, slots=True)
class PreparedClaim:
    """A claim the driver prepared, as kept in the checkpoint (passed to ``unprepare``).

    Args:
        ref: Namespace, name and UID.
        devices: ``(request, pool, device name)`` of each prepared device.
        cdi_ids: The CDI device IDs answered to the kubelet, per device, same order.
        share_ids: The share ID of each device (``None`` for a whole device), same order.
        data: The :attr:`PreparedDevice.data` the prepare hook gave each device (an empty
            mapping for none), same order, as read back from JSON (lists, not tuples).
        edits: The CDI ``containerEdits`` (JSON) written for each device, same order: the
            kit writes the claim's CDI spec again from them when it is gone. ``None`` where
            the checkpoint predates them; an empty mapping for a device without edits.
        admin_access: Whether each device was allocated with admin access, same order.
    """

    ref: ClaimRef
    devices: tuple[tuple[str, str, str], ...] = ()
    cdi_ids: tuple[tuple[str, ...], ...] = ()
    share_ids: tuple[str | None, ...] = ()
    data: tuple[Mapping[str, Any], ...] = ()
    edits: tuple[Mapping[str, Any] | None, ...] = ()
    admin_access: tuple[bool, ...] = ()

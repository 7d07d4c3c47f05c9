"""The GPU plugin's versioned YAML config: typed models, loading, readable errors.

Option names follow NVIDIA's k8s-device-plugin where one exists (``migStrategy``,
``failOnInitError``, ``deviceListStrategy``, ``deviceIDStrategy``, ``nvidiaDriverRoot``,
``sharing.timeSlicing``, ``sharing.mps``). Errors name the file and the field path
(``sharing.timeSlicing.resources[0].replicas``), one line each, like the generic plugin's.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any, Final, Literal

from kubedevice.errors import ConfigError
from kubedevice.plugin.configbase import AbsPath, ResourceName, describe_input, parse_model
from kubedevice.plugin.schema import Before, Check, Ge, Le, MinLen, Model, dump
from kubedevice.yamlfile import read_yaml

__all__ = [
    "DEFAULT_IGNORED_XIDS",
    "DEFAULT_XID_POLICIES",
    "GPU_RESOURCE",
    "Config",
    "DraConfig",
    "Flags",
    "HealthConfig",
    "SharedResource",
    "Sharing",
    "TimeSlicing",
    "XidPolicy",
    "load_config",
    "parse_config",
    "parse_duration",
]

XidPolicy = Literal["ignore", "reset", "quiet"]

#: The resource of whole GPUs.
GPU_RESOURCE: Final = "nvidia.com/gpu"
#: XIDs caused by the application (bad memory access, illegal instruction, a watchdog or
#: preemption of the user's own context ...): the GPU is fine, nothing is marked.
DEFAULT_IGNORED_XIDS: Final = (13, 31, 43, 45, 68, 109)
#: XIDs that leave the GPU unusable until it is reset: 79 fell off the bus, 95 uncontained
#: ECC error, 119/120 GSP firmware errors.
DEFAULT_XID_POLICIES: Final[Mapping[int, XidPolicy]] = {
    79: "reset",
    95: "reset",
    119: "reset",
    120: "reset",
}

ListStrategy = Literal["envvar", "volume-mounts", "cdi-annotations", "cdi-cri"]

_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*")
_UNITS: Final = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}
_MIG_RESOURCE = re.compile(r"nvidia\.com/mig-[0-9a-z.+-]+")


def parse_duration(value: Any) -> Any:
    """``30s``, ``500ms``, ``2m``, ``1h`` or a number of seconds -> seconds (float).

    Anything else is returned unchanged for the model's own type check to report.
    """
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float):
        try:
            return float(value)
        except OverflowError:  # an int past float's range: the model says "out of range"
            return value
    if isinstance(value, str):
        match = _DURATION.fullmatch(value)
        if match is None:
            raise ValueError(f"expected a duration such as '30s', '500ms' or '2m' (got {value!r})")
        return float(match.group(1)) * _UNITS[match.group(2)]
    return value


Duration = Annotated[float, Before(parse_duration)]

#: The shortest health timer accepted: a shorter one would keep a core busy probing a GPU.
MIN_HEALTH_INTERVAL: Final = 0.01


def _list_strategy(value: Any) -> Any:
    return [value] if isinstance(value, str) else value


def _unique_strategies(value: list[str]) -> list[str]:
    if len(set(value)) != len(value):
        raise ValueError(f"lists a strategy twice (got {value!r})")
    return value


def _annotation_prefix(value: str) -> str:
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?/", value):
        raise ValueError(f"must be a DNS subdomain followed by '/' (got {describe_input(value)})")
    return value


def _gpu_or_mig(value: str) -> str:
    if value != GPU_RESOURCE and not _MIG_RESOURCE.fullmatch(value):
        raise ValueError(
            f"must be {GPU_RESOURCE} or nvidia.com/mig-<profile> (got {describe_input(value)})"
        )
    return value


@dataclass(frozen=True, kw_only=True)
class Flags(Model):
    """How devices are named, listed and found (NVIDIA plugin names where they exist)."""

    mig_strategy: Literal["none", "single", "mixed"] = "none"
    fail_on_init_error: bool = True
    device_list_strategy: Annotated[
        list[ListStrategy], Before(_list_strategy), MinLen(1), Check(_unique_strategies)
    ] = field(default_factory=lambda: ["envvar"])
    device_id_strategy: Literal["uuid", "index"] = field(
        default="uuid", metadata={"alias": "deviceIDStrategy"}
    )
    #: Where the device plugin's MPS control daemons keep their pipe and log directories
    #: (``sharing.mps``; on the host, mounted at the same path).
    mps_root: AbsPath = "/run/nvidia/mps"
    #: Where the driver's files are, as this process sees them (``/`` on the host,
    #: ``/driver-root`` when the host's root is mounted there).
    nvidia_driver_root: AbsPath = "/"
    #: The same directory on the host, for the paths written into CDI specs
    #: (``None``: the same as ``nvidiaDriverRoot``).
    host_driver_root: AbsPath | None = None
    #: The host's cgroup file systems as this process sees them (``/sys/fs/cgroup`` on the
    #: host, a hostPath of it in a container): MPS control daemons are moved into a cgroup
    #: of their own there, so they outlive this process's container (``None``: they stay in
    #: its cgroup and end with it).
    host_cgroup_root: AbsPath | None = None
    dev_root: AbsPath = "/dev"
    sys_root: AbsPath = "/sys"
    cdi_dir: AbsPath = "/var/run/cdi"
    cdi_annotation_prefix: Annotated[str, Check(_annotation_prefix)] = "cdi.k8s.io/"
    features_dir: AbsPath | None = "/etc/kubernetes/node-feature-discovery/features.d"
    pod_resources_socket: AbsPath = "/var/lib/kubelet/pod-resources/kubelet.sock"

    @property
    def cdi_enabled(self) -> bool:
        """Whether a CDI spec is needed (a CDI list strategy is used)."""
        return any(s.startswith("cdi-") for s in self.device_list_strategy)

    @property
    def effective_host_driver_root(self) -> str:
        """``hostDriverRoot``, or ``nvidiaDriverRoot`` when not set."""
        return self.host_driver_root or self.nvidia_driver_root


def _xids(value: dict[int, str]) -> dict[int, str]:
    for xid in value:
        if xid < 0:
            raise ValueError(f"XID {describe_input(xid)} must be >= 0")
    return value


_FAULT: Final = re.compile(
    r"^all$|^([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9](=([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$"
)


def _faults(value: list[str]) -> list[str]:
    for entry in value:
        if not _FAULT.match(entry):
            raise ValueError(
                f"{describe_input(entry)} is not a fault: xid, xid=79, gpu-lost, unhealthy or all"
            )
    return value


@dataclass(frozen=True, kw_only=True)
class HealthConfig(Model):
    """What NVML health events do to a GPU (see docs/nvidia.md, "Health")."""

    disabled: bool = False
    ignored_xids: list[Annotated[int, Ge(0)]] = field(
        default_factory=lambda: list(DEFAULT_IGNORED_XIDS)
    )
    #: Per-XID policy; XIDs not listed here nor ignored get ``defaultPolicy``.
    xid_policies: Annotated[dict[int, XidPolicy], Check(_xids)] = field(
        default_factory=lambda: dict(DEFAULT_XID_POLICIES)
    )
    default_policy: XidPolicy = "quiet"
    #: Double-bit (uncorrectable) ECC errors.
    double_bit_ecc_policy: XidPolicy = "quiet"
    #: How long a GPU must stay free of events before it is probed and made Healthy again.
    quiet_period: Annotated[Duration, Ge(MIN_HEALTH_INTERVAL), Le(86400.0)] = 30.0
    #: How often a GPU waiting for a reset is probed for having come back.
    reset_check_interval: Annotated[Duration, Ge(MIN_HEALTH_INTERVAL), Le(86400.0)] = 30.0
    #: The DRA driver: faults whose device taint is NoExecute (``xid``, ``xid=79``,
    #: ``gpu-lost``, ``ecc``, ``all``), so the pods using the GPU are evicted.
    evict_on: Annotated[list[str], Check(_faults)] = field(default_factory=list)

    def policy_for_xid(self, xid: int) -> XidPolicy:
        """The policy of one XID code (an explicit policy wins over the ignored list)."""
        if xid in self.xid_policies:
            return self.xid_policies[xid]
        if xid in self.ignored_xids:
            return "ignore"
        return self.default_policy


@dataclass(frozen=True, kw_only=True)
class SharedResource(Model):
    """One resource shared by time-slicing: each device is offered ``replicas`` times."""

    name: Annotated[ResourceName, Check(_gpu_or_mig)]
    replicas: Annotated[int, Ge(2), Le(1024)]
    #: Advertise the replicas under this name instead (``renameByDefault`` adds ``.shared``).
    rename: ResourceName | None = None


@dataclass(frozen=True, kw_only=True)
class TimeSlicing(Model):
    """Time-slicing: several containers share a GPU, with no isolation between them."""

    rename_by_default: bool = False
    fail_requests_greater_than_one: bool = False
    resources: list[SharedResource] = field(default_factory=list)

    def check(self) -> None:
        seen: set[str] = set()
        for i, res in enumerate(self.resources):
            if res.name in seen:
                raise ValueError(f"resources[{i}].name: listed twice ({res.name!r})")
            seen.add(res.name)

    def replicas_of(self, resource: str) -> int:
        """How many replicas each device of ``resource`` is offered as (1 = not shared)."""
        return next((r.replicas for r in self.resources if r.name == resource), 1)

    def advertised_name(self, resource: str) -> str:
        """The name ``resource`` is advertised under (renamed when shared and asked to)."""
        for res in self.resources:
            if res.name == resource:
                if res.rename is not None:
                    return res.rename
                return f"{resource}.shared" if self.rename_by_default else resource
        return resource


_MEMORY_STEP: Final = re.compile(r"^([1-9][0-9]{0,6})(Mi|Gi)$")


def _memory_step(value: str) -> str:
    if not _MEMORY_STEP.match(value):
        raise ValueError(
            f"must be a size in Mi or Gi, like 1Gi or 512Mi (got {describe_input(value)})"
        )
    return value


@dataclass(frozen=True, kw_only=True)
class MemoryShares(Model):
    """The DRA driver only: whole GPUs shared by memory (consumable capacity).

    Each GPU allows multiple allocations and a claim asks for some of its ``memory``
    (``capacity.requests.memory``), rounded up to whole ``step``s; the scheduler never
    gives out more than the GPU has. Accounted and advised (env), not enforced.
    """

    enabled: bool = False
    #: The least a share is, and what it grows by.
    step: Annotated[str, Check(_memory_step)] = "1Gi"

    @property
    def step_bytes(self) -> int:
        """``step`` in bytes."""
        match = _MEMORY_STEP.match(self.step)
        assert match is not None  # checked when parsed
        return int(match.group(1)) << (30 if match.group(2) == "Gi" else 20)


@dataclass(frozen=True, kw_only=True)
class Sharing(Model):
    """How GPUs are shared between containers: time slices, or MPS (NVIDIA's shape for
    both: ``resources[{name, replicas}]``, ``renameByDefault``,
    ``failRequestsGreaterThanOne``). With ``mps`` each replica of a GPU is limited to
    ``memory / replicas`` and ``100 / replicas`` percent of its SMs by the GPU's MPS
    control daemon, which the plugin runs."""

    time_slicing: TimeSlicing = field(default_factory=TimeSlicing)
    mps: TimeSlicing = field(default_factory=TimeSlicing)

    def check(self) -> None:
        if self.time_slicing.resources and self.mps.resources:
            raise ValueError("timeSlicing and mps: use one of them, not both")
        for i, res in enumerate(self.mps.resources):
            if res.name != GPU_RESOURCE:
                raise ValueError(
                    f"mps.resources[{i}].name: MPS shares whole GPUs only ({GPU_RESOURCE}), "
                    f"not {res.name}"
                )

    @property
    def active(self) -> TimeSlicing:
        """The sharing in force: ``mps`` when it lists resources, else ``timeSlicing``."""
        return self.mps if self.mps.resources else self.time_slicing

    @property
    def key(self) -> str:
        """The config key of the sharing in force (for messages)."""
        return "sharing.mps" if self.mps.resources else "sharing.timeSlicing"

    @property
    def strategy(self) -> str:
        """NVIDIA's label value: ``mps``, ``time-slicing``, or ``none``."""
        if self.mps.resources:
            return "mps"
        return "time-slicing" if self.time_slicing.resources else "none"


@dataclass(frozen=True, kw_only=True)
class DraConfig(Model):
    """What only the DRA driver (``kubedevice nvidia dra``) reads."""

    #: MIG on demand: each MIG-mode GPU is published whole plus every placement of every
    #: MIG profile, all consuming the GPU's counters; a MIG device is made when a claim
    #: is prepared and destroyed when it is unprepared (``--mig-on-demand``).
    mig_on_demand: bool = False
    #: MIG on demand: the profiles offered (``[1g.10gb, 3g.40gb]``); empty: every profile
    #: NVML reports (26 devices per H100). Fewer devices per node for the scheduler to weigh.
    mig_on_demand_profiles: list[str] = field(default_factory=list)
    #: Whole GPUs shared by memory (consumable capacity): see :class:`MemoryShares`.
    memory_shares: MemoryShares = field(default_factory=MemoryShares)
    #: Memory shares enforced by MPS: a control daemon per GPU with shares, each share's
    #: processes its clients, limited to the memory (and ``compute``) the scheduler
    #: counted (``--mps``; turns ``memoryShares`` on).
    mps: bool = False


@dataclass(frozen=True, kw_only=True)
class Config(Model):
    """The whole config file (``version: v1``)."""

    version: Literal["v1"]
    flags: Flags = field(default_factory=Flags)
    health: HealthConfig = field(default_factory=HealthConfig)
    sharing: Sharing = field(default_factory=Sharing)
    dra: DraConfig = field(default_factory=DraConfig)

    def with_memory_shares(self) -> Config:
        """A copy with ``dra.memoryShares.enabled`` on (``--memory-shares``)."""
        shares = replace(self.dra.memory_shares, enabled=True)
        return replace(self, dra=replace(self.dra, memory_shares=shares))

    def with_mps(self) -> Config:
        """A copy with ``dra.mps`` and ``dra.memoryShares.enabled`` on (``--mps``)."""
        shared = self.with_memory_shares()
        return replace(shared, dra=replace(shared.dra, mps=True))

    def with_overrides(self, **flags: str | None) -> Config:
        """A copy with the given flags replaced (CLI options; ``None`` values are ignored).

        Keys are the Python field names of :class:`Flags` (``dev_root``, ``cdi_dir`` ...);
        relative paths are made absolute; ``""`` switches ``features_dir`` off.
        """
        update: dict[str, Any] = {k: v for k, v in flags.items() if v is not None}
        if not update:
            return self
        for key, value in update.items():
            if key in _OPTIONAL_PATHS and value == "":
                update[key] = None  # '' switches an optional file off (no labels ...)
            elif key in _PATHS and value:
                update[key] = str(Path(value).absolute())
        new = parse_model(Flags, dump(replace(self.flags, **update)), "<command line>")
        return replace(self, flags=new)


_OPTIONAL_PATHS: Final = frozenset({"features_dir", "host_driver_root", "host_cgroup_root"})
_PATHS: Final = frozenset(
    {
        "dev_root",
        "sys_root",
        "nvidia_driver_root",
        "host_driver_root",
        "host_cgroup_root",
        "cdi_dir",
        "features_dir",
        "pod_resources_socket",
    }
)


def parse_config(data: Any, source: str = "<config>") -> Config:
    """Validate already-parsed YAML ``data``.

    Raises:
        ConfigError: One line per problem, naming ``source`` and the field.
    """
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: (top level): expected a mapping")
    version = data.get("version")
    if "version" in data and version != "v1":
        raise ConfigError(f"{source}: version: unsupported version {version!r} (supported: 'v1')")
    return parse_model(Config, data, source)


def load_config(path: str | Path | None) -> Config:
    """Read and validate the YAML file at ``path``; ``None`` gives the defaults.

    Raises:
        ConfigError: The file cannot be read or is invalid; the message names the field.
    """
    if path is None:
        return Config(version="v1")
    data = read_yaml(path)
    if data is None:
        raise ConfigError(f"{path}: (top level): empty file; expected at least 'version: v1'")
    return parse_config(data, str(path))

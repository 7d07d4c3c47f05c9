"""The generic plugin's YAML config: typed models, loading, and readable errors.

Every error names the file, the field path (``resources[0].groups[1].count``) and what was
expected. Models are frozen and refuse unknown keys; YAML keys are camelCase.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Literal

from kubedevice._api import KUBELET_MAX_RECV_MESSAGE_BYTES
from kubedevice.errors import ConfigError
from kubedevice.generic.templates import (
    CDI_VARIABLES,
    CHECK_VARIABLES,
    ENV_VARIABLES,
    Template,
    TemplateError,
)
from kubedevice.plugin import default_socket_name
from kubedevice.plugin.configbase import (
    AbsPath,
    ResourceName,
    absolute_path,
    describe_input,
    parse_model,
)
from kubedevice.plugin.schema import Check, Ge, Gt, Le, MinLen, Model
from kubedevice.yamlfile import read_yaml

__all__ = [
    "CommandCheck",
    "Config",
    "GroupSpec",
    "HealthSpec",
    "MountSpec",
    "PathSpec",
    "ResourceSpec",
    "SysfsAttributeCheck",
    "UsbMatch",
    "load_config",
    "parse_config",
]

#: Advertised IDs that always fit one ListAndWatch message: an entry of the longest kind
#: (a 63-character ID, "::9999", "Unhealthy", a NUMA node) encodes to at most 100 bytes.
MAX_IDS_PER_MESSAGE = KUBELET_MAX_RECV_MESSAGE_BYTES // 100

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_GROUP_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]{0,30}[A-Za-z0-9])?")
_HEX4 = re.compile(r"[0-9a-fA-F]{4}")
_GLOB_MAGIC = re.compile(r"[*?\[]")


def has_glob(path: str) -> bool:
    """Whether ``path`` contains glob magic (``*``, ``?`` or ``[``)."""
    return _GLOB_MAGIC.search(path) is not None


def _under(prefix: str) -> Any:
    def check(value: str) -> str:
        p = PurePosixPath(value)
        if not p.is_absolute():
            raise ValueError(f"must be an absolute path under {prefix} (got {value!r})")
        if ".." in p.parts:
            raise ValueError(f"must not contain '..' (got {value!r})")
        if p.parts[:2] != ("/", prefix.strip("/")) or len(p.parts) < 3:
            raise ValueError(f"must be a path under {prefix}/ (got {value!r})")
        return str(p)

    return Check(check)


def _template(allowed: frozenset[str]) -> Any:
    def check(value: str) -> str:
        try:
            Template.parse(value, allowed)
        except TemplateError as exc:
            raise ValueError(str(exc)) from None
        return value

    return Check(check)


DevPath = Annotated[str, _under("/dev")]
SysPath = Annotated[str, _under("/sys"), _template(CHECK_VARIABLES)]


def _permissions(value: str) -> str:
    if not value or any(c not in "rwm" for c in value) or len(set(value)) != len(value):
        raise ValueError(f"must be a non-empty combination of 'r', 'w', 'm' (got {value!r})")
    return value


def _hex4(value: str) -> str:
    if not _HEX4.fullmatch(value):
        raise ValueError(f"must be 4 hexadecimal digits, e.g. '0403' (got {describe_input(value)})")
    return value.lower()


def _group_name(value: str) -> str:
    if not _GROUP_NAME.fullmatch(value):
        raise ValueError(
            "must be 1-32 characters of [A-Za-z0-9._-], starting and ending "
            f"alphanumeric (got {describe_input(value)})"
        )
    return value


def _env_names(value: dict[str, str]) -> dict[str, str]:
    for key in value:
        if not _ENV_NAME.fullmatch(key):
            raise ValueError(f"{describe_input(key)} is not a valid environment variable name")
    return value


_FAULT = re.compile(
    r"^all$|^([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9](=([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$"
)


def _faults(value: list[str]) -> list[str]:
    for entry in value:
        if not _FAULT.match(entry):
            raise ValueError(
                f"{describe_input(entry)} is not a fault: health-check, "
                "health-check=<group>, unhealthy or all"
            )
    return value


@dataclass(frozen=True, kw_only=True)
class PathSpec(Model):
    """A glob of device nodes under ``/dev`` (read under ``devRoot``)."""

    path: DevPath
    container_path: Annotated[str, Check(absolute_path), _template(CDI_VARIABLES)] | None = None
    permissions: Annotated[str, Check(_permissions)] = "rw"
    optional: bool = False


@dataclass(frozen=True, kw_only=True)
class MountSpec(Model):
    """An extra host path (directory or file) bind-mounted into the container."""

    host_path: AbsPath
    container_path: AbsPath
    read_only: bool = False


@dataclass(frozen=True, kw_only=True)
class UsbMatch(Model):
    """Match USB devices by sysfs ``idVendor``/``idProduct``/``serial``."""

    vendor: Annotated[str, Check(_hex4)]
    product: Annotated[str, Check(_hex4)] | None = None
    serial: str | None = None


@dataclass(frozen=True, kw_only=True)
class SysfsAttributeCheck(Model):
    """Healthy while the attribute (under ``/sys``, read under ``sysRoot``) equals ``expect``."""

    path: SysPath
    expect: str


@dataclass(frozen=True, kw_only=True)
class CommandCheck(Model):
    """Healthy while ``argv`` exits 0 within ``timeoutSeconds``."""

    argv: Annotated[list[Annotated[str, _template(CHECK_VARIABLES)]], MinLen(1)]
    timeout_seconds: Annotated[float, Gt(0), Le(300)] = 5.0


@dataclass(frozen=True, kw_only=True)
class HealthSpec(Model):
    """Optional per-group health check, run every ``periodSeconds``."""

    #: At least 10 ms: a shorter period would keep a core busy.
    period_seconds: Annotated[float, Ge(0.01), Le(3600)] = 10.0
    sysfs_attribute: SysfsAttributeCheck | None = None
    command: CommandCheck | None = None

    def check(self) -> None:
        if self.sysfs_attribute is None and self.command is None:
            raise ValueError("needs 'sysfsAttribute' or 'command'")


@dataclass(frozen=True, kw_only=True)
class GroupSpec(Model):
    """A kind of device: node globs or USB matches, plus what a container gets with it."""

    name: Annotated[str, Check(_group_name)] | None = None
    paths: list[PathSpec] = field(default_factory=list)
    usb: list[UsbMatch] = field(default_factory=list)
    per_match: bool = True
    mounts: list[MountSpec] = field(default_factory=list)
    envs: Annotated[dict[str, Annotated[str, _template(ENV_VARIABLES)]], Check(_env_names)] = field(
        default_factory=dict
    )
    annotations: dict[str, Annotated[str, _template(ENV_VARIABLES)]] = field(default_factory=dict)
    cdi_devices: list[Annotated[str, _template(CDI_VARIABLES)]] = field(default_factory=list)
    count: Annotated[int, Ge(1), Le(10000)] = 1
    #: The DRA driver only: each device is one device allowing ``shares`` allocations
    #: (claims, in any namespaces), counted by the scheduler (consumable capacity).
    shares: Annotated[int, Ge(2), Le(10000)] | None = None
    health: HealthSpec | None = None

    def check(self) -> None:
        if bool(self.paths) == bool(self.usb):
            raise ValueError("needs exactly one of 'paths' or 'usb'")
        if self.shares is not None and self.count > 1:
            raise ValueError(
                "shares: not with count > 1 (count makes replicas, shares lets one device "
                "be allocated several times: choose one)"
            )
        if self.paths and self.per_match and self.paths[0].optional:
            raise ValueError(
                "paths[0].optional: must be false: with perMatch, paths[0] is the per-device path"
            )
        for i, spec in enumerate(self.paths):
            shared = not self.per_match or i > 0
            if (
                shared
                and has_glob(spec.path)
                and spec.container_path is not None
                and "{name}" not in spec.container_path
            ):
                raise ValueError(
                    f"paths[{i}].containerPath: must contain {{name}} because the glob can match "
                    "several nodes of one device"
                )


@dataclass(frozen=True, kw_only=True)
class ResourceSpec(Model):
    """One extended resource, advertised by its own plugin socket."""

    name: ResourceName
    groups: Annotated[list[GroupSpec], MinLen(1)]
    limit: Annotated[int, Ge(1)] | None = None
    placement: Literal["spread", "pack"] = "spread"

    def check(self) -> None:
        count = max(g.count for g in self.groups)
        if self.limit is not None and self.limit * count > MAX_IDS_PER_MESSAGE:
            raise ValueError(
                f"limit: {self.limit} devices x count {count} = {self.limit * count} device "
                "IDs can exceed the kubelet's 4 MiB ListAndWatch message (at most "
                f"{MAX_IDS_PER_MESSAGE} IDs of the longest kind fit); lower limit or count"
            )
        seen: set[str] = set()
        for i, group in enumerate(self.groups):
            name = group_name(group, i)
            if name in seen:
                raise ValueError(f"groups[{i}]: duplicate group name {name!r}")
            seen.add(name)


@dataclass(frozen=True, kw_only=True)
class Config(Model):
    """The whole config file (``version: v1``)."""

    version: Literal["v1"]
    dev_root: AbsPath = "/dev"
    sys_root: AbsPath = "/sys"
    keep_unhealthy_seconds: Annotated[float, Ge(0)] = 3600.0
    resources: Annotated[list[ResourceSpec], MinLen(1)]
    #: The DRA driver: faults whose device taint is NoExecute (``health-check``,
    #: ``health-check=<group>``, ``all``), so the pods using the device are evicted.
    evict_on: Annotated[list[str], Check(_faults)] = field(default_factory=list)

    def check(self) -> None:
        seen: set[str] = set()
        sockets: dict[str, str] = {}
        for i, res in enumerate(self.resources):
            if res.name in seen:
                raise ValueError(f"resources[{i}].name: duplicate resource name {res.name!r}")
            seen.add(res.name)
            sock = default_socket_name(res.name)
            if sock in sockets:
                raise ValueError(
                    f"resources[{i}].name: {res.name!r} maps to the socket name {sock!r}, "
                    f"like {sockets[sock]!r}; rename one of them"
                )
            sockets[sock] = res.name

    def with_roots(self, dev_root: str | None = None, sys_root: str | None = None) -> Config:
        """A copy with ``devRoot``/``sysRoot`` overridden (``--dev-root``/``--sys-root``)."""
        update: dict[str, Any] = {}
        if dev_root is not None:
            update["dev_root"] = str(Path(dev_root).absolute())
        if sys_root is not None:
            update["sys_root"] = str(Path(sys_root).absolute())
        return replace(self, **update)


def group_name(group: GroupSpec, index: int) -> str:
    """The group's name, or ``group<index>`` when it has none."""
    return group.name if group.name is not None else f"group{index}"


def parse_config(data: Any, source: str = "<config>") -> Config:
    """Validate already-parsed YAML ``data``; raise :class:`ConfigError` with readable lines."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: (top level): expected a mapping (got {describe_input(data)})")
    version = data.get("version")
    if "version" in data and version != "v1":
        raise ConfigError(f"{source}: version: unsupported version {version!r} (supported: 'v1')")
    return parse_model(Config, data, source)


def load_config(path: str | Path) -> Config:
    """Read and validate the YAML config at ``path``; errors name the file and the field."""
    source = str(path)
    data = read_yaml(path)
    if data is None:
        raise ConfigError(
            f"{source}: (top level): empty file; expected a mapping with 'version' and 'resources'"
        )
    return parse_config(data, source)

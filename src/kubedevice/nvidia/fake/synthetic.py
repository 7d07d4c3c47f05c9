"""The synthetic machine format (``kubedevice-fake-nvml/v1``): typed models naming the field."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from kubedevice.errors import ConfigError
from kubedevice.nvidia.backend import (
    DriverInfo,
    GpuInfo,
    GpuSample,
    Link,
    MigDeviceInfo,
    P2PLevel,
    ProcessSample,
)
from kubedevice.nvidia.fake.control import _validate_message
from kubedevice.nvidia.fake.machine import (
    _MIB,
    FakeGpu,
    FakeMachine,
    ScriptStep,
    _check_unique,
    _default_dev_nodes,
    _is_load_recording,
    _read_json,
    _sysfs_bus_id,
    resolve_machine_path,
)
from kubedevice.nvidia.fake.migprofiles import MEMORY_SLICES, first_fit, profile_info
from kubedevice.nvidia.fake.replay import _timeline
from kubedevice.plugin.schema import (
    Check,
    Ge,
    Gt,
    Le,
    Model,
    SchemaError,
    build,
    describe_input,
)

__all__: list[str] = []


def _pattern(regex: str) -> Check:
    compiled = re.compile(regex)

    def check(value: str) -> str:
        if not compiled.search(value):
            raise ValueError(f"must match {regex!r} (got {describe_input(value)})")
        return value

    return Check(check)


_Count = Annotated[int, Ge(0)]


class _Strict(Model):
    camel_keys: ClassVar[bool] = False


@dataclass(frozen=True, kw_only=True)
class _DriverSpec(_Strict):
    version: str
    cuda: str
    nvml: str


@dataclass(frozen=True, kw_only=True)
class _ProcSpec(_Strict):
    pid: int
    used_memory: int | None = None


@dataclass(frozen=True, kw_only=True)
class _SampleSpec(_Strict):
    utilization_gpu: Annotated[int, Ge(0), Le(100)] | None = None
    utilization_memory: Annotated[int, Ge(0), Le(100)] | None = None
    memory_used: _Count | None = None
    memory_total: _Count | None = None
    power_mw: _Count | None = None
    temperature_c: int | None = None
    processes: list[_ProcSpec] = field(default_factory=list)
    ecc_double_bit_volatile: _Count | None = None
    remapped_rows_pending: bool | None = None
    remapped_rows_failure: bool | None = None

    def to_sample(self) -> GpuSample:
        values = dataclasses.asdict(self)
        values["processes"] = tuple(ProcessSample(**p) for p in values["processes"])
        return GpuSample(**values)


@dataclass(frozen=True, kw_only=True)
class _MigSpec(_Strict):
    uuid: Annotated[str, _pattern(r"^MIG-")]
    profile: Annotated[str, _pattern(r"^(\d+c\.)?\d+g\.\d+gb(\+\w+)?$")]
    gi_id: _Count
    ci_id: _Count = 0
    memory_mib: Annotated[int, Gt(0)]
    cap_minors: list[int] = field(default_factory=list)
    placement_start: Annotated[int, Ge(0), Le(7)] | None = None


@dataclass(frozen=True, kw_only=True)
class _GpuSpec(_Strict):
    uuid: Annotated[str, _pattern(r"^GPU-")]
    index: _Count | None = None
    minor: _Count | None = None
    name: str
    memory_mib: Annotated[int, Gt(0)]
    pci_bus_id: Annotated[str, _pattern(r"^[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")]
    compute_capability: tuple[int, int]
    architecture: str = "unknown"
    brand: str = "nvidia"
    serial: str | None = None
    numa_node: Annotated[int, Ge(-1), Le(1023)] | None = None
    pcie_switch: str | None = None
    host_bridge: str | None = None
    mig_capable: bool = False
    mig_enabled: bool = False
    mig_devices: list[_MigSpec] = field(default_factory=list)
    events_supported: bool = True
    sample: _SampleSpec = field(default_factory=_SampleSpec)
    timeline: str | None = None  # a load recording, relative to this file or packaged


@dataclass(frozen=True, kw_only=True)
class _LinkSpec(_Strict):
    gpus: tuple[int, int]
    nvlinks: _Count = 0
    level: Literal["PIX", "PXB", "PHB", "NODE", "SYS"] | None = None


@dataclass(frozen=True, kw_only=True)
class _StepSpec(_Strict):
    at_ms: _Count
    op: Literal["xid", "ecc", "lost", "recover", "sample"]
    gpu: int | None = None  # an index, instead of uuid
    uuid: str | None = None
    xid: int | None = None
    values: dict[str, Any] | None = None


@dataclass(frozen=True, kw_only=True)
class _MachineSpec(_Strict):
    format: Literal["kubedevice-fake-nvml/v1"]
    description: str = ""
    driver: _DriverSpec
    init_error: str | None = None
    control_socket: str | None = None
    gpus: list[_GpuSpec]
    links: list[_LinkSpec] = field(default_factory=list)
    dev_nodes: list[str] | None = None
    script: list[_StepSpec] = field(default_factory=list)


_LEVELS = {
    "PIX": P2PLevel.SINGLE,
    "PXB": P2PLevel.MULTIPLE,
    "PHB": P2PLevel.HOSTBRIDGE,
    "NODE": P2PLevel.NODE,
    "SYS": P2PLevel.SYSTEM,
}


def _derived_level(a: FakeGpu, b: FakeGpu) -> P2PLevel:
    """The PCIe level of two GPUs from their switch, host bridge and NUMA node."""
    if a.pcie_switch is not None and a.pcie_switch == b.pcie_switch:
        return P2PLevel.SINGLE
    if a.host_bridge is not None and a.host_bridge == b.host_bridge:
        return P2PLevel.HOSTBRIDGE
    if a.numa_node == b.numa_node:
        return P2PLevel.NODE
    return P2PLevel.SYSTEM


def _parse_synthetic(raw: dict[str, Any], path: Path) -> FakeMachine:
    try:
        spec = build(_MachineSpec, raw)
    except SchemaError as e:
        first = e.problems[0]
        loc = ".".join(str(p) for p in first.path) or "(top level)"
        raise ConfigError(f"{path}: {loc}: {first.message}") from None
    gpus: list[FakeGpu] = []
    for pos, g in enumerate(spec.gpus):
        index = pos if g.index is None else g.index
        uuid = g.uuid
        starts = first_fit(
            [max(1, round(m.memory_mib * MEMORY_SLICES / g.memory_mib)) for m in g.mig_devices],
            [m.placement_start for m in g.mig_devices],
        )
        hopper = g.architecture == "hopper"
        mig = tuple(
            MigDeviceInfo(
                parent_uuid=uuid,
                parent_index=index,
                uuid=m.uuid,
                index=i,
                profile=m.profile,
                gi_id=m.gi_id,
                ci_id=m.ci_id,
                memory_total=m.memory_mib * _MIB,
                cap_minors=tuple(m.cap_minors),
                profile_info=profile_info(m.profile, m.memory_mib, g.memory_mib, start)
                if hopper
                else None,
            )
            for i, (m, start) in enumerate(zip(g.mig_devices, starts, strict=True))
        )
        if mig and not g.mig_enabled:
            raise ConfigError(f"{path}: gpus.{pos}.mig_devices: given but mig_enabled is false")
        if g.mig_enabled and not g.mig_capable:
            raise ConfigError(f"{path}: gpus.{pos}.mig_enabled: true but mig_capable is false")
        info = GpuInfo(
            index=index,
            uuid=uuid,
            minor=index if g.minor is None else g.minor,
            name=g.name,
            memory_total=g.memory_mib * _MIB,
            pci_bus_id=_sysfs_bus_id(g.pci_bus_id),
            compute_capability=g.compute_capability,
            architecture=g.architecture,
            brand=g.brand,
            mig_capable=g.mig_capable,
            mig_enabled=g.mig_enabled,
            serial=g.serial,
            numa_node=g.numa_node if g.numa_node is None or g.numa_node >= 0 else None,
        )
        sample = g.sample.to_sample()
        if sample.memory_total is None:
            sample = dataclasses.replace(sample, memory_total=info.memory_total)
        gpu = FakeGpu(
            info=info,
            numa_node=g.numa_node if g.numa_node is None or g.numa_node >= 0 else None,
            pcie_switch=g.pcie_switch,
            host_bridge=g.host_bridge,
            events_supported=g.events_supported,
            sample=sample,
            mig=mig,
        )
        if g.timeline is not None:
            tl_path = path.parent / g.timeline
            if not tl_path.is_file():
                tl_path = resolve_machine_path(g.timeline)
            tl_raw = _read_json(tl_path)
            if not _is_load_recording(tl_raw):
                raise ConfigError(f"{path}: gpus.{pos}.timeline: {tl_path} is not a load recording")
            try:
                timeline, period = _timeline(tl_raw, sample)
            except (KeyError, TypeError, ValueError) as e:
                raise ConfigError(f"{tl_path}: bad load sample: {e}") from e
            gpu = dataclasses.replace(gpu, timeline=timeline, timeline_period_s=period)
        gpus.append(gpu)
    _check_unique(path, "uuid", [g.info.uuid for g in gpus] + [m.uuid for g in gpus for m in g.mig])
    _check_unique(path, "index", [g.info.index for g in gpus])
    _check_unique(path, "minor", [g.info.minor for g in gpus])
    _check_unique(path, "pci_bus_id", [g.info.pci_bus_id for g in gpus])

    links: dict[frozenset[str], Link] = {}
    for i, a in enumerate(gpus):
        for b in gpus[i + 1 :]:
            links[frozenset((a.info.uuid, b.info.uuid))] = Link(_derived_level(a, b))
    for n, ln in enumerate(spec.links):
        x, y = ln.gpus
        if x == y or not (0 <= x < len(gpus) and 0 <= y < len(gpus)):
            raise ConfigError(f"{path}: links.{n}.gpus: need two distinct GPU positions")
        key = frozenset((gpus[x].info.uuid, gpus[y].info.uuid))
        level = _LEVELS[ln.level] if ln.level else links[key].level
        links[key] = Link(level=level, nvlinks=ln.nvlinks)

    steps: list[ScriptStep] = []
    for n, st in enumerate(spec.script):
        msg: dict[str, Any] = {"op": st.op}
        if st.uuid is not None:
            msg["uuid"] = st.uuid
        elif st.gpu is not None and 0 <= st.gpu < len(gpus):
            msg["uuid"] = gpus[st.gpu].info.uuid
        else:
            raise ConfigError(f"{path}: script.{n}: needs 'uuid' or a valid 'gpu' position")
        if st.xid is not None:
            msg["xid"] = st.xid
        if st.values is not None:
            msg["values"] = st.values
        steps.append(ScriptStep(at_ms=st.at_ms, message=msg))
    steps.sort(key=lambda s: s.at_ms)
    machine = FakeMachine(
        name=path.stem,
        source=str(path),
        driver=DriverInfo(spec.driver.version, spec.driver.cuda, spec.driver.nvml),
        gpus=tuple(gpus),
        links=links,
        dev_nodes=tuple(spec.dev_nodes) if spec.dev_nodes is not None else _default_dev_nodes(gpus),
        script=tuple(steps),
        control_socket=spec.control_socket,
        init_error=spec.init_error,
        description=spec.description,
    )
    for n, step in enumerate(machine.script):
        try:
            _validate_message(machine, step.message)
        except ConfigError as e:
            raise ConfigError(f"{path}: script.{n}: {e}") from e
    return machine

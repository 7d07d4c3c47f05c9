"""The fake NVML backend: GPUs read from a JSON file, health events injected in or out of process.

Three kinds of file are understood (see docs/nvidia-fake.md):

* an NVML recording of a real machine (``machines/h200.json``): what each NVML call
  answered, including the calls that answered NotSupported;
* a load recording (``machines/h200-load.json``): readings taken every 0.5 s while a
  CUDA workload ran. It holds no static facts, so alone it is played on the GPU of
  ``h200.json`` (same model and driver) carrying the identity (UUID, bus id, minor) of the
  machine it was recorded on; ``h200+h200-load`` plays it on the first GPU of ``h200``;
* a synthetic machine (``"format": "kubedevice-fake-nvml/v1"``): GPUs, MIG devices,
  NUMA nodes, PCIe switches, NVLink counts, a script of timed events.

Health events reach a blocked :meth:`FakeNvml.wait_event` three ways, none of them polled:
:meth:`FakeNvml.inject` / :meth:`FakeNvml.set_lost` in process, JSON datagrams on a
control socket (``KUBEDEVICE_FAKE_NVML_CONTROL`` or the file's ``control_socket``; see
:func:`send_control`), and the machine's script (timed from the first :meth:`watch`).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import itertools
import json
import logging
import os
import select
import socket
import stat
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kubedevice.errors import ConfigError, NvmlError
from kubedevice.nvidia.backend import (
    ARCHITECTURE_NAMES,
    BRAND_NAMES,
    DriverInfo,
    EventKind,
    GpuInfo,
    GpuSample,
    HealthEvent,
    Link,
    MigDeviceInfo,
    P2PLevel,
    ProcessSample,
)

__all__ = [
    "CONTROL_ENV",
    "MACHINES_DIR",
    "SYNTHETIC_FORMAT",
    "FakeGpu",
    "FakeMachine",
    "FakeNvml",
    "ScriptStep",
    "load_machine",
    "machine_names",
    "resolve_machine_path",
    "send_control",
    "write_fake_dev",
    "write_fake_sysfs",
]

log = logging.getLogger(__name__)

CONTROL_ENV = "KUBEDEVICE_FAKE_NVML_CONTROL"
MACHINES_DIR = Path(__file__).resolve().parent / "machines"
SYNTHETIC_FORMAT = "kubedevice-fake-nvml/v1"
_MIB = 1024 * 1024
_CONTROL_OPS = ("xid", "ecc", "lost", "recover", "sample")
_SAMPLE_FIELDS = frozenset(f.name for f in dataclasses.fields(GpuSample))

_EVENT_MASK = 0x2 | 0x8  # nvmlEventTypeDoubleBitEccError | nvmlEventTypeXidCriticalError


# --------------------------------------------------------------------------- the machine


@dataclass(frozen=True, slots=True)
class FakeGpu:
    """One GPU of a fake machine: NVML's static facts plus what the fake needs to play it."""

    info: GpuInfo
    numa_node: int | None = None  # what sysfs says (None = -1)
    pcie_switch: str | None = None
    host_bridge: str | None = None
    events_supported: bool = True  # XID/ECC events can be registered
    sample: GpuSample = dataclasses.field(default_factory=GpuSample)  # when no timeline plays
    timeline: tuple[GpuSample, ...] = ()  # load recording, played in a loop from init()
    timeline_period_s: float = 0.5
    mig: tuple[MigDeviceInfo, ...] = ()


@dataclass(frozen=True, slots=True)
class ScriptStep:
    """A control message the fake applies by itself ``at_ms`` after the first watch()."""

    at_ms: int
    message: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class FakeMachine:
    """A parsed machine file."""

    name: str
    source: str  # the file(s) it came from
    driver: DriverInfo
    gpus: tuple[FakeGpu, ...]
    links: Mapping[frozenset[str], Link]  # every pair NVML can tell about
    dev_nodes: tuple[str, ...]  # absolute paths, e.g. "/dev/nvidia0"
    script: tuple[ScriptStep, ...] = ()
    control_socket: str | None = None
    init_error: str | None = None  # NVML error name init() raises ("DriverNotLoaded" ...)
    description: str = ""

    def gpu(self, uuid: str) -> FakeGpu:
        """The GPU with this UUID (ConfigError if none)."""
        for g in self.gpus:
            if g.info.uuid == uuid:
                return g
        raise ConfigError(f"fake machine {self.name!r} has no GPU {uuid!r}")


# --------------------------------------------------------------------------- loading


def machine_names() -> list[str]:
    """The machines packaged with kubedevice, by bare name (``dgx-8gpu`` ...)."""
    return sorted(p.stem for p in MACHINES_DIR.glob("*.json"))


def resolve_machine_path(name: str | Path) -> Path:
    """A machine file from a path, or a packaged machine's bare name (``dgx-8gpu``).

    ``machines/NAME.json`` and ``NAME.json`` also name packaged machines when no such
    file exists relative to the working directory.

    Raises:
        ConfigError: nothing of that name exists.
    """
    path = Path(name)
    if path.is_file():
        return path
    text = str(name)
    bare = text.removeprefix("machines/").removesuffix(".json")
    if "/" not in bare and bare:
        packaged = MACHINES_DIR / f"{bare}.json"
        if packaged.is_file():
            return packaged
    raise ConfigError(
        f"fake NVML machine {text!r}: no such file, and not a packaged machine "
        f"(packaged: {', '.join(machine_names())})"
    )


def load_machine(spec: str | Path) -> FakeMachine:
    """Load a machine file, or ``BASE+LOAD`` (a load recording played on BASE's first GPU).

    Raises:
        ConfigError: the file is missing, not JSON, or invalid (the message names the field).
    """
    text = str(spec)
    if "+" in text and not Path(text).is_file():
        base_name, _, load_name = text.partition("+")
        base = load_machine(base_name)
        load_path = resolve_machine_path(load_name)
        raw = _read_json(load_path)
        if not _is_load_recording(raw):
            raise ConfigError(f"{load_path}: not a load recording (no 'under_load' samples)")
        return _apply_load(base, raw, str(load_path), keep_identity=True)
    path = resolve_machine_path(text)
    raw = _read_json(path)
    if isinstance(raw, dict) and raw.get("format") == SYNTHETIC_FORMAT:
        return _parse_synthetic(raw, path)
    if _is_load_recording(raw):
        base = _parse_recording(_read_json(MACHINES_DIR / "h200.json"), MACHINES_DIR / "h200.json")
        return _apply_load(base, raw, str(path), keep_identity=False)
    if isinstance(raw, dict) and isinstance(raw.get("devices"), list) and "driver" in raw:
        return _parse_recording(raw, path)
    raise ConfigError(
        f"{path}: not a fake NVML machine: expected 'format: {SYNTHETIC_FORMAT}', "
        "an NVML recording ('driver', 'devices') or a load recording ('under_load')"
    )


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror or e}") from e
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: not JSON: line {e.lineno}: {e.msg}") from e
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text: invalid byte at offset {e.start}") from None
    except ValueError as e:  # e.g. an integer of thousands of digits
        raise ConfigError(f"{path}: not usable JSON: {str(e).splitlines()[0][:200]}") from None
    except RecursionError:
        raise ConfigError(f"{path}: not usable JSON: nested too deeply") from None


def _is_load_recording(raw: Any) -> bool:
    return isinstance(raw, dict) and isinstance(raw.get("under_load"), list)


def _unsupported(value: Any) -> bool:
    """A recorded call that answered with an error (e.g. NVMLError_NotSupported)."""
    return isinstance(value, dict) and "error" in value


def _cuda_version(v: int) -> str:
    # nvmlSystemGetCudaDriverVersion: 1000 * major + 10 * minor (13000 -> "13.0").
    return f"{v // 1000}.{(v % 1000) // 10}"


def _parse_recording(raw: dict[str, Any], path: Path) -> FakeMachine:
    """An NVML recording: one entry per device with what each call answered."""
    where = str(path)
    try:
        driver = DriverInfo(
            driver_version=str(raw["driver"]),
            cuda_version=_cuda_version(int(raw["cuda_driver_version"])),
            nvml_version=str(raw["nvml_version"]),
        )
        numa_by_bus = _recorded_numa(str(raw.get("sys_pci_numa", "")))
        gpus: list[FakeGpu] = []
        for i, d in enumerate(raw["devices"]):
            pci = d["pci"]
            bus_id = str(pci.get("busIdLegacy") or pci["busId"]).lower()
            bus_id = _sysfs_bus_id(bus_id)
            mig_mode = d.get("mig_mode")
            mig_capable = isinstance(mig_mode, list) and not _unsupported(mig_mode)
            cc = d.get("cuda_cc")
            mem = d.get("memory")
            remapped = d.get("remapped_rows")
            temperature = d.get("temperature")
            info = GpuInfo(
                index=int(d.get("index", i)),
                uuid=str(d["uuid"]),
                minor=int(d["minor"]),
                name=str(d["name"]),
                memory_total=int(mem["total"]) if isinstance(mem, dict) and "total" in mem else 0,
                pci_bus_id=bus_id,
                compute_capability=(int(cc[0]), int(cc[1])) if isinstance(cc, list) else (0, 0),
                architecture=ARCHITECTURE_NAMES.get(d.get("arch", -1), "unknown"),
                brand=BRAND_NAMES.get(d.get("brand", -1), "unknown"),
                mig_capable=mig_capable,
                mig_enabled=bool(mig_capable and mig_mode and mig_mode[0] == 1),
                serial=str(d["serial"]) if isinstance(d.get("serial"), str) else None,
            )
            sample = GpuSample(
                memory_used=int(mem["used"]) if isinstance(mem, dict) and "used" in mem else None,
                memory_total=info.memory_total or None,
                temperature_c=temperature if isinstance(temperature, int) else None,
                # nvmlDeviceGetRemappedRows: (corrected, uncorrected, pending, failure)
                remapped_rows_pending=bool(remapped[2]) if isinstance(remapped, list) else None,
                remapped_rows_failure=bool(remapped[3]) if isinstance(remapped, list) else None,
            )
            supported = d.get("supported_event_types")
            events = bool(d.get("xid_supported_bit", True))
            if isinstance(supported, int):
                events = events and bool(supported & _EVENT_MASK)
            gpus.append(
                FakeGpu(
                    info=info,
                    numa_node=numa_by_bus.get(bus_id),
                    events_supported=events,
                    sample=sample,
                )
            )
    except (KeyError, TypeError, ValueError, IndexError) as e:
        raise ConfigError(f"{where}: NVML recording is missing or has a bad value: {e}") from e
    dev_nodes = tuple(str(n) for n in raw.get("dev_nodes", ())) or _default_dev_nodes(gpus)
    return FakeMachine(
        name=path.stem,
        source=where,
        driver=driver,
        gpus=tuple(gpus),
        links={},  # a recording holds no pairwise answers: NVML "cannot tell"
        dev_nodes=dev_nodes,
        description=str(raw.get("recorded", "")),
    )


def _sysfs_bus_id(bus_id: str) -> str:
    """NVML's "00000000:00:06.0" -> sysfs "0000:00:06.0" (domain of 4 hex digits)."""
    bus_id = bus_id.lower()
    domain, sep, rest = bus_id.partition(":")
    if sep and len(domain) > 4:
        domain = domain[-4:]
    return f"{domain}{sep}{rest}"


def _recorded_numa(text: str) -> dict[str, int | None]:
    """Lines "/sys/bus/pci/devices/<bus id> <numa_node> <class>" -> {bus id: node}."""
    out: dict[str, int | None] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2:
            with contextlib.suppress(ValueError):
                node = int(parts[1])
                out[Path(parts[0]).name.lower()] = node if node >= 0 else None
    return out


def _recorded_identity(raw: Mapping[str, Any]) -> dict[str, str]:
    """The "Key: value" lines of /proc/driver/nvidia/gpus/*/information in a recording."""
    out: dict[str, str] = {}
    for line in str(raw.get("device_files", "")).splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("Model", "GPU UUID", "Bus Location", "Device Minor"):
            out[key.strip()] = value.strip()
    return out


def _over(base: GpuSample, top: GpuSample) -> GpuSample:
    """``top`` with its unknown (None) fields taken from ``base``; processes always from top."""
    values = {
        f.name: getattr(top, f.name)
        for f in dataclasses.fields(GpuSample)
        if getattr(top, f.name) is not None and f.name != "processes"
    }
    return dataclasses.replace(base, processes=top.processes, **values)


def _timeline(raw: Mapping[str, Any], base: GpuSample) -> tuple[tuple[GpuSample, ...], float]:
    """The recording's samples, each over ``base`` (for the values a load sample lacks)."""
    samples: list[GpuSample] = []
    times: list[float] = []
    for s in raw["under_load"]:
        samples.append(
            _over(
                base,
                GpuSample(
                    utilization_gpu=s.get("gpu_util"),
                    utilization_memory=s.get("mem_util"),
                    memory_used=int(s["mem_used_mib"]) * _MIB if "mem_used_mib" in s else None,
                    power_mw=s.get("power_mw"),
                    temperature_c=s.get("temp"),
                    processes=tuple(
                        ProcessSample(pid=int(p["pid"]), used_memory=int(p["used_mib"]) * _MIB)
                        for p in s.get("procs", ())
                    ),
                ),
            )
        )
        if "t" in s:
            times.append(float(s["t"]))
    if not samples:
        raise ConfigError("load recording: 'under_load' holds no samples")
    period = 0.5
    if len(times) >= 2:
        steps = sorted(b - a for a, b in itertools.pairwise(times))
        period = max(steps[len(steps) // 2], 0.01)
    return tuple(samples), period


def _apply_load(
    base: FakeMachine, raw: Mapping[str, Any], source: str, *, keep_identity: bool
) -> FakeMachine:
    """Play a load recording on ``base``'s first GPU (optionally with the recording's identity)."""
    if not base.gpus:
        raise ConfigError(f"{base.source}: no GPU to play the load recording {source} on")
    first = base.gpus[0]
    info = first.info
    numa = first.numa_node
    if not keep_identity:
        ident = _recorded_identity(raw)
        bus = _sysfs_bus_id(ident.get("Bus Location", info.pci_bus_id))
        info = dataclasses.replace(
            info,
            uuid=ident.get("GPU UUID", info.uuid),
            name=ident.get("Model", info.name),
            pci_bus_id=bus,
            minor=int(ident.get("Device Minor", info.minor)),
            serial=None,
        )
    try:
        timeline, period = _timeline(raw, first.sample)
    except (KeyError, TypeError, ValueError) as e:
        raise ConfigError(f"{source}: bad load sample: {e}") from e
    gpu = dataclasses.replace(
        first, info=info, numa_node=numa, timeline=timeline, timeline_period_s=period
    )
    return dataclasses.replace(
        base,
        name=f"{base.name}+{Path(source).stem}" if keep_identity else Path(source).stem,
        source=f"{base.source}+{source}",
        gpus=(gpu, *base.gpus[1:]),
        dev_nodes=base.dev_nodes if keep_identity else _default_dev_nodes([gpu]),
        description=str(raw.get("recorded", base.description)),
    )


def _default_dev_nodes(gpus: Iterable[FakeGpu]) -> tuple[str, ...]:
    nodes = ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
    for g in gpus:
        nodes.append(f"/dev/nvidia{g.info.minor}")
        nodes.extend(f"/dev/nvidia-caps/nvidia-cap{m}" for mig in g.mig for m in mig.cap_minors)
    return tuple(dict.fromkeys(nodes))


# ---- the synthetic format (validated with pydantic, so errors name the field)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _DriverSpec(_Strict):
    version: str
    cuda: str
    nvml: str


class _ProcSpec(_Strict):
    pid: int
    used_memory: int | None = None


class _SampleSpec(_Strict):
    utilization_gpu: int | None = Field(default=None, ge=0, le=100)
    utilization_memory: int | None = Field(default=None, ge=0, le=100)
    memory_used: int | None = Field(default=None, ge=0)
    memory_total: int | None = Field(default=None, ge=0)
    power_mw: int | None = Field(default=None, ge=0)
    temperature_c: int | None = None
    processes: list[_ProcSpec] = []
    ecc_double_bit_volatile: int | None = Field(default=None, ge=0)
    remapped_rows_pending: bool | None = None
    remapped_rows_failure: bool | None = None

    def to_sample(self) -> GpuSample:
        values = self.model_dump()
        values["processes"] = tuple(ProcessSample(**p) for p in values["processes"])
        return GpuSample(**values)


class _MigSpec(_Strict):
    uuid: str = Field(pattern=r"^MIG-")
    profile: str = Field(pattern=r"^(\d+c\.)?\d+g\.\d+gb(\+\w+)?$")
    gi_id: int = Field(ge=0)
    ci_id: int = Field(default=0, ge=0)
    memory_mib: int = Field(gt=0)
    cap_minors: list[int] = []


class _GpuSpec(_Strict):
    uuid: str = Field(pattern=r"^GPU-")
    index: int | None = Field(default=None, ge=0)
    minor: int | None = Field(default=None, ge=0)
    name: str
    memory_mib: int = Field(gt=0)
    pci_bus_id: str = Field(pattern=r"^[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")
    compute_capability: tuple[int, int]
    architecture: str = "unknown"
    brand: str = "nvidia"
    serial: str | None = None
    numa_node: int | None = None
    pcie_switch: str | None = None
    host_bridge: str | None = None
    mig_capable: bool = False
    mig_enabled: bool = False
    mig_devices: list[_MigSpec] = []
    events_supported: bool = True
    sample: _SampleSpec = _SampleSpec()
    timeline: str | None = None  # a load recording, relative to this file or packaged


class _LinkSpec(_Strict):
    gpus: tuple[int, int]
    nvlinks: int = Field(default=0, ge=0)
    level: Literal["PIX", "PXB", "PHB", "NODE", "SYS"] | None = None


class _StepSpec(_Strict):
    at_ms: int = Field(ge=0)
    op: Literal["xid", "ecc", "lost", "recover", "sample"]
    gpu: int | None = None  # an index, instead of uuid
    uuid: str | None = None
    xid: int | None = None
    values: dict[str, Any] | None = None


class _MachineSpec(_Strict):
    format: Literal["kubedevice-fake-nvml/v1"]
    description: str = ""
    driver: _DriverSpec
    init_error: str | None = None
    control_socket: str | None = None
    gpus: list[_GpuSpec]
    links: list[_LinkSpec] = []
    dev_nodes: list[str] | None = None
    script: list[_StepSpec] = []


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
        spec = _MachineSpec.model_validate(raw)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        raise ConfigError(f"{path}: {loc}: {err['msg']}") from e
    gpus: list[FakeGpu] = []
    for pos, g in enumerate(spec.gpus):
        index = pos if g.index is None else g.index
        uuid = g.uuid
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
            )
            for i, m in enumerate(g.mig_devices)
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


def _check_unique(path: Path, what: str, values: list[Any]) -> None:
    seen: set[Any] = set()
    for v in values:
        if v in seen:
            raise ConfigError(f"{path}: gpus: duplicate {what} {v!r}")
        seen.add(v)


def _validate_message(machine: FakeMachine, message: Mapping[str, Any]) -> None:
    """Check a control message; ConfigError (one line) when it is malformed."""
    if not isinstance(message, Mapping):
        raise ConfigError("control message: not a JSON object")
    op = message.get("op")
    if op not in _CONTROL_OPS:
        raise ConfigError(f"control message: op: {op!r} is not one of {', '.join(_CONTROL_OPS)}")
    uuid = message.get("uuid")
    known = {g.info.uuid for g in machine.gpus} | {m.uuid for g in machine.gpus for m in g.mig}
    if uuid not in known:
        raise ConfigError(f"control message: uuid: {uuid!r} is not a GPU or MIG device here")
    if op == "xid" and not isinstance(message.get("xid"), int):
        raise ConfigError("control message: xid: an integer is required for op 'xid'")
    if op in ("lost", "recover", "sample") and not any(g.info.uuid == uuid for g in machine.gpus):
        raise ConfigError(f"control message: uuid: op {op!r} needs a GPU UUID, not a MIG device")
    if op == "sample":
        values = message.get("values")
        if not isinstance(values, Mapping):
            raise ConfigError("control message: values: an object is required for op 'sample'")
        bad = sorted(set(values) - _SAMPLE_FIELDS)
        if bad:
            raise ConfigError(f"control message: values: unknown field {bad[0]!r}")


# --------------------------------------------------------------------------- the backend


class FakeNvml:
    """An :class:`~kubedevice.nvidia.backend.NvmlBackend` playing a :class:`FakeMachine`.

    ``wait_event`` blocks in ``poll()`` on a self-pipe (woken by :meth:`interrupt`,
    :meth:`inject`, :meth:`set_lost`) and the control socket, with the timeout cut short
    only for the next scripted step: it never polls in a loop.
    """

    def __init__(
        self,
        machine: FakeMachine,
        *,
        control_socket: str | Path | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.machine = machine
        env = os.environ.get(CONTROL_ENV)
        path = control_socket or env or machine.control_socket
        self.control_path: Path | None = Path(path) if path else None
        self._clock = clock
        self._lock = threading.Lock()
        self._gpus = {g.info.uuid: g for g in machine.gpus}
        self._mig_parent = {m.uuid: g.info.uuid for g in machine.gpus for m in g.mig}
        self._initialised = False
        self._t0 = 0.0
        self._lost: set[str] = set()
        self._overrides: dict[str, dict[str, Any]] = {}
        self._time_slices: dict[str, int] = {}
        self._watched: set[str] = set()
        self._events: collections.deque[HealthEvent] = collections.deque()
        self._interrupted = False
        self._script_t0: float | None = None
        self._script_next = 0
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._ctl: socket.socket | None = None
        self._closed = False

    @classmethod
    def from_file(cls, spec: str | Path, **kwargs: Any) -> FakeNvml:
        """Load a machine file (see :func:`load_machine`) and wrap it."""
        return cls(load_machine(spec), **kwargs)

    # ---- NvmlBackend

    def init(self) -> DriverInfo:
        """Start the fake: raise the machine's ``init_error``, if any; bind the control socket."""
        if self.machine.init_error:
            raise NvmlError(self.machine.init_error, f"fake machine {self.machine.name!r}")
        with self._lock:
            if not self._initialised:
                self._initialised = True
                self._t0 = self._clock()
                if self.control_path is not None and self._ctl is None:
                    self._ctl = self._bind_control(self.control_path)
        return self.machine.driver

    def shutdown(self) -> None:
        """Stop the fake: close and remove the control socket; events are kept."""
        with self._lock:
            self._initialised = False
            self._close_control()

    def gpus(self) -> list[GpuInfo]:
        """The machine's GPUs, in index order."""
        self._enter()
        return sorted((g.info for g in self.machine.gpus), key=lambda i: i.index)

    def mig_devices(self, gpu_uuid: str) -> list[MigDeviceInfo]:
        """The GPU's MIG devices (empty when MIG is off)."""
        gpu = self._gpu(gpu_uuid)
        return list(gpu.mig) if gpu.info.mig_enabled else []

    def link(self, uuid_a: str, uuid_b: str) -> Link | None:
        """The link between two GPUs; ``None`` for a recording (NVML answered NotSupported)."""
        self._gpu(uuid_a)
        self._gpu(uuid_b)
        if uuid_a == uuid_b:
            raise NvmlError("InvalidArgument", "link() needs two distinct GPUs", uuid_a)
        return self.machine.links.get(frozenset((uuid_a, uuid_b)))

    def sample(self, uuid: str) -> GpuSample:
        """The GPU's readings: the timeline entry now (if any), then set_sample() overrides."""
        if uuid in self._mig_parent:
            parent = self._gpu(self._mig_parent[uuid])
            mig = next(m for m in parent.mig if m.uuid == uuid)
            return GpuSample(memory_total=mig.memory_total)
        gpu = self._gpu(uuid)
        current = gpu.sample
        if gpu.timeline:
            step = int((self._clock() - self._t0) / gpu.timeline_period_s)
            current = gpu.timeline[step % len(gpu.timeline)]
        with self._lock:
            override = dict(self._overrides.get(uuid, {}))
        return dataclasses.replace(current, **override) if override else current

    def probe(self, uuid: str) -> None:
        """Raise ``GpuIsLost`` if the GPU (or a MIG device's parent) is lost."""
        self._gpu(self._mig_parent.get(uuid, uuid))

    def watch(self, uuids: list[str]) -> None:
        """Register events for these GPUs (a MIG UUID stands for its parent GPU).

        A lost GPU yields a GPU_LOST event at once instead of failing the call.
        """
        self._enter()
        lost_now: list[str] = []
        with self._lock:
            self._watched = set()
            for u in dict.fromkeys(self._mig_parent.get(u, u) for u in uuids):
                gpu = self._gpus.get(u)
                if gpu is None:
                    raise NvmlError("NotFound", "no such GPU", u)
                if not gpu.events_supported:
                    continue
                if u in self._lost:
                    lost_now.append(u)
                    continue
                self._watched.add(u)
            if self._script_t0 is None and uuids:
                self._script_t0 = time.monotonic()
            for u in lost_now:
                self._events.append(HealthEvent(EventKind.GPU_LOST, u, monotonic=time.monotonic()))
        if lost_now:
            self._wake()

    def wait_event(self, timeout_ms: int) -> HealthEvent | None:
        """Block until an event, :meth:`interrupt`, or the timeout (then ``None``)."""
        self._enter()
        deadline = time.monotonic() + max(timeout_ms, 0) / 1000.0
        poller = select.poll()
        poller.register(self._wake_r, select.POLLIN)
        ctl = self._ctl
        if ctl is not None:
            poller.register(ctl.fileno(), select.POLLIN)
        while True:
            self._run_script()
            with self._lock:
                if self._events:
                    event = self._events.popleft()
                    return dataclasses.replace(event, monotonic=time.monotonic())
                if self._interrupted:
                    self._interrupted = False
                    return None
                next_step = self._next_step_at()
            now = time.monotonic()
            remaining = deadline - now
            if remaining <= 0:
                return None
            wait = remaining if next_step is None else min(remaining, max(next_step - now, 0.0))
            ready = poller.poll(max(int(wait * 1000.0 + 0.999), 0))
            for fd, _ in ready:
                if fd == self._wake_r:
                    with contextlib.suppress(BlockingIOError):
                        os.read(self._wake_r, 4096)
                elif ctl is not None and fd == ctl.fileno():
                    self._drain_control(ctl)

    def interrupt(self) -> None:
        """Make the current (or next) :meth:`wait_event` return ``None`` at once."""
        with self._lock:
            self._interrupted = True
        self._wake()

    # ---- in-process control

    def inject(self, event: HealthEvent) -> None:
        """Deliver a health event, as NVML would: dropped unless its GPU is watched."""
        with self._lock:
            parent = self._mig_parent.get(event.uuid, event.uuid)
            if parent not in self._gpus:
                raise NvmlError("NotFound", "no such GPU or MIG device", event.uuid)
            if parent not in self._watched:
                log.debug("fake NVML: event for unwatched GPU dropped", extra={"uuid": event.uuid})
                return
            self._events.append(dataclasses.replace(event, monotonic=time.monotonic()))
        self._wake()

    def set_lost(self, uuid: str, lost: bool) -> None:
        """Make a GPU fall off the bus (calls raise ``GpuIsLost``, a GPU_LOST event) or return."""
        if uuid not in self._gpus:
            raise NvmlError("NotFound", "no such GPU", uuid)
        deliver = False
        with self._lock:
            if lost and uuid not in self._lost:
                self._lost.add(uuid)
                deliver = uuid in self._watched
                if deliver:
                    self._events.append(
                        HealthEvent(EventKind.GPU_LOST, uuid, monotonic=time.monotonic())
                    )
            elif not lost:
                self._lost.discard(uuid)
        if deliver:
            self._wake()

    def set_sample(self, uuid: str, **values: Any) -> None:
        """Override fields of the GPU's readings (GpuSample field names) until changed again."""
        if uuid not in self._gpus:
            raise NvmlError("NotFound", "no such GPU", uuid)
        bad = sorted(set(values) - _SAMPLE_FIELDS)
        if bad:
            raise ConfigError(f"set_sample: unknown GpuSample field {bad[0]!r}")
        if "processes" in values:
            values["processes"] = tuple(
                p if isinstance(p, ProcessSample) else ProcessSample(**p)
                for p in values["processes"]
            )
        with self._lock:
            self._overrides.setdefault(uuid, {}).update(values)

    def set_time_slice(self, uuid: str, level: int) -> None:
        """Set a GPU's time-slice level (0 default, 1 short, 2 medium, 3 long).

        What ``nvidia-smi compute-policy --set-timeslice`` does on a real GPU.

        Raises:
            NvmlError: no such GPU, or the GPU is lost (``GpuIsLost``).
        """
        if level not in (0, 1, 2, 3):
            raise NvmlError("InvalidArgument", f"time-slice level {level} is not 0-3", uuid)
        self._gpu(uuid)
        with self._lock:
            self._time_slices[uuid] = level

    def time_slice(self, uuid: str) -> int:
        """A GPU's time-slice level (0 until set)."""
        with self._lock:
            return self._time_slices.get(uuid, 0)

    def apply_control(self, message: Mapping[str, Any]) -> None:
        """Act on one control message (the JSON of :func:`send_control`).

        Raises:
            ConfigError: the message is malformed (op, uuid, xid or values).
        """
        _validate_message(self.machine, message)
        op, uuid = message["op"], str(message["uuid"])
        if op == "xid":
            self.inject(HealthEvent(EventKind.XID, uuid, xid=int(message["xid"])))
        elif op == "ecc":
            self.inject(HealthEvent(EventKind.ECC_DOUBLE_BIT, uuid))
        elif op == "lost":
            self.set_lost(uuid, True)
        elif op == "recover":
            self.set_lost(uuid, False)
        else:
            self.set_sample(uuid, **dict(message["values"]))

    def close(self) -> None:
        """Release everything (the control socket and the wake pipe); the fake is unusable after."""
        with self._lock:
            self._initialised = False
            self._close_control()
            if not self._closed:
                self._closed = True
                os.close(self._wake_r)
                os.close(self._wake_w)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    # ---- internals

    def _enter(self) -> None:
        if not self._initialised:
            raise NvmlError("Uninitialized", "the fake NVML backend is not initialised")
        self._run_script()

    def _gpu(self, uuid: str) -> FakeGpu:
        self._enter()
        gpu = self._gpus.get(uuid)
        if gpu is None:
            raise NvmlError("NotFound", "no such GPU", uuid)
        with self._lock:
            lost = uuid in self._lost
        if lost:
            raise NvmlError("GpuIsLost", "the GPU has fallen off the bus", uuid)
        return gpu

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._wake_w, b"!")

    def _next_step_at(self) -> float | None:
        if self._script_t0 is None or self._script_next >= len(self.machine.script):
            return None
        return self._script_t0 + self.machine.script[self._script_next].at_ms / 1000.0

    def _run_script(self) -> None:
        while True:
            with self._lock:
                at = self._next_step_at()
                if at is None or at > time.monotonic():
                    return
                step = self.machine.script[self._script_next]
                self._script_next += 1
            self.apply_control(step.message)

    def _bind_control(self, path: Path) -> socket.socket:
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISSOCK(path.lstat().st_mode):
                path.unlink()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        old = os.umask(0o177)
        try:
            sock.bind(str(path))
        except OSError as e:
            sock.close()
            raise ConfigError(f"fake NVML control socket {path}: cannot bind: {e.strerror}") from e
        finally:
            os.umask(old)
        os.chmod(path, 0o600)
        sock.setblocking(False)
        return sock

    def _close_control(self) -> None:
        if self._ctl is not None:
            self._ctl.close()
            self._ctl = None
            if self.control_path is not None:
                with contextlib.suppress(OSError):
                    self.control_path.unlink()

    def _drain_control(self, ctl: socket.socket) -> None:
        while True:
            try:
                data = ctl.recv(65536)
            except (BlockingIOError, OSError):
                return
            try:
                message = json.loads(data)
                self.apply_control(message)
            except (ValueError, RecursionError, ConfigError, NvmlError) as e:
                log.warning(
                    "fake NVML: control message ignored: %s",
                    str(e).splitlines()[0][:200] if str(e) else type(e).__name__,
                    extra={"socket": str(ctl)},
                )


# --------------------------------------------------------------------------- helpers


def send_control(path: str | Path, message: Mapping[str, Any]) -> None:
    """Send one control message to a running fake (e.g. ``{"op": "xid", "uuid": U, "xid": 79}``).

    Raises:
        OSError: nothing listens on ``path``.
    """
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.sendto(json.dumps(dict(message)).encode(), str(path))


def _machine_of(machine: FakeMachine | FakeNvml) -> FakeMachine:
    return machine.machine if isinstance(machine, FakeNvml) else machine


def write_fake_sysfs(machine: FakeMachine | FakeNvml, root: Path) -> None:
    """Create each GPU's PCI device in a fake sysfs, shaped as the kernel lays it out.

    The device lives at ``<root>/devices/pci<domain>:<NN>/<bus id>/`` (with ``numa_node``,
    ``vendor`` and ``class``), one root complex per ``host_bridge`` name (numbered in order
    of appearance; a GPU without one gets a root of its own), and
    ``<root>/bus/pci/devices/<bus id>`` is a relative symlink to it, so readers of the
    PCIe root (``resource.kubernetes.io/pcieRoot``) and of the NUMA node both work.
    """
    roots: dict[str, int] = {}
    for pos, g in enumerate(_machine_of(machine).gpus):
        bus_id = g.info.pci_bus_id
        key = g.host_bridge if g.host_bridge is not None else f"\0gpu{pos}"
        number = roots.setdefault(key, len(roots))
        domain = bus_id.split(":", 1)[0][-4:]
        rel = Path("devices", f"pci{domain}:{number:02x}", bus_id)
        d = root / rel
        d.mkdir(parents=True, exist_ok=True)
        numa = -1 if g.numa_node is None else g.numa_node
        (d / "numa_node").write_text(f"{numa}\n")
        (d / "vendor").write_text("0x10de\n")
        (d / "class").write_text("0x030200\n")
        link = root / "bus" / "pci" / "devices" / bus_id
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.is_symlink():
            link.symlink_to(Path("..", "..", "..", rel))


def write_fake_dev(machine: FakeMachine | FakeNvml, root: Path) -> list[Path]:
    """Create the machine's device nodes under ``root`` as empty regular files; return them.

    ``/dev/nvidia0`` becomes ``<root>/nvidia0``; ``/dev/nvidia-caps/nvidia-cap1``
    becomes ``<root>/nvidia-caps/nvidia-cap1``.
    """
    made: list[Path] = []
    for node in _machine_of(machine).dev_nodes:
        rel = node.removeprefix("/dev/").lstrip("/")
        if not rel or rel == "nvidia-caps":
            (root / "nvidia-caps").mkdir(parents=True, exist_ok=True)
            continue
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.touch()
        made.append(p)
    return made

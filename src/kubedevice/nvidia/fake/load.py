"""Loading a machine file of any of the three kinds; NVML recordings are parsed here.

* an NVML recording of a real machine: what each NVML call answered, including the calls
  that answered NotSupported;
* a load recording (:mod:`.replay`), alone or as ``BASE+LOAD``;
* a synthetic machine (:mod:`.synthetic`).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from kubedevice.errors import ConfigError
from kubedevice.nvidia.backend import (
    ARCHITECTURE_NAMES,
    BRAND_NAMES,
    DriverInfo,
    GpuInfo,
    GpuSample,
)
from kubedevice.nvidia.fake.machine import (
    MACHINES_DIR,
    SYNTHETIC_FORMAT,
    FakeGpu,
    FakeMachine,
    _check_unique,
    _default_dev_nodes,
    _is_load_recording,
    _read_json,
    _strict_int,
    _sysfs_bus_id,
    resolve_machine_path,
)
from kubedevice.nvidia.fake.replay import _apply_load
from kubedevice.nvidia.fake.synthetic import _parse_synthetic

__all__ = ["load_machine"]

_EVENT_MASK = 0x2 | 0x8  # nvmlEventTypeDoubleBitEccError | nvmlEventTypeXidCriticalError


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
        at = "driver"
        driver_version = str(raw["driver"])
        at = "cuda_driver_version"
        cuda = _cuda_version(_strict_int(raw["cuda_driver_version"]))
        at = "nvml_version"
        driver = DriverInfo(driver_version, cuda, str(raw["nvml_version"]))
        numa_by_bus = _recorded_numa(str(raw.get("sys_pci_numa", "")))
        gpus: list[FakeGpu] = []
        at = "devices"
        devices = raw["devices"]
        for i, d in enumerate(devices):
            at = f"devices[{i}]"
            if not isinstance(d, dict):
                raise TypeError("expected an object")
            at = f"devices[{i}].pci"
            pci = d["pci"]
            if not isinstance(pci, dict):
                raise TypeError("expected an object")
            bus_id = str(pci.get("busIdLegacy") or pci["busId"]).lower()
            bus_id = _sysfs_bus_id(bus_id)
            mig_mode = d.get("mig_mode")
            mig_capable = isinstance(mig_mode, list) and not _unsupported(mig_mode)
            cc = d.get("cuda_cc")
            mem = d.get("memory")
            remapped = d.get("remapped_rows")
            temperature = d.get("temperature")
            at = f"devices[{i}].index"
            index = _strict_int(d.get("index", i))
            at = f"devices[{i}].uuid"
            uuid = str(d["uuid"])
            at = f"devices[{i}].minor"
            minor = _strict_int(d["minor"])
            at = f"devices[{i}].name"
            name = str(d["name"])
            at = f"devices[{i}].memory"
            total = _strict_int(mem["total"]) if isinstance(mem, dict) and "total" in mem else 0
            used = _strict_int(mem["used"]) if isinstance(mem, dict) and "used" in mem else None
            at = f"devices[{i}].cuda_cc"
            ccap = (_strict_int(cc[0]), _strict_int(cc[1])) if isinstance(cc, list) else (0, 0)
            at = f"devices[{i}]"
            info = GpuInfo(
                index=index,
                uuid=uuid,
                minor=minor,
                name=name,
                memory_total=total,
                pci_bus_id=bus_id,
                compute_capability=ccap,
                architecture=ARCHITECTURE_NAMES.get(d.get("arch", -1), "unknown"),
                brand=BRAND_NAMES.get(d.get("brand", -1), "unknown"),
                mig_capable=mig_capable,
                mig_enabled=bool(mig_capable and mig_mode and mig_mode[0] == 1),
                serial=str(d["serial"]) if isinstance(d.get("serial"), str) else None,
                numa_node=numa_by_bus.get(bus_id),
            )
            at = f"devices[{i}].remapped_rows"
            sample = GpuSample(
                memory_used=used,
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
    except KeyError as e:
        raise ConfigError(f"{where}: {at}: {e} is missing (an NVML recording)") from None
    except (TypeError, ValueError, IndexError, AttributeError) as e:
        why = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
        raise ConfigError(f"{where}: {at}: bad value in an NVML recording: {why}") from None
    _check_unique(path, "uuid", [g.info.uuid for g in gpus], "devices")
    _check_unique(path, "index", [g.info.index for g in gpus], "devices")
    _check_unique(path, "minor", [g.info.minor for g in gpus], "devices")
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

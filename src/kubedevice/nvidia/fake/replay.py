"""Load recordings: readings taken while a CUDA workload ran, played back as a timeline."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kubedevice.errors import ConfigError
from kubedevice.nvidia.backend import GpuSample, ProcessSample
from kubedevice.nvidia.fake.machine import (
    _MIB,
    FakeMachine,
    _default_dev_nodes,
    _sysfs_bus_id,
)

__all__: list[str] = []


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

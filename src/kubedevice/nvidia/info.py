"""What ``kubedevice nvidia info`` shows: GPUs, MIG devices, the topology matrix, the labels.

:func:`collect_info` gathers it into a JSON-ready dict (``-o json``); :func:`format_info`
renders that dict as text, with a topology matrix in the style of ``nvidia-smi topo -m``
(``X`` self, ``NV#`` # NVLink links, ``PIX``/``PXB``/``PHB``/``NODE``/``SYS`` PCIe paths).
A GPU whose NVML calls fail is listed with the error instead of failing the whole report.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kubedevice.errors import NvmlError
from kubedevice.nvidia.backend import (
    DriverInfo,
    GpuInfo,
    Link,
    MigDeviceInfo,
    NvmlBackend,
    P2PLevel,
)
from kubedevice.nvidia.config import Config
from kubedevice.nvidia.devices import plan_resources, read_numa_node
from kubedevice.nvidia.labels import node_labels
from kubedevice.nvidia.topology import build_topology
from kubedevice.plugin.config import resolve_device_plugin_dir

__all__ = ["LEGEND", "collect_info", "format_info", "link_cell"]

_MIB = 1024 * 1024
_LEVEL_CELL = {
    P2PLevel.INTERNAL: "PIX",
    P2PLevel.SINGLE: "PIX",
    P2PLevel.MULTIPLE: "PXB",
    P2PLevel.HOSTBRIDGE: "PHB",
    P2PLevel.NODE: "NODE",
    P2PLevel.SYSTEM: "SYS",
}
LEGEND = {
    "X": "self",
    "NV#": "a bonded set of # NVLink links",
    "PIX": "at most one PCIe bridge (one PCIe switch)",
    "PXB": "several PCIe bridges, no host bridge",
    "PHB": "a PCIe host bridge (typically the CPU)",
    "NODE": "PCIe and the interconnect between host bridges of one NUMA node",
    "SYS": "PCIe and the SMP interconnect between NUMA nodes (e.g. QPI/UPI)",
    "N/A": "NVML cannot tell",
}


def link_cell(link: Link | None) -> str:
    """One matrix cell: ``NV#`` when NVLink connects the pair, else the PCIe path."""
    if link is None:
        return "N/A"
    if link.nvlinks > 0:
        return f"NV{link.nvlinks}"
    return _LEVEL_CELL.get(link.level, "SYS")


def _mig_dict(m: MigDeviceInfo) -> dict[str, Any]:
    return {
        "uuid": m.uuid,
        "index": m.index,
        "profile": m.profile,
        "gi_id": m.gi_id,
        "ci_id": m.ci_id,
        "memory_total": m.memory_total,
        "memory_mib": m.memory_total // _MIB,
        "cap_minors": list(m.cap_minors),
    }


def _gpu_dict(g: GpuInfo, numa: int | None) -> dict[str, Any]:
    return {
        "index": g.index,
        "uuid": g.uuid,
        "minor": g.minor,
        "name": g.name,
        "memory_total": g.memory_total,
        "memory_mib": g.memory_total // _MIB,
        "pci_bus_id": g.pci_bus_id,
        "numa_node": numa,
        "compute_capability": f"{g.compute_capability[0]}.{g.compute_capability[1]}",
        "architecture": g.architecture,
        "brand": g.brand,
        "serial": g.serial,
        "mig_capable": g.mig_capable,
        "mig_enabled": g.mig_enabled,
        "mig_devices": [],
    }


def collect_info(
    backend: NvmlBackend,
    sys_root: Path,
    *,
    driver: DriverInfo | None = None,
    config: Config | None = None,
    mig_strategy: str | None = None,
    device_plugin_dir: str | os.PathLike[str] | None = None,
) -> dict[str, Any]:
    """Everything ``nvidia info`` reports, as plain JSON types.

    The config is checked against the GPUs exactly as ``nvidia run`` checks it
    (:func:`~kubedevice.nvidia.devices.plan_resources`), and the labels are those it
    would write (:func:`~kubedevice.nvidia.labels.node_labels`).

    Args:
        backend: The NVML backend; ``init()`` is called unless ``driver`` is given.
        sys_root: Where sysfs is (``/sys``), for each GPU's NUMA node; a GPU sysfs does
            not know takes the backend's (a fake machine's) NUMA node.
        driver: The answer of an earlier ``backend.init()``.
        config: The config (``None``: the defaults).
        mig_strategy: Overrides ``flags.migStrategy``.
        device_plugin_dir: The device plugin directory ``nvidia run`` would serve in, for
            the socket paths' length (``None``: ``$DP_DEVICE_PLUGIN_DIR`` or the default,
            as for ``nvidia run``).

    Raises:
        NvmlError: NVML cannot be initialised or the GPUs cannot be listed.
        ConfigError: ``nvidia run`` would refuse the config on these GPUs.
    """
    if config is None:
        config = Config(version="v1")
    if mig_strategy is not None:
        config = config.with_overrides(mig_strategy=mig_strategy)
    if driver is None:
        driver = backend.init()
    gpus = backend.gpus()
    numa = {g.uuid: read_numa_node(sys_root, g.pci_bus_id, g.numa_node) for g in gpus}
    out_gpus: list[dict[str, Any]] = []
    mig: dict[str, list[MigDeviceInfo]] = {}
    for g in gpus:
        d = _gpu_dict(g, numa[g.uuid])
        if g.mig_enabled:
            try:
                mig[g.uuid] = backend.mig_devices(g.uuid)
                d["mig_devices"] = [_mig_dict(m) for m in mig[g.uuid]]
            except NvmlError as e:
                d["error"] = str(e)
        try:
            backend.probe(g.uuid)
        except NvmlError as e:
            d["error"] = str(e)
        out_gpus.append(d)
    # what `nvidia run` would refuse, refused here
    plan_resources(
        config, gpus, mig, device_plugin_dir=resolve_device_plugin_dir(device_plugin_dir)
    )
    topo = build_topology(backend, gpus, numa)
    names = [f"GPU{g.index}" for g in gpus]
    matrix = [
        ["X" if a.uuid == b.uuid else link_cell(topo.link(a.uuid, b.uuid)) for b in gpus]
        for a in gpus
    ]
    labels = node_labels(config, driver, gpus, mig)
    return {
        "driver": {
            "driver_version": driver.driver_version,
            "cuda_version": driver.cuda_version,
            "nvml_version": driver.nvml_version,
        },
        "gpus": out_gpus,
        "topology": {
            "gpus": names,
            "matrix": matrix,
            "numa_nodes": [numa[g.uuid] for g in gpus],
            "legend": dict(LEGEND),
        },
        "labels": labels,
    }


def _table(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def format_info(info: Mapping[str, Any]) -> str:
    """The text form of :func:`collect_info`'s dict."""
    d = info["driver"]
    lines = [
        f"Driver {d['driver_version']}  CUDA {d['cuda_version'] or '-'}  "
        f"NVML {d['nvml_version'] or '-'}",
        "",
    ]
    gpus = info["gpus"]
    if not gpus:
        lines.append("No GPUs.")
    else:
        rows = [["GPU", "UUID", "NAME", "MEMORY", "BUS ID", "NUMA", "CC", "ARCH", "MIG"]]
        for g in gpus:
            mig = "enabled" if g["mig_enabled"] else ("capable" if g["mig_capable"] else "-")
            rows.append(
                [
                    str(g["index"]),
                    g["uuid"],
                    g["name"],
                    f"{g['memory_mib']}MiB",
                    g["pci_bus_id"],
                    "-" if g["numa_node"] is None else str(g["numa_node"]),
                    g["compute_capability"],
                    g["architecture"],
                    mig,
                ]
            )
        lines += _table(rows)
        for g in gpus:
            if g.get("error"):
                lines.append(f"GPU{g['index']}: {g['error']}")
        migs = [(g, m) for g in gpus for m in g["mig_devices"]]
        if migs:
            lines += ["", "MIG devices"]
            rows = [["GPU", "MIG", "UUID", "PROFILE", "GI", "CI", "MEMORY", "CAPS"]]
            for g, m in migs:
                rows.append(
                    [
                        str(g["index"]),
                        str(m["index"]),
                        m["uuid"],
                        m["profile"],
                        str(m["gi_id"]),
                        str(m["ci_id"]),
                        f"{m['memory_mib']}MiB",
                        ",".join(f"nvidia-cap{c}" for c in m["cap_minors"]) or "-",
                    ]
                )
            lines += _table(rows)
        topo = info["topology"]
        lines += ["", "Topology"]
        rows = [["", *topo["gpus"], "NUMA"]]
        for name, cells, node in zip(topo["gpus"], topo["matrix"], topo["numa_nodes"], strict=True):
            rows.append([name, *cells, "-" if node is None else str(node)])
        lines += _table(rows)
        used = {c for row in topo["matrix"] for c in row}
        legend = [
            (k, v)
            for k, v in topo["legend"].items()
            if k in used or (k == "NV#" and any(c.startswith("NV") for c in used))
        ]
        if legend:
            lines += ["", "Legend:"]
            lines += [f"  {k:<4} = {v}" for k, v in legend]
    lines += ["", "Node labels (NFD feature file)"]
    lines += [f"  {k}={v}" for k, v in sorted(info["labels"].items())]
    return "\n".join(lines) + "\n"

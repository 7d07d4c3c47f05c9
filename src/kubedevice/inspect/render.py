"""``kubedevice inspect`` output: a plain-text report with tables, or one JSON document."""

from __future__ import annotations

from collections import Counter
from typing import Any

from kubedevice._api import HEALTHY
from kubedevice.inspect.node import NodeReport

__all__ = ["to_json", "to_text"]


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in [header, *rows]
    ]


def _options(pre_start: bool | None, preferred: bool | None) -> str:
    if pre_start is None:
        return "-"
    opts = [n for n, on in (("preStart", pre_start), ("preferred", preferred)) if on]
    return ",".join(opts) or "none"


def to_text(report: NodeReport) -> str:
    """The human-readable report."""
    out = [
        f"device plugin dir  {report.device_plugin_dir}",
        f"kubelet.sock       {report.kubelet_socket}",
        f"PodResources       {report.pod_resources_socket}",
        "",
        "PLUGINS",
    ]
    rows = []
    for p in report.plugins:
        health = p.health
        rows.append(
            [
                p.socket,
                p.resource or "?",
                p.state,
                str(len(p.devices)) if p.state == "ok" else "-",
                str(health.get(HEALTHY, 0)) if p.state == "ok" else "-",
                str(len(p.devices) - health.get(HEALTHY, 0)) if p.state == "ok" else "-",
                " ".join(f"{k}:{v}" for k, v in p.numa.items()) or "-",
                _options(p.pre_start_required, p.get_preferred_allocation_available),
                f"{p.seconds * 1000:.0f}ms",
            ]
        )
    header = ["SOCKET", "RESOURCE", "STATE", "DEVICES", "HEALTHY", "UNHEALTHY", "NUMA"]
    out += _table([*header, "OPTIONS", "TIME"], rows) if rows else ["  (no plugin sockets)"]
    cp = report.checkpoint
    out.append("")
    if cp is None:
        out.append("CHECKPOINT  (not read)")
    else:
        verdict = "ok" if cp.checksum_ok else "MISMATCH"
        out.append(
            f"CHECKPOINT  {len(cp.entries or ())} allocation(s), checksum {verdict} "
            f"({cp.checksum_file})"
        )
        allocated: Counter[str] = Counter()
        for e in cp.entries or ():
            allocated[e.resource] += len(e.device_ids)
        resources = sorted(set(cp.registered or {}) | set(allocated))
        rows = [
            [r, str(len((cp.registered or {}).get(r) or ())), str(allocated[r])] for r in resources
        ]
        if rows:
            out += _table(["RESOURCE", "REGISTERED", "ALLOCATED"], rows)
    view = report.pod_resources
    out.append("")
    if view is None:
        out.append("POD RESOURCES  (not read)")
    else:
        alloc = view.allocatable
        counts = (
            ", ".join(f"{r}: {len(ids)}" for r, ids in sorted(alloc.items())) or "none"
            if alloc is not None
            else "unknown"
        )
        out.append(f"POD RESOURCES  allocatable: {counts}")
        rows = [
            [f"{a.namespace}/{a.pod}", a.container, a.resource, ",".join(a.device_ids)]
            for a in sorted(view.assigned, key=lambda a: (a.namespace, a.pod, a.container))
        ]
        if rows:
            out += _table(["POD", "CONTAINER", "RESOURCE", "DEVICES"], rows)
        else:
            out.append("  (no pod holds a device)")
    out += ["", "PROBLEMS"]
    problems = [f"  {'input':<8}{e}" for e in report.input_errors]
    ordered = sorted(report.findings, key=lambda f: f.severity != "error")
    problems += [f"  {f.severity:<8}{f.message}" for f in ordered]
    out += problems or ["  none"]
    out.append(f"\n({report.seconds:.2f} s)")
    return "\n".join(out)


def to_json(report: NodeReport) -> dict[str, Any]:
    """The report as plain JSON-ready values."""
    cp = report.checkpoint
    view = report.pod_resources
    return {
        "devicePluginDir": str(report.device_plugin_dir),
        "podResourcesSocket": str(report.pod_resources_socket),
        "kubeletSocket": report.kubelet_socket,
        "plugins": [
            {
                "socket": p.socket,
                "resource": p.resource,
                "state": p.state,
                "detail": p.detail,
                "options": None
                if p.pre_start_required is None
                else {
                    "preStartRequired": p.pre_start_required,
                    "getPreferredAllocationAvailable": p.get_preferred_allocation_available,
                },
                "devices": len(p.devices),
                "health": dict(p.health),
                "numa": p.numa,
                "unhealthy": p.unhealthy,
                "seconds": round(p.seconds, 4),
            }
            for p in report.plugins
        ],
        "checkpoint": None
        if cp is None
        else {
            "path": str(cp.path),
            "checksumOk": cp.checksum_ok,
            "checksumFile": cp.checksum_file,
            "checksumComputed": cp.checksum_computed,
            "registered": {k: list(v or ()) for k, v in (cp.registered or {}).items()},
            "entries": [
                {
                    "podUID": e.pod_uid,
                    "container": e.container,
                    "resource": e.resource,
                    "deviceIDs": e.device_ids,
                }
                for e in cp.entries or ()
            ],
        },
        "podResources": None
        if view is None
        else {
            "allocatable": view.allocatable,
            "assigned": [
                {
                    "namespace": a.namespace,
                    "pod": a.pod,
                    "container": a.container,
                    "resource": a.resource,
                    "deviceIDs": list(a.device_ids),
                }
                for a in view.assigned
            ],
        },
        "findings": [
            {"severity": f.severity, "code": f.code, "message": f.message} for f in report.findings
        ],
        "inputErrors": report.input_errors,
        "seconds": round(report.seconds, 4),
    }

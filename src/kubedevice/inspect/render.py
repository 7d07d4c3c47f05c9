"""``kubedevice inspect`` output: a plain-text report with tables, or one JSON document."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from kubedevice._api import HEALTHY
from kubedevice.inspect.node import NodeReport

__all__ = ["safe", "to_json", "to_text"]


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def safe(text: str) -> str:
    """``text`` with control characters escaped (``\\n``, ``\\x1b``...): names read from
    the node (socket files, pods, device IDs) must not print a forged line."""
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    rows = [[safe(cell) for cell in row] for row in rows]
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


def _numa(counts: dict[str, int]) -> str:
    return " ".join(f"{k}:{v}" for k, v in counts.items()) or "-"


def _plugins(report: NodeReport) -> list[str]:
    rows = []
    for p in report.plugins:
        row = [p.socket, p.resource or "?", p.state]
        if report.streamed:
            listed = p.devices is not None
            health = p.health
            n = len(p.devices or ())
            row += [
                str(n) if listed else "-",
                str(health.get(HEALTHY, 0)) if listed else "-",
                str(n - health.get(HEALTHY, 0)) if listed else "-",
                _numa(p.numa),
            ]
        row += [
            _options(p.pre_start_required, p.get_preferred_allocation_available),
            f"{p.seconds * 1000:.0f}ms",
        ]
        rows.append(row)
    header = ["SOCKET", "RESOURCE", "STATE"]
    if report.streamed:
        header += ["DEVICES", "HEALTHY", "UNHEALTHY", "NUMA"]
    return _table([*header, "OPTIONS", "TIME"], rows) if rows else ["  (no plugin sockets)"]


def _checkpoint(report: NodeReport) -> list[str]:
    cp = report.checkpoint
    if cp is None:
        return ["CHECKPOINT  (not read)"]
    verdict = "ok" if cp.checksum_ok else "MISMATCH"
    out = [
        f"CHECKPOINT  {len(cp.entries or ())} allocation(s), checksum {verdict} "
        f"({cp.checksum_file})"
    ]
    allocated: Counter[str] = Counter()
    for e in cp.entries or ():
        allocated[e.resource] += len(e.device_ids)
    resources = sorted(set(cp.registered or {}) | set(allocated))
    rows = [[r, str(len((cp.registered or {}).get(r) or ())), str(allocated[r])] for r in resources]
    if rows:
        out += _table(["RESOURCE", "HEALTHY AT LAST WRITE", "ALLOCATED"], rows)
    if report.pod_resources is None and cp.entries:
        # no PodResources to name the pods: the checkpoint's own entries, per pod UID
        out.append("")
        entries = sorted(cp.entries, key=lambda e: (e.pod_uid, e.container, e.resource))
        out += _table(
            ["POD UID", "CONTAINER", "RESOURCE", "DEVICES"],
            [[e.pod_uid, e.container, e.resource, ",".join(e.device_ids)] for e in entries],
        )
    return out


def _pod_resources(report: NodeReport) -> list[str]:
    view = report.pod_resources
    if view is None:
        return ["POD RESOURCES  (not read)"]
    out = ["POD RESOURCES"]
    alloc = view.allocatable
    if alloc is None:
        out.append("  allocatable: unknown")
    else:
        in_use: dict[str, set[str]] = {}
        for a in view.assigned:
            in_use.setdefault(a.resource, set()).update(a.device_ids)
        rows = [
            [
                r,
                str(len(ids)),
                _numa(view.allocatable_numa.get(r, {})),
                str(len(in_use.get(r, set()) & set(ids))),
            ]
            for r, ids in sorted(alloc.items())
        ]
        if rows:
            out += _table(["RESOURCE", "ALLOCATABLE (HEALTHY)", "NUMA", "IN USE"], rows)
        else:
            out.append("  allocatable: none")
    rows = [
        [f"{a.namespace}/{a.pod}", a.container, a.resource, ",".join(a.device_ids)]
        for a in sorted(view.assigned, key=lambda a: (a.namespace, a.pod, a.container))
    ]
    out.append("")
    if rows:
        out += _table(["POD", "CONTAINER", "RESOURCE", "DEVICES"], rows)
    else:
        out.append("  (no pod holds a device)")
    return out


def to_text(report: NodeReport) -> str:
    """The human-readable report (every name read from the node escaped: see :func:`safe`)."""
    out = [
        f"device plugin dir  {safe(str(report.device_plugin_dir))}",
        f"kubelet.sock       {safe(report.kubelet_socket)}",
        f"PodResources       {safe(str(report.pod_resources_socket))}",
        "",
        "PLUGINS" + ("  (their own lists: --list-and-watch)" if report.streamed else ""),
    ]
    out += _plugins(report)
    out.append("")
    out += _checkpoint(report)
    out.append("")
    out += _pod_resources(report)
    out += ["", "PROBLEMS"]
    problems = [f"  {'input':<8}{safe(e)}" for e in report.input_errors]
    ordered = sorted(report.findings, key=lambda f: f.severity != "error")
    problems += [f"  {f.severity:<8}{safe(f.message)}" for f in ordered]
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
        "streamed": report.streamed,
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
                "devices": None if p.devices is None else len(p.devices),
                "health": None if p.devices is None else dict(p.health),
                "numa": None if p.devices is None else p.numa,
                "unhealthy": None if p.devices is None else p.unhealthy,
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
            "healthyAtLastWrite": {k: list(v or ()) for k, v in (cp.registered or {}).items()},
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
            "allocatableNuma": view.allocatable_numa,
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

"""Plain-text tables of the emulator's state (node, pods, runtime view) for people.

Works on the JSON-ready dicts of :mod:`kubedevice.kubelet.types` (``to_dict()``), which is
also what the control socket returns, so the CLI and the demo print the same tables.
"""

from __future__ import annotations

from typing import Any

__all__ = ["node_text", "pods_table", "runtime_text", "table"]


def table(rows: list[list[str]]) -> str:
    """Left-aligned columns separated by two spaces, like kubectl."""
    if not rows:
        return ""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
    )


def node_text(node: dict[str, Any], *, devices: bool = True) -> str:
    """Capacity / allocatable per resource, then per-device health (``kubectl describe node``)."""
    res = node["resources"]
    rows = [["RESOURCE", "CAPACITY", "ALLOCATABLE", "ALLOCATED", "PLUGIN"]]
    for name, r in res.items():
        state = "connected" if r["connected"] else f"stopped {r['stopped_for_s']:.0f}s ago"
        rows.append([name, str(r["capacity"]), str(r["allocatable"]), str(r["allocated"]), state])
    out = table(rows)
    devrows = [["RESOURCE", "DEVICE", "HEALTH", "NUMA"]]
    for name, r in res.items():
        for d in r["devices"]:
            numa = ",".join(str(x) for x in d["numa"]) or "-"
            devrows.append([name, d["id"], d["health"], numa])
    if devices and len(devrows) > 1:
        out += "\n\n" + table(devrows)
    return out


def pods_table(pods: list[dict[str, Any]]) -> str:
    """One row per (pod, container, resource) with the devices it holds."""
    rows = [["NAMESPACE", "NAME", "CONTAINER", "KIND", "RESOURCE", "DEVICES", "STARTED"]]
    for p in pods:
        for c in p["containers"]:
            devices = c["devices"] or {"-": []}
            for res, ids in devices.items():
                rows.append(
                    [
                        p["namespace"],
                        p["name"],
                        c["name"],
                        c["kind"],
                        res,
                        ",".join(ids) or "-",
                        "yes" if c["started"] else f"no ({c['start_error']})",
                    ]
                )
    return table(rows)


def runtime_text(pod: dict[str, Any], *, with_table: bool = True) -> str:
    """What the runtime would get for each container of ``pod`` (contract.md#container-view)."""
    lines = [pods_table([pod])] if with_table else []
    for c in pod["containers"]:
        rt = c["runtime"]
        lines.append(f"container {pod['name']}/{c['name']}:")
        for k, v in rt["envs"].items():
            lines.append(f"  env     {k}={v}")
        for m in rt["mounts"]:
            ro = " (ro)" if m["read_only"] else ""
            lines.append(f"  mount   {m['host_path']} -> {m['container_path']}{ro}")
        for d in rt["devices"]:
            lines.append(f"  device  {d['host_path']} -> {d['container_path']} {d['permissions']}")
        for k, v in rt["annotations"].items():
            lines.append(f"  annot   {k}={v}")
        for name in rt["cdi_devices"]:
            lines.append(f"  cdi     {name}")
        for conflict in rt["conflicts"]:
            lines.append(f"  CONFLICT {conflict}")
    return "\n".join(lines)

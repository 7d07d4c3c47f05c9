"""The CDI dir as a container runtime reads it: specs, fully qualified device IDs, validity.

A runtime loads every ``*.json`` and ``*.yaml`` spec in the directory and resolves a CDI ID
``vendor/class=name`` to the device ``name`` of the spec whose ``kind`` is ``vendor/class``;
it refuses a spec without ``cdiVersion`` or ``kind``, with an unnamed or duplicate device, or
a device without edits, and a container whose device node does not exist fails to start.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

__all__ = ["CdiDir", "CdiSpec"]

_KIND = re.compile(r"^[a-z0-9][a-z0-9.-]*[a-z0-9]/[a-zA-Z0-9][a-zA-Z0-9_.-]*$")
_DEVICE = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.:-]*$")


@dataclass(frozen=True)
class CdiSpec:
    """One spec file: its path, its content, and what is wrong with it ("" when valid)."""

    path: Path
    data: dict[str, Any]
    problem: str

    @property
    def kind(self) -> str:
        """The spec's ``kind``."""
        return str(self.data.get("kind", ""))

    def device(self, name: str) -> dict[str, Any] | None:
        """The spec device ``name``."""
        for d in self.data.get("devices") or []:
            if isinstance(d, dict) and d.get("name") == name:
                return d
        return None


def _edits_problem(edits: Any, where: str, host_root: Path) -> str:
    if not isinstance(edits, dict):
        return f"{where}: containerEdits is not an object"
    for node in edits.get("deviceNodes") or []:
        host = node.get("hostPath") or node.get("path") if isinstance(node, dict) else None
        if not host:
            return f"{where}: a device node without a path"
        if not (host_root / str(host).lstrip("/")).exists():
            return f"{where}: device node {host} does not exist" + (
                f" (under {host_root})" if str(host_root) != "/" else ""
            )
    return ""


def _problem(data: Any, host_root: Path) -> str:
    if not isinstance(data, dict):
        return "not an object"
    if not data.get("cdiVersion"):
        return "no cdiVersion"
    if not _KIND.match(str(data.get("kind", ""))):
        return f"kind {data.get('kind')!r} is not vendor/class"
    devices = data.get("devices")
    if not devices or not isinstance(devices, list):
        return "no devices"
    seen: set[str] = set()
    for d in devices:
        name = str(d.get("name", "")) if isinstance(d, dict) else ""
        if not _DEVICE.match(name) or name in seen:
            return f"device name {name!r} is empty, invalid or repeated"
        seen.add(name)
        edits = d.get("containerEdits")
        if not edits:
            return f"device {name!r} has no containerEdits"
        why = _edits_problem(edits, f"device {name!r}", host_root)
        if why:
            return why
    if "containerEdits" in data:
        return _edits_problem(data["containerEdits"], "the spec's containerEdits", host_root)
    return ""


class CdiDir:
    """The specs of one CDI directory, read afresh by each call.

    ``host_root`` is where the host's files are: device nodes are looked up under it (``/``
    on a real node; a fake tree's root for a driver run on a fake ``/dev``).
    """

    def __init__(self, path: Path, host_root: Path = Path("/")) -> None:
        self.path = path
        self.host_root = host_root

    def specs(self) -> list[CdiSpec]:
        """Every spec file there (one that cannot be parsed is a spec with a problem)."""
        out = []
        for p in sorted(self.path.glob("*")):
            if p.suffix not in (".json", ".yaml") or not p.is_file():
                continue
            try:
                text = p.read_text()
                data = json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
            except (OSError, ValueError, yaml.YAMLError) as exc:
                out.append(CdiSpec(p, {}, f"cannot be read: {exc}"))
                continue
            out.append(
                CdiSpec(p, data if isinstance(data, dict) else {}, _problem(data, self.host_root))
            )
        return out

    def resolve(self, cdi_id: str) -> tuple[CdiSpec, dict[str, Any]] | str:
        """The spec and device of a fully qualified CDI ID, or why it does not resolve."""
        kind, sep, name = cdi_id.partition("=")
        if not sep or not _KIND.match(kind):
            return f"{cdi_id!r} is not a fully qualified CDI ID (vendor/class=name)"
        found = [(s, d) for s in self.specs() if s.kind == kind and (d := s.device(name))]
        if not found:
            return f"no spec in {self.path} has device {cdi_id}"
        if len(found) > 1:
            return f"{len(found)} specs define {cdi_id} (a runtime refuses the conflict)"
        return found[0]

    def ids(self) -> set[str]:
        """Every fully qualified device ID the specs define."""
        return {
            f"{s.kind}={d.get('name')}"
            for s in self.specs()
            for d in s.data.get("devices") or []
            if isinstance(d, dict)
        }

    def wipe(self) -> None:
        """Remove every file (a reboot of a node whose CDI dir is a tmpfs)."""
        for p in self.path.iterdir():
            if p.is_file() or p.is_symlink():
                p.unlink()

"""One CDI spec per prepared claim, written atomically, named after the claim's UID.

The spec's kind is ``k8s.<driver>/claim`` and each device of the claim is
``<claim UID>-<device name>`` in it, so the CDI ID the kubelet hands to the runtime is
``k8s.<driver>/claim=<claim UID>-<device name>``. The file is
``<cdi dir>/k8s.<driver>-claim_<claim UID>.json``; nothing else in the directory is touched.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from kubedevice.dra.types import ContainerEdits
from kubedevice.plugin.files import write_atomically

__all__ = ["CDI_VERSION", "CdiWriter"]

log = logging.getLogger(__name__)

#: The CDI spec version written (hostPath device nodes and mounts; containerd 1.7+, CRI-O).
CDI_VERSION: Final = "0.5.0"

_UID: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$")


class CdiWriter:
    """Writes and removes the claims' CDI specs of one driver in ``cdi_dir``."""

    def __init__(self, cdi_dir: Path, driver_name: str) -> None:
        self.cdi_dir = cdi_dir
        self.driver_name = driver_name
        self.kind = f"k8s.{driver_name}/claim"

    def cdi_id(self, claim_uid: str, device: str) -> str:
        """The fully qualified CDI device ID of ``device`` in claim ``claim_uid``."""
        return f"{self.kind}={claim_uid}-{device}"

    def path(self, claim_uid: str) -> Path:
        """The spec file of claim ``claim_uid``."""
        if not _UID.match(claim_uid) or "/" in claim_uid:
            raise ValueError(f"claim UID {claim_uid!r} cannot name a CDI spec file")
        return self.cdi_dir / f"k8s.{self.driver_name}-claim_{claim_uid}.json"

    def write(self, claim_uid: str, devices: Sequence[tuple[str, ContainerEdits]]) -> None:
        """Write (atomically replace) the spec of claim ``claim_uid``.

        Args:
            claim_uid: The claim's UID.
            devices: ``(device name, edits)`` for each device that has edits.

        Raises:
            OSError: The directory or file cannot be written.
        """
        spec = {
            "cdiVersion": CDI_VERSION,
            "kind": self.kind,
            "devices": [
                {"name": f"{claim_uid}-{name}", "containerEdits": _edits(edits)}
                for name, edits in devices
            ],
        }
        self.cdi_dir.mkdir(parents=True, exist_ok=True)
        write_atomically(
            self.path(claim_uid), json.dumps(spec, indent=2, sort_keys=True), mode=0o644
        )

    def remove(self, claim_uid: str) -> bool:
        """Remove the spec of claim ``claim_uid``; whether there was one."""
        try:
            self.path(claim_uid).unlink()
        except FileNotFoundError:
            return False
        except ValueError:
            return False
        return True

    def remove_all(self) -> int:
        """Remove every spec this driver wrote; how many."""
        prefix = f"k8s.{self.driver_name}-claim_"
        removed = 0
        try:
            entries = list(self.cdi_dir.iterdir())
        except FileNotFoundError:
            return 0
        for entry in entries:
            if entry.name.startswith(prefix) and entry.name.endswith(".json"):
                if entry.is_symlink() or not entry.is_file():
                    continue  # never follow or remove what we did not write
                with contextlib.suppress(FileNotFoundError):
                    entry.unlink()
                    removed += 1
        return removed


def _edits(edits: ContainerEdits) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if edits.env:
        out["env"] = [f"{key}={value}" for key, value in sorted(edits.env.items())]
    if edits.device_nodes:
        out["deviceNodes"] = [
            {
                "path": node.path,
                **({"hostPath": node.host_path} if node.host_path else {}),
                "permissions": node.permissions,
            }
            for node in edits.device_nodes
        ]
    if edits.mounts:
        out["mounts"] = [
            {
                "hostPath": mount.host_path,
                "containerPath": mount.container_path,
                "options": ["ro" if mount.read_only else "rw", "nosuid", "nodev", "bind"],
            }
            for mount in edits.mounts
        ]
    return out

"""One CDI spec per prepared claim, written atomically, named after the claim's UID.

The spec's kind is ``k8s.<driver>/claim`` and each device of the claim is
``<claim UID>-<device name>`` in it, so the CDI ID the kubelet hands to the runtime is
``k8s.<driver>/claim=<claim UID>-<device name>``, or ``...-<device name>-<share ID>`` for
a share of a device that allows multiple allocations (a device allocated to two requests of
one claim with different edits gets ``<claim UID>-<device name>_<n>`` for the second: ``_``
is in no device name, so the names stay unique). The file is
``<cdi dir>/k8s.<driver>-claim_<claim UID>.json``; nothing else in the directory is touched.

Only specs a CDI runtime accepts are written (:func:`kubedevice.plugin.cdi.validate_spec`):
a device without edits is left out of the spec (and gets no CDI ID), and a claim none of
whose devices has edits gets no spec file at all (a spec without devices is refused).
:meth:`CdiWriter.ensure` writes a spec again when it is missing or differs, so that a spec
lost with the CDI dir (a tmpfs, emptied by a reboot) comes back from the checkpoint.
A spec is not fsynced: the runtime reads it from the page cache, and after a power loss
the driver's start writes every prepared claim's spec again from the (synced) checkpoint.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from kubedevice._regular_file import read_regular
from kubedevice.dra.model.types import ContainerEdits
from kubedevice.errors import ConfigError
from kubedevice.plugin.cdi import validate_spec
from kubedevice.plugin.files import write_atomically

__all__ = ["CDI_VERSION", "CdiWriter", "cdi_edits"]

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

    def qualified(self, name: str) -> str:
        """The fully qualified CDI device ID of the spec device ``name``."""
        return f"{self.kind}={name}"

    def path(self, claim_uid: str) -> Path:
        """The spec file of claim ``claim_uid``."""
        if not _UID.match(claim_uid) or "/" in claim_uid:
            raise ValueError(f"claim UID {claim_uid!r} cannot name a CDI spec file")
        return self.cdi_dir / f"k8s.{self.driver_name}-claim_{claim_uid}.json"

    def text(self, claim_uid: str, devices: Sequence[tuple[str, Mapping[str, Any]]]) -> str:
        """The spec of claim ``claim_uid`` as written (JSON text).

        Args:
            claim_uid: The claim's UID.
            devices: ``(spec device name, CDI containerEdits)`` of each device with edits;
                a name given twice (one device in two requests, same edits) is written once.

        Raises:
            ConfigError: A CDI runtime would refuse the spec (the message says which rule).
        """
        entries: dict[str, Mapping[str, Any]] = {}
        for name, edits in devices:
            if entries.setdefault(name, edits) != edits:
                raise ConfigError(f"CDI spec: device name {name!r} with two different edits")
        if not entries:
            raise ConfigError("CDI spec: no device has edits (a spec without devices is refused)")
        spec = {
            "cdiVersion": CDI_VERSION,
            "kind": self.kind,
            "devices": [
                {"name": name, "containerEdits": dict(edits)} for name, edits in entries.items()
            ],
        }
        validate_spec(spec)
        # compact: the C encoder (an indented spec goes through json's Python encoder,
        # 0.06-0.17 ms on the loop per prepare on the 2-core KVM guest, against 0.01)
        return json.dumps(spec, sort_keys=True, separators=(",", ":"))

    def write(self, claim_uid: str, devices: Sequence[tuple[str, Mapping[str, Any]]]) -> None:
        """Write (atomically replace) the spec of claim ``claim_uid``; with no device, remove it.

        Raises:
            ConfigError: A CDI runtime would refuse the spec.
            OSError: The directory or file cannot be written.
        """
        self.put(claim_uid, self.text(claim_uid, devices) if devices else None)

    def put(self, claim_uid: str, text: str | None) -> None:
        """Write (atomically replace) the spec of claim ``claim_uid`` as ``text`` (made by
        :meth:`text`); with ``None``, remove it.

        Raises:
            OSError: The directory or file cannot be written.
        """
        if text is None:
            self.remove(claim_uid)
            return
        self.cdi_dir.mkdir(parents=True, exist_ok=True)
        write_atomically(self.path(claim_uid), text, mode=0o644, sync=False)

    def ensure(self, claim_uid: str, devices: Sequence[tuple[str, Mapping[str, Any]]]) -> bool:
        """Write the spec of claim ``claim_uid`` unless the file holds exactly it already.

        Returns:
            Whether the file was (re)written (it was missing, different, or not a file).

        Raises:
            ConfigError: A CDI runtime would refuse the spec.
            OSError: The directory or file cannot be written.
        """
        if not devices:
            return self.remove(claim_uid)
        text = self.text(claim_uid, devices)
        try:
            # an earlier version's indented spec of the same content is kept as it is
            held = read_regular(self.path(claim_uid), 16 * len(text) + 4096)
            if held == text.encode() or _same_json(held, text):
                return False
        except OSError:
            pass  # missing, or not a regular file: written below (a rename replaces it)
        self.cdi_dir.mkdir(parents=True, exist_ok=True)
        write_atomically(self.path(claim_uid), text, mode=0o644, sync=False)
        return True

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


def cdi_edits(edits: ContainerEdits) -> dict[str, Any]:
    """``edits`` as CDI ``containerEdits`` (JSON); empty when there are none."""
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


def _same_json(held: bytes, text: str) -> bool:
    """Whether the file's bytes ``held`` are the JSON of ``text`` (in another layout)."""
    try:
        return bool(json.loads(held) == json.loads(text))
    except ValueError:
        return False

"""The prepared-claim checkpoint: which claims this driver prepared, with what answer.

A JSON file in the driver's plugin dir, replaced atomically on every change, with a SHA-256
checksum over its claims (the driver's per-device ``data`` included). A device without data
has no ``data`` key, so a file written before there was one reads the same and a driver that
keeps none writes what older versions wrote. A file that cannot be read back (bad JSON,
wrong checksum, wrong shape, a symlink) is moved aside as ``<name>.corrupt-<time>`` with a
warning and the driver starts empty, so a restarted driver can still unprepare what it
prepared before whenever the file is sound.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final

from kubedevice.dra.types import ClaimRef, PreparedClaim
from kubedevice.plugin.files import write_atomically

__all__ = ["CHECKPOINT_VERSION", "Checkpoint"]

log = logging.getLogger(__name__)

CHECKPOINT_VERSION: Final = 1
_MAX_BYTES: Final = 64 << 20


class Checkpoint:
    """The prepared claims by UID, loaded from and saved to ``path``."""

    def __init__(self, path: Path, driver_name: str) -> None:
        self.path = path
        self.driver_name = driver_name
        self.claims: dict[str, PreparedClaim] = {}

    def load(self) -> None:
        """Read the file (missing: empty; unreadable: moved aside, empty)."""
        self.claims = {}
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            return
        except OSError as exc:
            self._move_aside(f"cannot be opened ({exc})")
            return
        with os.fdopen(fd, "rb") as handle:
            raw = handle.read(_MAX_BYTES + 1)
        try:
            self.claims = _decode(raw, self.driver_name)
        except (ValueError, KeyError, TypeError) as exc:
            self._move_aside(str(exc))
            return
        if self.claims:
            log.info("checkpoint %s: %d prepared claims", self.path, len(self.claims))

    def save(self) -> None:
        """Write the file atomically (mode 0600).

        Raises:
            OSError: It cannot be written.
        """
        claims = {uid: _encode_claim(claim) for uid, claim in sorted(self.claims.items())}
        document = {
            "version": CHECKPOINT_VERSION,
            "driver": self.driver_name,
            "checksum": _checksum(claims),
            "claims": claims,
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(self.path, json.dumps(document, indent=1, sort_keys=True), mode=0o600)

    def _move_aside(self, why: str) -> None:
        aside = self.path.with_name(f"{self.path.name}.corrupt-{int(time.time())}")
        with contextlib.suppress(OSError):
            os.replace(self.path, aside)
        log.warning(
            "checkpoint %s is unusable (%s); moved to %s, starting with no prepared claims",
            self.path,
            why,
            aside,
        )


def _checksum(claims: dict[str, Any]) -> str:
    canonical = json.dumps(claims, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def _encode_claim(claim: PreparedClaim) -> dict[str, Any]:
    devices: list[dict[str, Any]] = []
    for i, (request, pool, device) in enumerate(claim.devices):
        entry: dict[str, Any] = {
            "request": request,
            "pool": pool,
            "device": device,
            "cdiIDs": list(claim.cdi_ids[i]) if i < len(claim.cdi_ids) else [],
            "shareID": claim.share_ids[i] if i < len(claim.share_ids) else None,
        }
        if i < len(claim.data) and claim.data[i]:
            entry["data"] = dict(claim.data[i])
        devices.append(entry)
    return {"namespace": claim.ref.namespace, "name": claim.ref.name, "devices": devices}


def _decode_data(entry: Mapping[str, Any]) -> Mapping[str, Any]:
    data = entry.get("data", {})
    if not isinstance(data, dict):
        raise ValueError(f"device {entry.get('device')!r}: data is not a JSON object")
    return MappingProxyType(data)


def _decode(raw: bytes, driver_name: str) -> dict[str, PreparedClaim]:
    if len(raw) > _MAX_BYTES:
        raise ValueError(f"larger than {_MAX_BYTES} bytes")
    document = json.loads(raw)
    if not isinstance(document, dict):
        raise ValueError("not a JSON object")
    if document.get("version") != CHECKPOINT_VERSION:
        raise ValueError(f"version {document.get('version')!r}, not {CHECKPOINT_VERSION}")
    if document.get("driver") != driver_name:
        raise ValueError(f"written by driver {document.get('driver')!r}, not {driver_name!r}")
    claims = document["claims"]
    if not isinstance(claims, dict) or _checksum(claims) != document.get("checksum"):
        raise ValueError("checksum mismatch")
    out: dict[str, PreparedClaim] = {}
    for uid, entry in claims.items():
        devices = entry["devices"]
        out[uid] = PreparedClaim(
            ref=ClaimRef(namespace=str(entry["namespace"]), name=str(entry["name"]), uid=uid),
            devices=tuple((str(d["request"]), str(d["pool"]), str(d["device"])) for d in devices),
            cdi_ids=tuple(tuple(str(i) for i in d["cdiIDs"]) for d in devices),
            share_ids=tuple(
                None if d.get("shareID") is None else str(d["shareID"]) for d in devices
            ),
            data=tuple(_decode_data(d) for d in devices),
        )
    return out

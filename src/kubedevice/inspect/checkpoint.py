"""Read-only decoding of the kubelet's ``kubelet_internal_checkpoint`` with its checksum checked.

Independent of the emulator's writer on purpose (``inspect`` must read a real kubelet's file
and the emulator's alike, and must not import the kubelet side). The kubelet stores compact
JSON ``{"Data": {...}, "Checksum": N}`` where ``N`` is FNV-1a 32 over go-spew's ``%#v``
rendering of ``Data`` (sorted map keys, ``<nil>`` for null). A mismatch is reported, not fatal:
the decoded content is still returned.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubedevice._regular_file import read_regular
from kubedevice.errors import CheckpointError

__all__ = ["Checkpoint", "CheckpointAllocation", "read_checkpoint"]

_MAX_BYTES = 256 * 1024 * 1024  # the file is read whole; refuse something absurd


@dataclass(frozen=True, slots=True)
class CheckpointAllocation:
    """One pod container's devices of one resource, as the checkpoint holds them."""

    pod_uid: str
    container: str
    resource: str
    #: NUMA node (-1 = none) -> device IDs; ``None`` where the file has ``null``.
    devices_per_numa: Mapping[int, Sequence[str] | None] | None

    @property
    def device_ids(self) -> list[str]:
        """Every device ID of the entry, in NUMA-node order, without duplicates."""
        seen: dict[str, None] = {}
        for numa in sorted(self.devices_per_numa or {}):
            for d in (self.devices_per_numa or {})[numa] or ():
                seen.setdefault(d, None)
        return list(seen)


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """The decoded file: allocations, registered (healthy) devices, and the checksum verdict."""

    path: Path
    entries: tuple[CheckpointAllocation, ...] | None
    registered: Mapping[str, Sequence[str] | None] | None
    checksum_file: int
    checksum_computed: int

    @property
    def checksum_ok(self) -> bool:
        """Whether the stored checksum matches the content."""
        return self.checksum_file == self.checksum_computed


# ---------------------------------------------------------------- go-spew %#v rendering


def _ids(items: Sequence[str] | None) -> str:
    return "<nil>" if items is None else "[" + " ".join(items) + "]"


def _render_entry(e: CheckpointAllocation, alloc_resp: bytes | None) -> str:
    if e.devices_per_numa is None:
        per_numa = "<nil>"
    else:
        per_numa = (
            "map["
            + " ".join(f"{n}:{_ids(e.devices_per_numa[n])}" for n in sorted(e.devices_per_numa))
            + "]"
        )
    resp = "<nil>" if alloc_resp is None else "[" + " ".join(str(b) for b in alloc_resp) + "]"
    return (
        "{PodUID:(string)" + e.pod_uid
        + " ContainerName:(string)" + e.container
        + " ResourceName:(string)" + e.resource
        + " DeviceIDs:(checkpoint.DevicesPerNUMA)" + per_numa
        + " AllocResp:([]uint8)" + resp + "}"
    )  # fmt: skip


def _render(
    entries: Sequence[tuple[CheckpointAllocation, bytes | None]] | None,
    registered: Mapping[str, Sequence[str] | None] | None,
) -> str:
    body = "<nil>" if entries is None else "[" + " ".join(_render_entry(*x) for x in entries) + "]"
    if registered is None:
        reg = "<nil>"
    else:
        keys = sorted(registered, key=lambda k: k.encode())
        reg = "map[" + " ".join(f"{k}:{_ids(registered[k])}" for k in keys) + "]"
    return (
        "(checkpoint.checkpointData){PodDeviceEntries:([]checkpoint.PodDevicesEntry)" + body
        + " RegisteredDevices:(map[string][]string)" + reg + "}"
    )  # fmt: skip


def _fnv1a32(data: bytes) -> int:
    h = 0x811C9DC5
    for b in data:
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return h


# ---------------------------------------------------------------- JSON decoding


def _strings(value: Any, where: str) -> list[str] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        raise CheckpointError(f"{where} is not a list of strings")
    return value


def _entry(raw: Any, i: int) -> tuple[CheckpointAllocation, bytes | None]:
    """One entry and its AllocResp bytes (kept only to compute the checksum)."""
    where = f"PodDeviceEntries[{i}]"
    if not isinstance(raw, dict):
        raise CheckpointError(f"{where} is not an object")
    text: dict[str, str] = {}
    for key in ("PodUID", "ContainerName", "ResourceName"):
        value = raw.get(key, "")
        if not isinstance(value, str):
            raise CheckpointError(f"{where}.{key} is not a string")
        text[key] = value
    per_numa: dict[int, list[str] | None] | None = None
    raw_ids = raw.get("DeviceIDs")
    if raw_ids is not None:
        if not isinstance(raw_ids, dict):
            raise CheckpointError(f"{where}.DeviceIDs is not an object")
        per_numa = {}
        for key, ids in raw_ids.items():
            if not isinstance(key, str) or not key.lstrip("-").isdigit() or len(key) > 20:
                raise CheckpointError(f"{where}.DeviceIDs key {key!r} is not a NUMA node number")
            per_numa[int(key)] = _strings(ids, f"{where}.DeviceIDs[{key}]")
    resp: bytes | None = None
    raw_resp = raw.get("AllocResp")
    if raw_resp is not None:
        if not isinstance(raw_resp, str):
            raise CheckpointError(f"{where}.AllocResp is not a base64 string")
        try:
            resp = base64.b64decode(raw_resp, validate=True)
        except binascii.Error as exc:
            raise CheckpointError(f"{where}.AllocResp is not valid base64") from exc
    alloc = CheckpointAllocation(
        text["PodUID"], text["ContainerName"], text["ResourceName"], per_numa
    )
    return alloc, resp


def read_checkpoint(path: Path) -> Checkpoint:
    """Read and decode ``path`` (never written to).

    Raises:
        CheckpointError: The file is not a checkpoint (not JSON, wrong shape); the message
            names what is wrong. A checksum mismatch is *not* an error (see ``checksum_ok``).
        NotRegularFileError: It is a FIFO, socket, device node or symlink (never opened).
        OSError: It cannot be read (missing, permission denied).
    """
    raw = read_regular(path, _MAX_BYTES)
    if len(raw) > _MAX_BYTES:
        raise CheckpointError(f"{path}: larger than {_MAX_BYTES} bytes, not a checkpoint")
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        why = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        why = why.split("; use sys.set_int_max_str_digits")[0]  # Python's hint, not ours
        raise CheckpointError(f"{path}: not valid JSON ({why})") from None
    except RecursionError:
        raise CheckpointError(f"{path}: not a checkpoint (nested too deeply)") from None
    if not isinstance(doc, dict):
        raise CheckpointError(f"{path}: not a JSON object")
    data = doc.get("Data")
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: Data is not an object")
    stored = doc.get("Checksum", 0)
    if isinstance(stored, bool) or not isinstance(stored, int) or not 0 <= stored < 2**64:
        raise CheckpointError(f"{path}: Checksum is not an unsigned integer")
    try:
        raw_entries = data.get("PodDeviceEntries")
        pairs: list[tuple[CheckpointAllocation, bytes | None]] | None = None
        if raw_entries is not None:
            if not isinstance(raw_entries, list):
                raise CheckpointError("PodDeviceEntries is not a list")
            pairs = [_entry(x, i) for i, x in enumerate(raw_entries)]
        raw_reg = data.get("RegisteredDevices")
        registered: dict[str, list[str] | None] | None = None
        if raw_reg is not None:
            if not isinstance(raw_reg, dict):
                raise CheckpointError("RegisteredDevices is not an object")
            registered = {
                str(k): _strings(v, f"RegisteredDevices[{k}]") for k, v in raw_reg.items()
            }
    except CheckpointError as exc:
        raise CheckpointError(f"{path}: {exc}") from None
    computed = _fnv1a32(_render(pairs, registered).encode())
    return Checkpoint(
        path=path,
        entries=None if pairs is None else tuple(a for a, _ in pairs),
        registered=registered,
        checksum_file=stored,
        checksum_computed=computed,
    )

"""The device manager checkpoint ``kubelet_internal_checkpoint``: JSON format and checksum.

Reads and writes the kubelet's format (contract.md#checkpoint): compact JSON with ``Data`` and a
``Checksum`` that is FNV-1a 32 over the go-spew rendering of ``Data``. Writing is
incremental so that the per-allocation rewrite stays cheap: every entry is rendered once,
the FNV state after each entry is cached, and the part after the entries (registered
devices) is folded in through a per-low-byte table (FNV-1a's low 8 bits of state depend only
on the low 8 bits of the input state, so ``fnv(h, S) = h * P^len(S) + C_S[h & 255]``),
filled lazily and, once allocations keep coming, all at once with a 256-lane big-int pass.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubedevice._regular_file import open_regular
from kubedevice.errors import CheckpointError

__all__ = [
    "MAX_CHECKPOINT_BYTES",
    "CheckpointData",
    "CheckpointEntry",
    "CheckpointWriter",
    "checksum",
    "dumps",
    "loads",
    "render_for_hash",
    "write_atomic",
]

#: A checkpoint larger than this is refused unread (the kubelet's are kilobytes).
MAX_CHECKPOINT_BYTES = 256 * 1024 * 1024

_FNV_OFFSET = 0x811C9DC5
_FNV_PRIME = 0x01000193
_MASK = 0xFFFFFFFF


def _fnv(h: int, data: bytes) -> int:
    for b in data:
        h = ((h ^ b) * _FNV_PRIME) & _MASK
    return h


_LANES = 256
_LANE_MASK = int.from_bytes(b"\xff\xff\xff\xff\x00\x00\x00\x00" * _LANES, "little")
_LANE_ONES = int.from_bytes((b"\x01" + b"\x00" * 7) * _LANES, "little")


def _fnv_all_low_bytes(data: bytes) -> list[int]:
    """``[_fnv(x, data) for x in range(256)]`` at once: 256 64-bit lanes in one big int.

    The product of a 32-bit lane and the prime stays below 2**57, so lanes never carry
    into each other; about 30 times faster than 256 separate passes.
    """
    h = 0
    for x in range(_LANES):
        h |= x << (64 * x)
    spread = [_LANE_ONES * b for b in range(256)]
    for b in data:
        h = ((h ^ spread[b]) * _FNV_PRIME) & _LANE_MASK
    raw = h.to_bytes(8 * _LANES, "little")
    return [int.from_bytes(raw[8 * i : 8 * i + 4], "little") for i in range(_LANES)]


@dataclass(frozen=True, slots=True)
class CheckpointEntry:
    """One ``PodDeviceEntries`` element; ``None`` stands for a JSON ``null`` (Go nil)."""

    pod_uid: str
    container: str
    resource: str
    device_ids: Mapping[int, Sequence[str] | None] | None
    alloc_resp: bytes | None


@dataclass(frozen=True, slots=True)
class CheckpointData:
    """The checkpoint's ``Data``; ``None`` fields are JSON ``null`` (they hash differently)."""

    entries: tuple[CheckpointEntry, ...] | None
    registered: Mapping[str, Sequence[str] | None] | None


# ---------------------------------------------------------------- rendering (go-spew)


def _spew_list(items: Sequence[str] | None) -> str:
    return "<nil>" if items is None else "[" + " ".join(items) + "]"


def _spew_entry(e: CheckpointEntry) -> str:
    if e.device_ids is None:
        d = "<nil>"
    else:
        d = (
            "map["
            + " ".join(f"{k}:{_spew_list(e.device_ids[k])}" for k in sorted(e.device_ids))
            + "]"
        )
    a = "<nil>" if e.alloc_resp is None else "[" + " ".join(map(str, e.alloc_resp)) + "]"
    return (
        f"{{PodUID:(string){e.pod_uid} ContainerName:(string){e.container} "
        f"ResourceName:(string){e.resource} DeviceIDs:(checkpoint.DevicesPerNUMA){d} "
        f"AllocResp:([]uint8){a}}}"
    )


def _spew_registered(r: Mapping[str, Sequence[str] | None] | None) -> str:
    if r is None:
        return "<nil>"
    keys = sorted(r, key=lambda k: k.encode())
    return "map[" + " ".join(f"{k}:{_spew_list(r[k])}" for k in keys) + "]"


_HEAD = "(checkpoint.checkpointData){PodDeviceEntries:([]checkpoint.PodDevicesEntry)"
_MID = " RegisteredDevices:(map[string][]string)"


def render_for_hash(data: CheckpointData) -> str:
    """``Data`` as go-spew ``%#v`` renders it for k8s ``dump.ForHash``."""
    if data.entries is None:
        e = "<nil>"
    else:
        e = "[" + " ".join(_spew_entry(x) for x in data.entries) + "]"
    return _HEAD + e + _MID + _spew_registered(data.registered) + "}"


def checksum(data: CheckpointData) -> int:
    """The kubelet's checksum of ``data`` (FNV-1a 32 of the spew rendering)."""
    return _fnv(_FNV_OFFSET, render_for_hash(data).encode())


# ---------------------------------------------------------------- JSON


def _go_json(value: Any) -> str:
    s = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return (
        s.replace("<", "\\u003c")
        .replace(">", "\\u003e")
        .replace("&", "\\u0026")
        .replace("\u2028", "\\u2028")
        .replace("\u2029", "\\u2029")
    )


def _entry_json(e: CheckpointEntry) -> dict[str, Any]:
    dev: dict[str, Any] | None = None
    if e.device_ids is not None:
        dev = {
            str(k): (None if v is None else list(v))
            for k, v in sorted(e.device_ids.items(), key=lambda kv: str(kv[0]))
        }
    return {
        "PodUID": e.pod_uid,
        "ContainerName": e.container,
        "ResourceName": e.resource,
        "DeviceIDs": dev,
        "AllocResp": None if e.alloc_resp is None else base64.b64encode(e.alloc_resp).decode(),
    }


def _registered_json(r: Mapping[str, Sequence[str] | None] | None) -> Any:
    if r is None:
        return None
    return {k: (None if r[k] is None else list(r[k] or ())) for k in sorted(r)}


def dumps(data: CheckpointData) -> bytes:
    """The checkpoint file's bytes for ``data`` (compact JSON as Go writes it)."""
    entries = None if data.entries is None else [_entry_json(e) for e in data.entries]
    doc = {
        "Data": {
            "PodDeviceEntries": entries,
            "RegisteredDevices": _registered_json(data.registered),
        },
        "Checksum": checksum(data),
    }
    return _go_json(doc).encode()


def _str_list(value: Any, what: str) -> list[str] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        raise CheckpointError(f"{what}: expected a list of strings")
    return value


def loads(raw: bytes) -> CheckpointData:
    """Parse and verify a checkpoint file; ``CheckpointError`` if corrupt, foreign or tampered."""
    try:
        doc = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise CheckpointError(f"checkpoint is not valid JSON: {exc}") from exc
    except ValueError as exc:  # JSONDecodeError, or an integer of thousands of digits
        why = str(exc).splitlines()[0][:200]
        why = why.split("; use sys.set_int_max_str_digits")[0]  # Python's hint, not ours
        raise CheckpointError(f"checkpoint is not valid JSON (e.g. its Checksum): {why}") from exc
    except RecursionError:
        raise CheckpointError("checkpoint is not a checkpoint: nested too deeply") from None
    if not isinstance(doc, dict):
        raise CheckpointError("checkpoint is not a JSON object")
    body = doc.get("Data")
    if body is None:
        body = {}
    if not isinstance(body, dict):
        raise CheckpointError("checkpoint Data is not an object")
    want = doc.get("Checksum", 0)
    if not isinstance(want, int) or isinstance(want, bool) or want < 0:
        raise CheckpointError("checkpoint Checksum is not an unsigned integer")
    raw_entries = body.get("PodDeviceEntries")
    entries: list[CheckpointEntry] | None = None
    if raw_entries is not None:
        if not isinstance(raw_entries, list):
            raise CheckpointError("PodDeviceEntries is not a list")
        entries = [_load_entry(x) for x in raw_entries]
    raw_reg = body.get("RegisteredDevices")
    registered: dict[str, list[str] | None] | None = None
    if raw_reg is not None:
        if not isinstance(raw_reg, dict):
            raise CheckpointError("RegisteredDevices is not an object")
        registered = {str(k): _str_list(v, f"RegisteredDevices[{k}]") for k, v in raw_reg.items()}
    data = CheckpointData(None if entries is None else tuple(entries), registered)
    got = checksum(data)
    if got != want:
        raise CheckpointError(f"checkpoint checksum mismatch: file says {want}, content is {got}")
    return data


def _load_entry(x: Any) -> CheckpointEntry:
    if not isinstance(x, dict):
        raise CheckpointError("a PodDeviceEntries element is not an object")
    fields = {}
    for name in ("PodUID", "ContainerName", "ResourceName"):
        v = x.get(name, "")
        if not isinstance(v, str):
            raise CheckpointError(f"{name} is not a string")
        fields[name] = v
    dev_raw = x.get("DeviceIDs")
    dev: dict[int, list[str] | None] | None = None
    if dev_raw is not None:
        if not isinstance(dev_raw, dict):
            raise CheckpointError("DeviceIDs is not an object")
        dev = {}
        for k, v in dev_raw.items():
            try:
                dev[int(k)] = _str_list(v, "DeviceIDs")
            except ValueError as exc:
                raise CheckpointError(f"DeviceIDs key {k!r} is not an integer") from exc
    resp_raw = x.get("AllocResp")
    resp: bytes | None = None
    if resp_raw is not None:
        if not isinstance(resp_raw, str):
            raise CheckpointError("AllocResp is not a base64 string")
        try:
            resp = base64.b64decode(resp_raw, validate=True)
        except binascii.Error as exc:
            raise CheckpointError(f"AllocResp is not valid base64: {exc}") from exc
    return CheckpointEntry(
        fields["PodUID"], fields["ContainerName"], fields["ResourceName"], dev, resp
    )


# ---------------------------------------------------------------- incremental writer


class CheckpointWriter:
    """Keeps the checkpoint content and writes it atomically, re-hashing only what changed.

    Entries are kept in insertion order (the kubelet's order is Go-map order, i.e. any).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._keys: list[tuple[str, str, str]] = []
        self._index: dict[tuple[str, str, str], int] = {}
        self._spew: list[bytes] = []
        self._json: list[bytes] = []
        self._states: list[int] = []  # FNV state after entry i (incl. its separator)
        self._valid = 0  # states[:valid] are up to date
        self._registered: dict[str, list[str]] = {}
        self._tail = b""
        self._tail_pow = 1
        self._tail_table: dict[int, int] = {}
        self._tail_misses = 0
        self._reg_json = b"{}"
        self.set_registered({})

    def set_entry(self, e: CheckpointEntry) -> None:
        """Add or replace the entry for (pod UID, container, resource)."""
        key = (e.pod_uid, e.container, e.resource)
        spew = _spew_entry(e).encode()
        js = _go_json(_entry_json(e)).encode()
        i = self._index.get(key)
        if i is None:
            self._index[key] = len(self._keys)
            self._keys.append(key)
            self._spew.append(spew)
            self._json.append(js)
            self._states.append(0)
        else:
            self._spew[i] = spew
            self._json[i] = js
            self._valid = min(self._valid, i)

    def remove_pod(self, pod_uid: str) -> None:
        """Drop every entry of ``pod_uid``."""
        keep = [i for i, k in enumerate(self._keys) if k[0] != pod_uid]
        if len(keep) == len(self._keys):
            return
        first = next(i for i, k in enumerate(self._keys) if k[0] == pod_uid)
        self._keys = [self._keys[i] for i in keep]
        self._spew = [self._spew[i] for i in keep]
        self._json = [self._json[i] for i in keep]
        self._states = [self._states[i] for i in keep]
        self._index = {k: i for i, k in enumerate(self._keys)}
        self._valid = min(self._valid, first)

    def clear(self) -> None:
        """Drop every entry."""
        self._keys, self._spew, self._json, self._states = [], [], [], []
        self._index = {}
        self._valid = 0

    def set_registered(self, registered: Mapping[str, Sequence[str]]) -> None:
        """Set ``RegisteredDevices`` (healthy IDs per resource; written sorted)."""
        reg = {k: sorted(v) for k, v in registered.items()}
        if reg == self._registered and self._tail:
            return
        self._registered = reg
        self._tail = ("]" + _MID + _spew_registered(reg) + "}").encode()
        self._tail_pow = pow(_FNV_PRIME, len(self._tail), 1 << 32)
        self._tail_table = {}
        self._tail_misses = 0
        self._reg_json = _go_json(_registered_json(reg)).encode()

    def _checksum(self) -> int:
        if not self._keys:
            rendered = _HEAD + "<nil>" + _MID + _spew_registered(self._registered) + "}"
            return _fnv(_FNV_OFFSET, rendered.encode())
        h = _fnv(_FNV_OFFSET, _HEAD.encode() + b"[") if self._valid == 0 else 0
        if self._valid > 0:
            h = self._states[self._valid - 1]
        for i in range(self._valid, len(self._keys)):
            h = _fnv(h, (b" " if i else b"") + self._spew[i])
            self._states[i] = h
        self._valid = len(self._keys)
        low = h & 0xFF
        c = self._tail_table.get(low)
        if c is None:
            self._tail_misses += 1
            if self._tail_misses < 8:  # a few single passes, then the whole table at once
                c = (_fnv(low, self._tail) - low * self._tail_pow) & _MASK
                self._tail_table[low] = c
            else:
                ends = _fnv_all_low_bytes(self._tail)
                self._tail_table = {
                    x: (ends[x] - x * self._tail_pow) & _MASK for x in range(_LANES)
                }
                c = self._tail_table[low]
        return (h * self._tail_pow + c) & _MASK

    def content(self) -> bytes:
        """The file's bytes for the current state."""
        entries = b"null" if not self._keys else b"[" + b",".join(self._json) + b"]"
        return (
            b'{"Data":{"PodDeviceEntries":'
            + entries
            + b',"RegisteredDevices":'
            + self._reg_json
            + b'},"Checksum":'
            + str(self._checksum()).encode()
            + b"}"
        )

    def write(self) -> None:
        """Write atomically (:func:`write_atomic`)."""
        write_atomic(self.path, self.content())


def write_atomic(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` (mode 0600): ``.``-prefixed temp file in the same
    dir, then rename, so a reader sees the old or the new content, never a part. Whatever
    sits at the temp path (a planted FIFO included) is removed first, never opened."""
    tmp = path.with_name(f".{path.name}.tmp")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    fd = open_regular(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(tmp, path)

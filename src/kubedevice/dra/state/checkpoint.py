"""The prepared-claim checkpoint: which claims this driver prepared, with what answer.

A JSON file in the driver's plugin dir, replaced atomically on every change through its
twin (:mod:`kubedevice.dra.state.twin`: the previous version kept beside it, the two names
exchanged, no file made per write; compact, one claim a line, padded with spaces to whole
4 KiB blocks; each claim's entry is encoded once and reused), with a SHA-256 checksum over
the canonical JSON of its claims (the driver's per-device ``data`` included). Per device it keeps
the request, pool and device, the CDI IDs answered, the share ID, admin access, the
driver's ``data`` and the CDI ``containerEdits`` written into the claim's spec (``edits``),
so the spec can be written again when it is gone (the CDI dir is a tmpfs: a reboot empties
it, the checkpoint under the kubelet's dir stays). A claim whose prepare hook has started
but not finished is kept with ``"state": "preparing"`` (:attr:`Checkpoint.preparing`), so
that what the hook did is undone if the driver dies in it.

Keys added later are optional: a device without ``data``, ``edits`` or ``adminAccess`` and a
claim without ``state`` read as before (no data, edits unknown, no admin access, prepared),
so a file written by an older version loads, and a driver that keeps no data writes no
``data`` key. A file that cannot be read back (bad JSON, wrong checksum, wrong shape, a
symlink, a FIFO, a directory or anything else that is not a regular file) is moved aside as
``<name>.corrupt-<time>`` with one warning line (:attr:`Checkpoint.set_aside` says where) and
the driver starts empty, or (for a file that is regular but does not decode, as a power
loss right after an unsynced write can leave it) with the twin's version before it when
that one decodes, so a restarted driver can still unprepare what it prepared before
whenever the file is sound.

Each save numbers its version (``seq``, outside the checksum, which covers the claims as
before). At load the twin is read too, and a whole twin with a higher number is taken: a
power loss after an unsynced write's exchange, with none of its blocks on disk, leaves the
file whole but two versions back (the twin's content before that write), and the twin the
newer of the two. A file with no number (written by an earlier version of the kit, as
during a rolling upgrade) is never passed over.

Two instances of a driver on one node (a rolling upgrade) share the file: each takes the
node's claims lock around its work (:class:`kubedevice.dra.state.lock.ClaimsLock`) and calls
:meth:`Checkpoint.changed` under it, and reads the file again only when its identity
(device, inode, mtime, size) differs from what this instance last read or wrote.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final

from kubedevice._regular_file import NotRegularFileError, read_regular
from kubedevice.dra.model.types import ClaimRef, PreparedClaim
from kubedevice.dra.state.twin import TwinFile
from kubedevice.plugin.files import sync_file

__all__ = ["CHECKPOINT_VERSION", "Checkpoint"]

log = logging.getLogger(__name__)

CHECKPOINT_VERSION: Final = 1
_MAX_BYTES: Final = 64 << 20
_PREPARING: Final = "preparing"
#: What a file that cannot be decoded raises in :func:`_decode`.
_BAD: Final = (ValueError, KeyError, TypeError, AttributeError)


class Checkpoint:
    """The prepared claims by UID, loaded from and saved to ``path``.

    Attributes:
        claims: The prepared claims by UID.
        preparing: The claims whose prepare hook started and did not finish, by UID.
        set_aside: Where an unusable file was moved at the last :meth:`load` (else ``None``).
    """

    def __init__(self, path: Path, driver_name: str) -> None:
        self.path = path
        self.driver_name = driver_name
        self.claims: dict[str, PreparedClaim] = {}
        self.preparing: dict[str, PreparedClaim] = {}
        self.set_aside: Path | None = None
        self._file = TwinFile(path, 0o600)
        self._seen: tuple[int, int, int, int] | None = None  # the file as last read/written
        # (uid, state) -> (the claim object, its entry as canonical JSON)
        self._cache: dict[tuple[str, str | None], tuple[PreparedClaim, str]] = {}
        self._used: set[tuple[str, str | None]] = set()
        self._seq = 0  # the number of the version last read or written

    def load(self) -> None:
        """Read the file (missing: empty; unreadable or not a regular file: moved aside, empty)."""
        self.claims, self.preparing, self.set_aside = {}, {}, None
        self._seen = self._identity()
        try:
            raw = read_regular(self.path, _MAX_BYTES)
        except FileNotFoundError:
            return
        except NotRegularFileError as exc:
            self._move_aside(exc.strerror or "not a regular file")
            return
        except OSError as exc:
            self._move_aside(f"cannot be read ({exc.strerror or exc})")
            return
        try:
            self.claims, self.preparing, self._seq = _decode(raw, self.driver_name)
        except _BAD as exc:
            try:  # read before the move: a move may not leave it
                earlier: bytes | None = read_regular(self._file.twin, _MAX_BYTES)
            except OSError:  # none (or not a regular file)
                earlier = None
            self._move_aside(str(exc) or type(exc).__name__)
            if earlier is not None and self.set_aside is not None:
                self._take_twin(earlier)
            return
        self._take_newer_twin()
        if self.claims or self.preparing:
            log.info(
                "checkpoint %s: %d prepared claims, %d interrupted while preparing",
                self.path,
                len(self.claims),
                len(self.preparing),
            )

    def _take_newer_twin(self) -> None:
        """Start from the twin instead of the whole file just read when the twin is whole
        and numbered higher (the file is then two versions back: see the module's text)."""
        try:
            raw = read_regular(self._file.twin, _MAX_BYTES)
            claims, preparing, seq = _decode(raw, self.driver_name)
        except (*_BAD, OSError):  # none, not a regular file, or cut off: the usual case
            return
        if self._seq == 0 or seq <= self._seq:  # 0: written by a version that numbers none
            return
        older = self._seq
        try:
            os.replace(self._file.twin, self.path)
        except OSError:
            return
        self.claims, self.preparing, self._seq = claims, preparing, seq
        self._seen = self._identity()
        log.warning(
            "checkpoint %s: version %d is older than its twin's (%d, whole: a power loss "
            "kept the exchange of an unsynced write but none of its data); starting from the "
            "twin: %d prepared claims, %d interrupted while preparing",
            self.path,
            older,
            seq,
            len(claims),
            len(preparing),
        )

    def _take_twin(self, earlier: bytes) -> None:
        """Start from the twin's version (the one before the unreadable file), made the
        file again (so every instance reads it), when it decodes."""
        try:
            claims, preparing, seq = _decode(earlier, self.driver_name)
            os.replace(self._file.twin, self.path)
        except (*_BAD, OSError):
            return
        self.claims, self.preparing, self._seq = claims, preparing, seq
        self._seen = self._identity()
        log.warning(
            "checkpoint %s: its version before the last write (%s) is whole; starting from "
            "it: %d prepared claims, %d interrupted while preparing",
            self.path,
            self._file.twin.name,
            len(claims),
            len(preparing),
        )

    def save(self, *, sync: bool = True) -> None:
        """Write the file atomically (mode 0600), through its twin.

        Each claim's entry is encoded once and kept (keyed by the claim object, which is
        immutable), so a save costs the entries' concatenation and one checksum, not an
        encoding of every claim. The file is compact JSON, one claim per line; the
        checksum is over the same canonical form as before, so either version reads the
        other's files.

        Args:
            sync: fdatasync the new version before it replaces the old one; with ``False`` every
                process sees the new file at once and :meth:`sync` makes it durable.

        Raises:
            OSError: It cannot be written.
        """
        entries: dict[str, str] = {}
        for table, state in ((self.claims, None), (self.preparing, _PREPARING)):
            for uid, claim in table.items():
                entries[uid] = self._encoded(uid, claim, state)
        keys = sorted(entries)
        canonical = ",".join(f"{json.dumps(uid)}:{entries[uid]}" for uid in keys)
        checksum = hashlib.sha256(f"{{{canonical}}}".encode()).hexdigest()
        lines = ",\n".join(f"{json.dumps(uid)}:{entries[uid]}" for uid in keys)
        self._seq += 1
        text = (
            f'{{"checksum":"{checksum}","claims":{{\n{lines}\n}},'
            f'"driver":{json.dumps(self.driver_name)},"seq":{self._seq},'
            f'"version":{CHECKPOINT_VERSION}}}\n'
        )
        self._cache = {key: self._cache[key] for key in self._used}
        self._used = set()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file.write(text.encode(), sync=sync)
        self._seen = self._identity()

    @property
    def written_bytes(self) -> int:
        """The file's size when this process last read or wrote it (0: none yet)."""
        return self._seen[3] if self._seen is not None else 0

    def sync(self) -> None:
        """Make the last :meth:`save` durable: fsync the file, then its directory.

        Raises:
            OSError: It cannot be synced.
        """
        sync_file(self.path)

    def _encoded(self, uid: str, claim: PreparedClaim, state: str | None) -> str:
        """The claim's entry as canonical JSON (sorted keys, no spaces), encoded once."""
        key = (uid, state)
        self._used.add(key)
        cached = self._cache.get(key)
        if cached is not None and cached[0] is claim:
            return cached[1]
        entry = _encode_claim(claim)
        if state is not None:
            entry["state"] = state
        text = json.dumps(entry, sort_keys=True, separators=(",", ":"))
        self._cache[key] = (claim, text)
        return text

    def changed(self) -> bool:
        """Whether another process replaced the file since this one last read or wrote it
        (one ``stat``, no read). Ask with the node's claims lock held, so that nobody
        writes it meanwhile, and :meth:`load` it again when it did."""
        return self._identity() != self._seen

    def _identity(self) -> tuple[int, int, int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)

    def _move_aside(self, why: str) -> None:
        aside = self.path.with_name(f"{self.path.name}.corrupt-{int(time.time())}")
        try:
            os.replace(self.path, aside)
        except OSError as exc:
            log.error(
                "checkpoint %s is unusable (%s) and cannot be moved aside (%s); starting "
                "with no prepared claims",
                self.path,
                why,
                exc.strerror or exc,
            )
            return
        self.set_aside = aside
        log.warning(
            "checkpoint %s is unusable (%s); moved to %s, starting with no prepared claims",
            self.path,
            why,
            aside,
        )


def _checksum(claims: dict[str, Any]) -> str:
    canonical = json.dumps(claims, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def _at(values: tuple[Any, ...], i: int, default: Any) -> Any:
    return values[i] if i < len(values) else default


def _encode_claim(claim: PreparedClaim) -> dict[str, Any]:
    devices: list[dict[str, Any]] = []
    for i, (request, pool, device) in enumerate(claim.devices):
        entry: dict[str, Any] = {
            "request": request,
            "pool": pool,
            "device": device,
            "cdiIDs": list(_at(claim.cdi_ids, i, ())),
            "shareID": _at(claim.share_ids, i, None),
        }
        if _at(claim.admin_access, i, False):
            entry["adminAccess"] = True
        if _at(claim.data, i, None):
            entry["data"] = dict(claim.data[i])
        edits = _at(claim.edits, i, None)
        if edits is not None:
            entry["edits"] = dict(edits)
        devices.append(entry)
    return {"namespace": claim.ref.namespace, "name": claim.ref.name, "devices": devices}


def _decode_object(entry: Mapping[str, Any], key: str) -> Mapping[str, Any] | None:
    value = entry.get(key)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValueError(f"device {entry.get('device')!r}: {key} is not a JSON object")
    return MappingProxyType(value)


def _decode(
    raw: bytes, driver_name: str
) -> tuple[dict[str, PreparedClaim], dict[str, PreparedClaim], int]:
    """The prepared and preparing claims of a file, and its version's number (0: none)."""
    if len(raw) > _MAX_BYTES:
        raise ValueError(f"larger than {_MAX_BYTES} bytes")
    document = json.loads(raw)
    if not isinstance(document, dict):
        raise ValueError("not a JSON object")
    if document.get("version") != CHECKPOINT_VERSION:
        raise ValueError(f"version {document.get('version')!r}, not {CHECKPOINT_VERSION}")
    if document.get("driver") != driver_name:
        raise ValueError(f"written by driver {document.get('driver')!r}, not {driver_name!r}")
    seq = document.get("seq", 0)
    if type(seq) is not int or seq < 0:
        raise ValueError(f"seq {seq!r} is not a version number")
    claims = document["claims"]
    if not isinstance(claims, dict) or _checksum(claims) != document.get("checksum"):
        raise ValueError("checksum mismatch")
    prepared: dict[str, PreparedClaim] = {}
    preparing: dict[str, PreparedClaim] = {}
    for uid, entry in claims.items():
        devices = entry["devices"]
        claim = PreparedClaim(
            ref=ClaimRef(namespace=str(entry["namespace"]), name=str(entry["name"]), uid=uid),
            devices=tuple((str(d["request"]), str(d["pool"]), str(d["device"])) for d in devices),
            cdi_ids=tuple(tuple(str(i) for i in d["cdiIDs"]) for d in devices),
            share_ids=tuple(
                None if d.get("shareID") is None else str(d["shareID"]) for d in devices
            ),
            data=tuple(_decode_object(d, "data") or MappingProxyType({}) for d in devices),
            edits=tuple(_decode_object(d, "edits") for d in devices),
            admin_access=tuple(bool(d.get("adminAccess")) for d in devices),
        )
        state = entry.get("state")
        if state not in (None, _PREPARING):
            raise ValueError(f"claim {uid}: unknown state {state!r}")
        (preparing if state == _PREPARING else prepared)[uid] = claim
    return prepared, preparing, seq

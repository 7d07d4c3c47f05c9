"""Stable device IDs for the generic plugin: deterministic, sanitised, at most 63 characters.

IDs derive only from device paths or USB identity, so the same device nodes give the same
IDs across restarts. Replicas append ``::<n>``.
"""

from __future__ import annotations

import re

__all__ = ["MAX_ID_LENGTH", "replica_id", "sanitize_id", "split_replica"]

MAX_ID_LENGTH = 63
_BAD = re.compile(r"[^A-Za-z0-9._-]")


def sanitize_id(raw: str, max_length: int = MAX_ID_LENGTH) -> str:
    """Map ``raw`` (e.g. ``dri/renderD128``) to ``[A-Za-z0-9._-]{1,max_length}``.

    ``/`` becomes ``-``; any other character outside the set becomes ``_``. When that
    mapping could collide (a replaced character, a ``-`` next to a replaced ``/``) or the
    result is too long, a short hash of ``raw`` is appended so distinct inputs keep
    distinct IDs.
    """
    plain = raw.strip("/").replace("/", "-")
    out = _BAD.sub("_", plain) or "dev"
    lossy = out != plain or ("/" in raw.strip("/") and "-" in raw)
    if lossy or len(out) > max_length:
        import hashlib  # only here: hashlib loads OpenSSL's digests (0.6 MB of every daemon)

        digest = hashlib.sha1(raw.encode("utf-8", "surrogateescape")).hexdigest()[:8]
        out = out[: max_length - 9].rstrip("-") + "-" + digest
    return out


def replica_id(device_id: str, index: int, count: int) -> str:
    """The ID of replica ``index`` of ``device_id`` (the bare ID when ``count`` is 1)."""
    return device_id if count == 1 else f"{device_id}::{index}"


def split_replica(advertised: str) -> tuple[str, int]:
    """Split an advertised ID into (physical ID, replica index); no suffix means replica 0."""
    base, sep, index = advertised.rpartition("::")
    if sep and index.isdigit():
        return base, int(index)
    return advertised, 0

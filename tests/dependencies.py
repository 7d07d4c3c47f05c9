"""What an install pulls in: requirements closed under their dependencies, as installed here."""

from __future__ import annotations

import contextlib
import importlib.metadata
from collections.abc import Iterable

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name


def closure(requirements: Iterable[str]) -> set[str]:
    """The canonical names of ``requirements`` (no extra asked) and of everything they need,
    read from the installed distributions' metadata (one not installed here adds only itself)."""
    todo = [Requirement(r) for r in requirements]
    found: set[str] = set()
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name in found or (req.marker is not None and not req.marker.evaluate({"extra": ""})):
            continue
        found.add(name)
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            todo += [Requirement(r) for r in importlib.metadata.requires(name) or []]
    return found

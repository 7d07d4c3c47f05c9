"""Paths that come from data (a fake machine's device nodes, a PCI bus ID), kept under a root.

:func:`inside` is a lexical check: the joined path is refused when the relative part could
leave the root (``..``, absolute, empty, a NUL). Reading files safely is
``kubedevice._regular_file``'s job.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from kubedevice.errors import ConfigError

__all__ = ["inside"]


def inside(root: Path, relative: str, what: str = "path") -> Path:
    """``root / relative``, refused when ``relative`` could leave ``root``.

    A lexical check, for paths that come from data (a fake machine's device nodes, a PCI
    bus ID): no ``..`` component, not absolute, not empty.

    Args:
        root: The directory everything must stay under.
        relative: The path below it.
        what: What the path is, for the message.

    Returns:
        The joined path.

    Raises:
        ConfigError: ``relative`` is empty, absolute or has a ``..`` component.
    """
    parts = PurePosixPath(relative).parts
    if not parts or relative.startswith("/") or ".." in parts or "\0" in relative:
        raise ConfigError(f"{what} {relative!r} would leave {root}; refused")
    return root.joinpath(*parts)

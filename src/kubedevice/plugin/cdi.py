"""CDI spec files: the rules a CDI runtime applies to a spec, and writing one atomically.

Shared by the plugins that publish CDI devices (the GPU plugin today). A spec is written to a
temporary name in the CDI directory and renamed over the old file (:mod:`kubedevice.plugin.files`),
so a container runtime never reads half a spec.
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path
from typing import Any

from kubedevice.errors import ConfigError
from kubedevice.plugin.files import replace_if_changed

__all__ = ["validate_spec", "write_spec"]

log = logging.getLogger(__name__)

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]*")
_KIND = re.compile(r"[a-z0-9]([a-z0-9.-]*[a-z0-9])?/[A-Za-z0-9]([A-Za-z0-9_.-]*[A-Za-z0-9])?")


def validate_spec(spec: dict[str, Any]) -> None:
    """Check the rules a CDI runtime applies to a spec file (the subset we write).

    Raises:
        ConfigError: The spec would be refused; the message says which rule.
    """
    if not isinstance(spec.get("cdiVersion"), str) or not re.fullmatch(
        r"\d+\.\d+\.\d+", spec["cdiVersion"]
    ):
        raise ConfigError(f"CDI spec: bad cdiVersion {spec.get('cdiVersion')!r}")
    if not isinstance(spec.get("kind"), str) or not _KIND.fullmatch(spec["kind"]):
        raise ConfigError(f"CDI spec: bad kind {spec.get('kind')!r}")
    names: set[str] = set()
    devices = spec.get("devices")
    if not isinstance(devices, list):
        raise ConfigError("CDI spec: 'devices' must be a list")
    for dev in devices:
        name = dev.get("name")
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ConfigError(f"CDI spec: bad device name {name!r}")
        if name in names:
            raise ConfigError(f"CDI spec: device name {name!r} appears twice")
        names.add(name)
        edits = dev.get("containerEdits")
        if not isinstance(edits, dict) or not edits:
            raise ConfigError(f"CDI spec: device {name!r} has no containerEdits")
        _check_edits(edits, f"device {name!r}")
    if "containerEdits" in spec:
        _check_edits(spec["containerEdits"], "containerEdits")


def _check_edits(edits: dict[str, Any], where: str) -> None:
    allowed = {"env", "deviceNodes", "hooks", "mounts", "intelRdt", "additionalGids"}
    unknown = set(edits) - allowed
    if unknown:
        raise ConfigError(f"CDI spec: {where}: unknown key(s) {sorted(unknown)}")
    for node in edits.get("deviceNodes", []):
        path = node.get("path")
        if not isinstance(path, str) or not path.startswith("/"):
            raise ConfigError(f"CDI spec: {where}: device node path {path!r} must be absolute")
    for mount in edits.get("mounts", []):
        for key in ("hostPath", "containerPath"):
            value = mount.get(key)
            if not isinstance(value, str) or not value.startswith("/"):
                raise ConfigError(f"CDI spec: {where}: mount {key} {value!r} must be absolute")


def write_spec(cdi_dir: str | os.PathLike[str], file_name: str, spec: dict[str, Any]) -> bool:
    """Write ``spec`` to ``<cdi_dir>/<file_name>`` atomically, if it changed.

    The file is written to a temporary name in the same directory, flushed and renamed
    over the old one (mode 0644: runtimes read it), so a runtime never reads half a spec.

    Returns:
        Whether the file was (re)written.

    Raises:
        ConfigError: The directory cannot be created or written.
    """
    directory = Path(cdi_dir)
    text = json.dumps(spec, indent=2, sort_keys=False) + "\n"
    try:
        if not replace_if_changed(directory, file_name, text):
            return False
    except OSError as exc:
        why = exc.strerror or exc
        raise ConfigError(f"cannot write the CDI spec in {directory}: {why}") from exc
    log.info(
        "CDI spec written",
        extra={"path": str(directory / file_name), "devices": len(spec["devices"])},
    )
    return True

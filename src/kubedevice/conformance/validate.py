"""Pure checks of what a plugin sent: names, endpoints, device lists and RPC answers.

Each function returns a list of problems (empty = fine), phrased as evidence. No I/O
happens here except :func:`endpoint_problems`, which looks at the socket file.
"""

from __future__ import annotations

import re
import stat
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from kubedevice._api import HEALTHY, UNHEALTHY
from kubedevice.kubelet.registration import extended_resource_name_error
from kubedevice.kubelet.types import AllocateResult

__all__ = [
    "allocate_response_problems",
    "device_list_problems",
    "endpoint_problems",
    "preferred_problems",
    "resource_name_problems",
]

_CDI_NAME = re.compile(r"[A-Za-z0-9][-A-Za-z0-9_.]*/[A-Za-z0-9][-A-Za-z0-9_.]*=[A-Za-z0-9_.:-]+")
_MAX_ID = 63
_NAME_RULE = (
    "expected <lower-case DNS domain>/<name of at most 63 characters>, with no "
    "kubernetes.io/ domain and no requests. prefix"
)


def resource_name_problems(name: str) -> list[str]:
    """Why the kubelet would reject ``name`` as an extended resource name.

    See docs/contract.md#resource-names.

    The verdict is the emulator's own rule (one kubelet-side implementation); the evidence
    adds what the rule requires, since the kubelet's text does not say which part failed.
    """
    error = extended_resource_name_error(name)
    if error is None:
        return []
    return [f"{error}: {_NAME_RULE}"]


def endpoint_problems(endpoint: str, device_plugin_dir: Path) -> list[str]:
    """Whether ``endpoint`` is a bare socket name that exists in ``device_plugin_dir``."""
    if not endpoint:
        return ["endpoint is empty"]
    if "/" in endpoint or endpoint in {".", ".."}:
        return [f"endpoint {endpoint!r} is a path, not a bare socket file name in the dir"]
    try:
        mode = (device_plugin_dir / endpoint).lstat().st_mode
    except OSError:
        return [f"endpoint {endpoint!r} does not exist in the device plugin dir"]
    if not stat.S_ISSOCK(mode):
        return [f"endpoint {endpoint!r} is not a Unix socket"]
    return []


def device_list_problems(devices: Sequence[tuple[str, str]]) -> list[str]:
    """Problems in one ListAndWatch snapshot given as ``(ID, health)`` pairs."""
    problems: list[str] = []
    dup = sorted(i for i, n in Counter(i for i, _ in devices).items() if n > 1)
    if dup:
        problems.append(f"duplicate device IDs {dup[:3]}")
    for dev_id, health in devices:
        if not dev_id:
            problems.append("a device has an empty ID")
        elif len(dev_id) > _MAX_ID:
            problems.append(f"device ID {dev_id[:20]!r}... is {len(dev_id)} > 63 characters")
        elif not dev_id.isprintable() or any(c.isspace() for c in dev_id):
            problems.append(f"device ID {dev_id!r} has whitespace or control characters")
        if health not in (HEALTHY, UNHEALTHY):
            problems.append(
                f"device {dev_id!r} has health {health!r} (must be exactly "
                f"{HEALTHY!r} or {UNHEALTHY!r}; the kubelet counts it unhealthy)"
            )
    return problems


def _abs(path: str) -> bool:
    return path.startswith("/")


def allocate_response_problems(resp: AllocateResult) -> list[str]:
    """Problems in an AllocateResponse to a single-container request (contract.md#allocation)."""
    n = len(resp.containers)
    if n != 1:
        return [f"AllocateResponse has {n} container_responses for 1 container request"]
    cresp = resp.containers[0]
    problems: list[str] = []
    for spec in cresp.devices:
        if not _abs(spec.container_path) or not _abs(spec.host_path):
            problems.append(
                f"DeviceSpec paths must be absolute: container_path={spec.container_path!r} "
                f"host_path={spec.host_path!r}"
            )
        perms = spec.permissions
        if not perms or set(perms) - set("rwm") or len(set(perms)) != len(perms):
            problems.append(
                f"DeviceSpec {spec.container_path!r} permissions {perms!r} are not a "
                "non-empty subset of 'rwm'"
            )
    for mount in cresp.mounts:
        if not _abs(mount.container_path) or not _abs(mount.host_path):
            problems.append(
                f"Mount paths must be absolute: container_path={mount.container_path!r} "
                f"host_path={mount.host_path!r}"
            )
    for key in cresp.envs:
        if not key or "=" in key or "\0" in key:
            problems.append(f"env name {key!r} is not a valid environment variable name")
    for key in cresp.annotations:
        if not key:
            problems.append("an annotation has an empty key")
    for cdi in cresp.cdi_devices:
        if not _CDI_NAME.fullmatch(cdi):
            problems.append(f"CDI device name {cdi!r} is not 'vendor.com/class=name'")
    return problems


def preferred_problems(
    available: Sequence[str], must_include: Sequence[str], size: int, answer: Sequence[str]
) -> list[str]:
    """Invariants of one GetPreferredAllocation answer (contract.md#allocation, mistakes 16-17)."""
    problems: list[str] = []
    missing = [i for i in must_include if i not in answer]
    if missing:
        problems.append(f"answer {list(answer)} lacks must-include IDs {missing}")
    foreign = [i for i in answer if i not in available]
    if foreign:
        problems.append(f"answer has IDs that were not offered: {foreign}")
    if len(set(answer)) != len(answer):
        problems.append(f"answer {list(answer)} repeats IDs")
    if len(available) >= size and len(answer) != size:
        problems.append(f"answer has {len(answer)} IDs for allocation_size {size}")
    return problems

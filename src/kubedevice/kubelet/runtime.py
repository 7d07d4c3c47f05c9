"""What the container runtime would get: the kubelet's merge of cached Allocate responses.

Mirrors ``pod_devices.go deviceRunContainerOptions`` (contract.md#container-view): for one
container the responses of every resource are merged; envs by name, devices and mounts by
container path, annotations by key (first seen wins, conflicts reported like the kubelet's
log lines), CDI devices by name (duplicates dropped). Resources are visited in sorted order
(the kubelet's order is Go-map order, i.e. unspecified).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TypeVar

from kubedevice.kubelet.types import ContainerAllocation, DeviceSpec, Mount, RuntimeView

__all__ = ["merge_allocations"]

T = TypeVar("T")


# The kubelet's log lines for conflicts; {old} is the value kept (first seen), {new} the other.
_ENV_CONFLICT = (
    '"Environment variable has conflicting setting" envKey="{key}" expected="{new}" got="{old}"'
)
_DEVICE_CONFLICT = (
    '"Container device has conflicting mapping host devices" '
    'containerPath="{key}" got="{old}" expected="{new}"'
)
_MOUNT_CONFLICT = (
    '"Container mount has conflicting mapping host mounts" '
    'containerPath="{key}" got="{old}" expected="{new}"'
)
_ANNOTATION_CONFLICT = (
    '"Annotation has conflicting setting" annotationKey="{key}" expected="{old}" got="{new}"'
)


def _first_wins(
    seen: dict[str, T],
    key: str,
    item: T,
    value: Callable[[T], str],
    conflict: str,
    resource: str,
    conflicts: list[str],
) -> None:
    """Keep the first ``item`` per ``key``; a later one with another value is a conflict."""
    if key not in seen:
        seen[key] = item
    elif (old := value(seen[key])) != (new := value(item)):
        line = conflict.format(key=key, old=old, new=new)
        conflicts.append(f'{line} resource="{resource}"')


def _text(value: str) -> str:
    return value


def _host_path(item: DeviceSpec | Mount) -> str:
    return item.host_path


def merge_allocations(per_resource: Mapping[str, ContainerAllocation]) -> RuntimeView:
    """Merge one container's Allocate responses (keyed by resource) into a ``RuntimeView``."""
    envs: dict[str, str] = {}
    devices: dict[str, DeviceSpec] = {}
    mounts: dict[str, Mount] = {}
    annotations: dict[str, str] = {}
    cdi: dict[str, None] = {}
    conflicts: list[str] = []
    for res in sorted(per_resource):
        resp = per_resource[res]
        for k in sorted(resp.envs):
            _first_wins(envs, k, resp.envs[k], _text, _ENV_CONFLICT, res, conflicts)
        for d in resp.devices:
            _first_wins(devices, d.container_path, d, _host_path, _DEVICE_CONFLICT, res, conflicts)
        for m in resp.mounts:
            _first_wins(mounts, m.container_path, m, _host_path, _MOUNT_CONFLICT, res, conflicts)
        for k in sorted(resp.annotations):
            value = resp.annotations[k]
            _first_wins(annotations, k, value, _text, _ANNOTATION_CONFLICT, res, conflicts)
        for name in resp.cdi_devices:
            cdi.setdefault(name, None)
    return RuntimeView(
        envs=envs,
        mounts=tuple(mounts.values()),
        devices=tuple(devices.values()),
        annotations=annotations,
        cdi_devices=tuple(cdi),
        conflicts=tuple(conflicts),
    )

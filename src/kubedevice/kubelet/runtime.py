"""What the container runtime would get: the kubelet's merge of cached Allocate responses.

Mirrors ``pod_devices.go deviceRunContainerOptions`` (contract §3.9): for one container the
responses of every resource are merged; envs by name, devices and mounts by container path,
annotations by key (first seen wins, conflicts reported like the kubelet's log lines), CDI
devices by name (duplicates dropped). Resources are visited in sorted order (the kubelet's
order is Go-map order, i.e. unspecified).
"""

from __future__ import annotations

from collections.abc import Mapping

from kubedevice.kubelet.types import ContainerAllocation, DeviceSpec, Mount, RuntimeView

__all__ = ["merge_allocations"]


def merge_allocations(per_resource: Mapping[str, ContainerAllocation]) -> RuntimeView:
    """Merge one container's Allocate responses (keyed by resource) into a ``RuntimeView``."""
    envs: dict[str, str] = {}
    devices: dict[str, DeviceSpec] = {}
    mounts: dict[str, Mount] = {}
    annotations: dict[str, str] = {}
    cdi: dict[str, None] = {}
    conflicts: list[str] = []
    for resource in sorted(per_resource):
        resp = per_resource[resource]
        for k in sorted(resp.envs):
            v = resp.envs[k]
            if k in envs:
                if envs[k] != v:
                    conflicts.append(
                        f'"Environment variable has conflicting setting" envKey="{k}" '
                        f'expected="{v}" got="{envs[k]}" resource="{resource}"'
                    )
                continue
            envs[k] = v
        for d in resp.devices:
            if d.container_path in devices:
                got = devices[d.container_path].host_path
                if got != d.host_path:
                    conflicts.append(
                        '"Container device has conflicting mapping host devices" '
                        f'containerPath="{d.container_path}" got="{got}" '
                        f'expected="{d.host_path}" resource="{resource}"'
                    )
                continue
            devices[d.container_path] = d
        for m in resp.mounts:
            if m.container_path in mounts:
                got = mounts[m.container_path].host_path
                if got != m.host_path:
                    conflicts.append(
                        '"Container mount has conflicting mapping host mounts" '
                        f'containerPath="{m.container_path}" got="{got}" '
                        f'expected="{m.host_path}" resource="{resource}"'
                    )
                continue
            mounts[m.container_path] = m
        for k in sorted(resp.annotations):
            v = resp.annotations[k]
            if k in annotations:
                if annotations[k] != v:
                    conflicts.append(
                        f'"Annotation has conflicting setting" annotationKey="{k}" '
                        f'expected="{annotations[k]}" got="{v}" resource="{resource}"'
                    )
                continue
            annotations[k] = v
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

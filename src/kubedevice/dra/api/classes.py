"""DeviceClasses that serve extended resources from a DRA driver's devices (KEP-5004).

A DeviceClass with ``spec.extendedResourceName`` lets a pod that asks for that extended
resource (``resources.limits: {nvidia.com/gpu: 1}``) be served by DRA on nodes where no
device plugin advertises it: the scheduler makes one ResourceClaim per pod from the class
and the kubelet hands each container its devices. The drivers build their classes with
:func:`device_class` (one per resource name their device plugin would advertise, see
``nvidia.dra.classes`` and ``generic.dra.classes``); :func:`dump_classes` prints them.

Class names: the resource name with ``/`` made ``-`` (``nvidia.com-gpu``,
``nvidia.com-mig-1g.10gb``); a name that is not a DNS subdomain that way (upper case,
``_``) is lower-cased, its other characters made ``-``, and a short hash of the resource
name appended, so two resources never share a class. The chart computes the same names.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

import yaml

from kubedevice.errors import ConfigError

__all__ = ["class_name", "device_class", "dump_classes", "opaque_config", "selector"]

_SUBDOMAIN: Final = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_NOT_NAME: Final = re.compile(r"[^a-z0-9.-]")
_MAX_NAME: Final = 253


def class_name(resource: str) -> str:
    """The DeviceClass name of an extended resource (a DNS subdomain, at most 253 chars).

    Raises:
        ConfigError: No valid name can be made of ``resource`` (it is not a resource name).
    """
    plain = resource.replace("/", "-")
    name = _NOT_NAME.sub("-", plain.lower())
    if name != plain or len(name) > _MAX_NAME or not _SUBDOMAIN.fullmatch(name):
        digest = hashlib.sha1(resource.encode()).hexdigest()[:8]
        name = f"{re.sub(r'[-.]+$', '', name[: _MAX_NAME - 9])}-{digest}"
    if not _SUBDOMAIN.fullmatch(name):
        raise ConfigError(f"{resource!r}: no DeviceClass name can be made of this resource name")
    return name


def selector(driver: str, *conditions: str) -> str:
    """A CEL expression: the device is ``driver``'s and meets every condition."""
    return " && ".join([f"device.driver == {json.dumps(driver)}", *conditions])


def opaque_config(driver: str, parameters: Mapping[str, Any]) -> dict[str, Any]:
    """One ``spec.config[]`` entry: opaque ``parameters`` for ``driver``."""
    return {"opaque": {"driver": driver, "parameters": dict(parameters)}}


def device_class(
    resource: str,
    expression: str,
    *,
    config: Sequence[Mapping[str, Any]] = (),
    labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The DeviceClass serving extended resource ``resource`` with the devices CEL
    ``expression`` selects, with ``config`` (``spec.config`` entries) for each of them.
    """
    metadata: dict[str, Any] = {"name": class_name(resource)}
    if labels:
        metadata["labels"] = dict(labels)
    spec: dict[str, Any] = {
        "extendedResourceName": resource,
        "selectors": [{"cel": {"expression": expression}}],
    }
    if config:
        spec["config"] = [dict(c) for c in config]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": metadata,
        "spec": spec,
    }


def dump_classes(classes: Sequence[Mapping[str, Any]]) -> str:
    """The classes as YAML, one document each (``---`` between them)."""
    return yaml.safe_dump_all(
        [dict(c) for c in classes], sort_keys=False, default_flow_style=False, width=1000
    )

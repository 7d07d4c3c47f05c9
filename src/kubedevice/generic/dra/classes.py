"""The /dev DRA driver's DeviceClasses for extended resources: pods keep their resource names.

One class per resource of the generic config (the names the device plugin advertises), with
``spec.extendedResourceName`` set to it and a CEL selector on the devices' ``resource``
attribute, so a pod asking for ``kubedevice.io/fuse: 1`` is served by the DRA driver on a
node without the device plugin. A group's ``count`` (replicas) are devices of their own in
DRA too, so a device shared by ``count`` pods under the plugin is shared the same way.
"""

from __future__ import annotations

import json
from typing import Any

from kubedevice.dra.api.classes import device_class, selector
from kubedevice.errors import ConfigError
from kubedevice.generic.config import Config
from kubedevice.generic.dra.driver import resource_attribute

__all__ = ["device_classes"]


def device_classes(config: Config, driver: str) -> list[dict[str, Any]]:
    """The DeviceClasses of every resource of ``config``, in config order.

    Raises:
        ConfigError: Two resources whose names agree in their first 64 characters (the
            devices' ``resource`` attribute could not tell them apart).
    """
    seen: dict[str, str] = {}
    out: list[dict[str, Any]] = []
    for res in config.resources:
        value = resource_attribute(res.name)
        if value in seen:
            raise ConfigError(
                f"resources: {seen[value]} and {res.name} agree in their first "
                f"{len(value)} characters; a DeviceClass cannot tell their devices apart"
            )
        seen[value] = res.name
        expression = selector(
            driver, f"device.attributes[{json.dumps(driver)}].resource == {json.dumps(value)}"
        )
        out.append(device_class(res.name, expression))
    return out

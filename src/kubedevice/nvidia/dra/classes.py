"""The GPU DRA driver's DeviceClasses for extended resources: pods keep ``nvidia.com/gpu``.

One class per resource the device plugin would advertise with the same config
(:func:`kubedevice.nvidia.devices.advertised_names`: the names cannot drift), each with
``spec.extendedResourceName`` set to that name and a CEL selector on this driver's
attributes that picks exactly the devices the plugin would advertise under it:

* ``migStrategy: none``: ``nvidia.com/gpu`` is every whole GPU (``type == "gpu"``);
* ``single``: ``nvidia.com/gpu`` is every device the driver publishes (whole GPUs, or the
  MIG devices of a node whose GPUs are all MIG-enabled);
* ``mixed``: ``nvidia.com/gpu`` is the whole GPUs, ``nvidia.com/mig-<profile>`` the MIG
  devices of that profile (``type == "mig" && profile == "<profile>"``).

A resource shared by ``sharing.timeSlicing`` keeps its advertised name (``rename``,
``renameByDefault``), and its class carries the opaque config that asks the driver for
time-slicing (``GpuConfig`` or ``MigDeviceConfig``, ``strategy: TimeSlicing``): each
device is still allocated to one pod at a time (see docs/nvidia-dra.md, "Moving from the
device plugin to DRA with unchanged pod specs").
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Final

from kubedevice.dra.api.classes import device_class, opaque_config, selector
from kubedevice.errors import ConfigError
from kubedevice.nvidia.backend import NvmlBackend
from kubedevice.nvidia.config import GPU_RESOURCE, Config
from kubedevice.nvidia.devices import advertised_names
from kubedevice.nvidia.dra.config import API_VERSIONS
from kubedevice.nvidia.dra.ondemand import partitionable
from kubedevice.nvidia.runner import enumerate_hardware
from kubedevice.plugin.config import validate_resource_name

__all__ = ["device_classes", "node_mig_profiles"]

_MIG_PREFIX: Final = "nvidia.com/mig-"


def _attr(driver: str, name: str, value: str) -> str:
    return f"device.attributes[{json.dumps(driver)}].{name} == {json.dumps(value)}"


def device_classes(
    config: Config, driver: str, mig_profiles: Sequence[str] = ()
) -> list[dict[str, Any]]:
    """The DeviceClasses of every resource ``config`` advertises, in the plugin's order.

    Args:
        config: The GPU config the device plugin and the DRA driver read.
        driver: The DRA driver's name (``--driver-name``).
        mig_profiles: The MIG profiles of the nodes' MIG devices: under ``mixed`` each
            gets its class; under ``single`` they say the nodes' GPUs are MIG devices
            (the time-slicing config is then a ``MigDeviceConfig``).

    Raises:
        ConfigError: A sharing rename that collides with another resource (as for the
            device plugin).
    """
    strategy = config.flags.mig_strategy
    slicing = config.sharing.active
    out: list[dict[str, Any]] = []
    for base, name in advertised_names(config, mig_profiles).items():
        if base == GPU_RESOURCE:
            conditions = [] if strategy == "single" else [_attr(driver, "type", "gpu")]
            mig = strategy == "single" and bool(mig_profiles)
        else:
            profile = base.removeprefix(_MIG_PREFIX)
            conditions = [_attr(driver, "type", "mig"), _attr(driver, "profile", profile)]
            mig = True
        configs = []
        if slicing.replicas_of(base) > 1:
            parameters = {
                "apiVersion": API_VERSIONS[0],
                "kind": "MigDeviceConfig" if mig else "GpuConfig",
                "sharing": {"strategy": "TimeSlicing"},
            }
            configs.append(opaque_config(driver, parameters))
        out.append(device_class(name, selector(driver, *conditions), config=configs))
    return out


def node_mig_profiles(config: Config, backend: NvmlBackend) -> list[str]:
    """The MIG profiles of this node's MIG devices, as the classes need them (blocking).

    NVML is started only when ``migStrategy`` is not ``none`` (the profiles matter only
    then), and shut down before returning. With ``dra.migOnDemand`` the profiles every
    partitionable GPU offers are added (those whose ``nvidia.com/mig-<profile>`` is a valid
    resource name: not the ``+me`` ones), so a pod asking ``nvidia.com/mig-3g.40gb: 1``
    gets a 3g made on demand.

    Raises:
        NvmlError: NVML cannot start (and ``failOnInitError`` is set).
    """
    if config.flags.mig_strategy == "none":
        return []
    try:
        hw = enumerate_hardware(backend, fail_on_init_error=config.flags.fail_on_init_error)
        profiles = [m.profile for g in hw.gpus if g.mig_enabled for m in hw.mig.get(g.uuid, ())]
        if config.dra.mig_on_demand:
            for offered in partitionable(
                backend, hw.gpus, config.dra.mig_on_demand_profiles
            ).values():
                profiles.extend(p.name for p in offered if _is_resource(_MIG_PREFIX + p.name))
    finally:
        backend.shutdown()
    return profiles


def _is_resource(name: str) -> bool:
    try:
        validate_resource_name(name)
    except ConfigError:
        return False
    return True

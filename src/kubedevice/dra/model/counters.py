"""Counter sets and devices that consume counters, laid out in ResourceSlices as the API wants.

Partitionable devices (KEP-4815, ``DRAPartitionableDevices``, beta and on by default in
Kubernetes 1.36): a driver publishes counter sets (``spec.sharedCounters``) and devices
that consume from them (``devices[].consumesCounters``); the scheduler allocates a device
only while every counter it consumes has enough left in its pool, so overlapping
partitions of one piece of hardware are never given out together.

The API server's rules (resource.k8s.io/v1) kept here, before anything is written:

* a slice holds devices or counter sets, never both (counter sets go in slices of their
  own, first in the pool);
* at most 8 counter sets in a slice, 32 counters in a set;
* at most 64 devices in a slice where a device consumes counters (or has a taint), else
  128 (:mod:`kubedevice.dra.api.slices` cuts the devices into slices);
* a device consumes from at most 2 sets, at most 32 counters from each (checked by
  :class:`~kubedevice.dra.model.types.Device`); every set and counter it names must exist in
  the pool (the API server does not check this; the scheduler would never allocate such a
  device).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from kubedevice.dra.model.types import CounterSet, Device, Quantity
from kubedevice.errors import ConfigError

__all__ = [
    "MAX_COUNTER_SETS_PER_SLICE",
    "check_counters",
    "consumption_objects",
    "counter_set_chunks",
    "counter_set_object",
    "counters_dropped",
    "without_counters",
]

#: resource.k8s.io/v1: at most 8 counter sets in one ResourceSlice.
MAX_COUNTER_SETS_PER_SLICE: Final = 8


def check_counters(devices: Sequence[Device], counter_sets: Sequence[CounterSet]) -> None:
    """Check that set names are unique and every consumption names a set and its counters.

    Raises:
        ConfigError: naming the device (or set) and what is wrong.
    """
    sets: dict[str, Mapping[str, Quantity | int | str]] = {}
    for cs in counter_sets:
        if cs.name in sets:
            raise ConfigError(f"counter set {cs.name} is defined twice")
        sets[cs.name] = cs.counters
    for device in devices:
        for use in device.consumes_counters:
            have = sets.get(use.counter_set)
            if have is None:
                raise ConfigError(
                    f"device {device.name}: consumes from counter set {use.counter_set}, "
                    "which the driver does not publish"
                )
            missing = sorted(set(use.counters) - set(have))
            if missing:
                raise ConfigError(
                    f"device {device.name}: counter set {use.counter_set} has no counter "
                    f"{missing[0]}"
                )


def _counters(counters: Mapping[str, Quantity | int | str]) -> dict[str, Any]:
    return {name: {"value": str(value)} for name, value in counters.items()}


def counter_set_object(counter_set: CounterSet) -> dict[str, Any]:
    """A counter set as ``spec.sharedCounters[]`` JSON."""
    return {"name": counter_set.name, "counters": _counters(counter_set.counters)}


def consumption_objects(device: Device) -> list[dict[str, Any]]:
    """A device's ``consumesCounters`` JSON (empty when it consumes none)."""
    return [
        {"counterSet": c.counter_set, "counters": _counters(c.counters)}
        for c in device.consumes_counters
    ]


def without_counters(device: dict[str, Any]) -> dict[str, Any]:
    """A device object less its ``consumesCounters``."""
    return {k: v for k, v in device.items() if k != "consumesCounters"}


def counter_set_chunks(counter_sets: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Counter sets (JSON) in slice-sized runs: 8 to a slice."""
    step = MAX_COUNTER_SETS_PER_SLICE
    return [counter_sets[i : i + step] for i in range(0, len(counter_sets), step)]


def counters_dropped(sent: dict[str, Any], stored: dict[str, Any]) -> bool:
    """Whether the API server stored ``sent`` without its counter sets or consumptions
    (an API server without ``DRAPartitionableDevices`` drops both fields)."""
    spec, kept = sent["spec"], stored.get("spec", {})
    if spec.get("sharedCounters") and not kept.get("sharedCounters"):
        return True
    wanted = {d["name"] for d in spec.get("devices") or [] if d.get("consumesCounters")}
    have = {d.get("name") for d in kept.get("devices") or [] if d.get("consumesCounters")}
    return not wanted <= have

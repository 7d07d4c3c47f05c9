"""The device taints a driver publishes: one per device that is not healthy, keyed by why.

A device with a :class:`~kubedevice.dra.model.types.Fault` gets the taint ``<driver>/<kind>``
with the fault's value (``gpu.kubedevice.io/xid=79``, ``gpu.kubedevice.io/gpu-lost``,
``dev.kubedevice.io/health-check=<group>``); one without gets ``<driver>/unhealthy`` with
its health as the value. The effect is ``NoSchedule`` (the scheduler gives the device to
no new claim unless the claim tolerates the taint), or ``NoExecute`` for the faults named
in ``--evict-on``: the controller-manager's device-taint eviction then deletes the pods
whose claims have the device and do not tolerate the taint. The taint goes when the device
is healthy again.

An ``--evict-on`` entry is a kind (``xid``: every XID), a kind and a value (``xid=79``),
or ``all``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, Final

from kubedevice.dra.model.types import Device, Fault, Health
from kubedevice.errors import ConfigError

__all__ = ["ALL", "UNHEALTHY_KIND", "TaintPolicy", "parse_evict_on"]

#: ``--evict-on all``: every fault evicts.
ALL: Final = "all"
#: The kind of the taint on a device that is not healthy and gives no fault.
UNHEALTHY_KIND: Final = "unhealthy"
_PART: Final = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9]$")


def parse_evict_on(entries: Iterable[str]) -> frozenset[str]:
    """The ``--evict-on`` entries (each may be a comma-separated list), checked.

    Raises:
        ConfigError: An entry is not ``KIND``, ``KIND=VALUE`` or ``all``.
    """
    out: set[str] = set()
    for entry in entries:
        for item in (p.strip() for p in str(entry).split(",")):
            if not item:
                continue
            kind, sep, value = item.partition("=")
            if not _PART.match(kind) or (sep and not _PART.match(value)):
                raise ConfigError(
                    f"--evict-on {item!r}: expected a fault kind (xid, gpu-lost, "
                    "health-check, unhealthy), KIND=VALUE (xid=79) or 'all'"
                )
            out.add(item)
    return frozenset(out)


class TaintPolicy:
    """The taints of a driver's devices.

    Args:
        driver: The driver's name (the taint keys' prefix).
        evict_on: Faults whose taint is ``NoExecute`` (see :func:`parse_evict_on`).
    """

    def __init__(self, driver: str, evict_on: Iterable[str] = ()) -> None:
        self.driver = driver
        self.evict_on = parse_evict_on(evict_on)

    def fault_of(self, device: Device) -> Fault:
        """The fault behind ``device``'s taint (``unhealthy`` when it gives none)."""
        if device.fault is not None:
            return device.fault
        return Fault(UNHEALTHY_KIND, str(device.health))

    def effect(self, fault: Fault) -> str:
        """``NoExecute`` for a fault named in ``evict_on``, else ``NoSchedule``."""
        names = {ALL, fault.kind, f"{fault.kind}={fault.value}"}
        return "NoExecute" if names & self.evict_on else "NoSchedule"

    def taints(self, device: Device) -> list[dict[str, Any]]:
        """``device``'s taints as ResourceSlice JSON (none when it is healthy)."""
        if device.health == Health.HEALTHY:
            return []
        fault = self.fault_of(device)
        taint: dict[str, Any] = {"key": f"{self.driver}/{fault.kind}"}
        if fault.value:  # the API server stores an empty value as none
            taint["value"] = fault.value
        taint["effect"] = self.effect(fault)
        return [taint]

"""What the kit checks on every claim before the driver's prepare hook sees it.

The same rules for every driver built on the kit, so the GPU driver and the generic driver
answer the same claim the same way:

* **Some device of this node.** A claim whose allocation names none of this driver's
  devices in this node's pool is an error (the kubelet asked the wrong driver, or the
  allocation was written by hand): never a success with no device.
* **Healthy devices only.** A device the driver reports ``Unhealthy`` or ``Unknown`` is
  published with a taint keyed by its fault (:mod:`kubedevice.dra.model.taints`:
  ``<driver>/xid=79``, ``<driver>/health-check=<group>``, ``<driver>/unhealthy``); a claim
  allocated to it (before it went bad, or written by hand) is refused, unless its
  allocation result carries a toleration of that taint (the user asked for the device as
  it is).
* **One device, one claim.** A device already prepared (or being prepared) for another
  claim on this node is refused, naming both claims and the device, unless one of the two
  has admin access to it or both hold distinct shares of it (``shareID``, consumable
  capacity) and the driver publishes it with ``allow_multiple_allocations``. The prepared
  claims come from the checkpoint, so this holds across restarts and between the claims of
  one call.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from kubedevice.dra.model.taints import TaintPolicy
from kubedevice.dra.model.types import AllocatedDevice, Claim, Device, Health, PreparedClaim
from kubedevice.errors import ClaimError, DeviceHeldError

__all__ = ["check_claim", "tolerates"]


def check_claim(
    claim: Claim,
    *,
    driver_name: str,
    node_name: str,
    devices: Mapping[str, Device],
    taints: TaintPolicy,
    held: Iterable[PreparedClaim],
) -> None:
    """Apply the rules above to ``claim`` (read from the API server, not yet prepared).

    Args:
        claim: The claim, its devices those of this driver and pool.
        driver_name: This driver.
        node_name: This node (the pool).
        devices: The driver's current devices by name.
        taints: The driver's taint policy (which taint a device that is not healthy has).
        held: The claims prepared, or being prepared, on this node (``claim`` may be one).

    Raises:
        ClaimError: A rule is broken; the message says which, naming claim and device
            (:class:`~kubedevice.errors.DeviceHeldError`: the device is another claim's).
    """
    if not claim.devices:
        raise ClaimError(
            f"claim {claim.ref} has no device of driver {driver_name} in pool {node_name} "
            "allocated: nothing to prepare on this node"
        )
    for allocated in claim.devices:
        device = devices.get(allocated.name)
        if device is None or device.health == Health.HEALTHY:
            continue
        for taint in taints.taints(device):
            if any(tolerates(t, taint) for t in allocated.tolerations):
                continue
            value = f"={taint['value']}" if taint.get("value") else ""
            fault = taints.fault_of(device)
            why = f"{fault}; " if fault.message else ""
            raise ClaimError(
                f"device {allocated.name} is {device.health} ({why}tainted "
                f"{taint['key']}{value}:{taint['effect']}) and claim {claim.ref} does not "
                "tolerate it: not prepared"
            )
    for other in held:
        if other.ref.uid == claim.ref.uid:
            continue
        for allocated in claim.devices:
            _check_shared(claim, allocated, other, devices.get(allocated.name))


def _check_shared(
    claim: Claim, allocated: AllocatedDevice, other: PreparedClaim, device: Device | None
) -> None:
    shareable = device is not None and device.allow_multiple_allocations
    for i, (_request, pool, name) in enumerate(other.devices):
        if (pool, name) != (allocated.pool, allocated.name):
            continue
        admin = i < len(other.admin_access) and other.admin_access[i]
        share = other.share_ids[i] if i < len(other.share_ids) else None
        if allocated.admin_access or admin:
            continue
        distinct = allocated.share_id is not None and share is not None
        if shareable and distinct and allocated.share_id != share:
            continue
        why = (
            "a distinct share ID"
            if shareable
            else "admin access (the device does not allow multiple allocations)"
        )
        raise DeviceHeldError(
            f"device {name} (pool {pool}) is already prepared for claim {other.ref}; "
            f"claim {claim.ref} is allocated the same device without {why}: not prepared",
            holder=other.ref.uid,
            device=name,
        )


def tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    """Whether a device toleration (JSON) tolerates a device taint (JSON), as the scheduler
    matches them: the same effect (or none), and the key (``Exists``; no key: any) or key
    and value (``Equal``, the default)."""
    if toleration.get("effect") not in (None, "", taint.get("effect")):
        return False
    operator = toleration.get("operator") or "Equal"
    if operator == "Exists":
        return toleration.get("key") in (None, "", taint.get("key"))
    return (
        operator == "Equal"
        and toleration.get("key") == taint.get("key")
        and (toleration.get("value") or "") == (taint.get("value") or "")
    )

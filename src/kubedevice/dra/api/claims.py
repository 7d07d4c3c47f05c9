"""A ResourceClaim from the API server, turned into the :class:`Claim` the driver prepares.

Checks what the kubelet cannot: the UID is still the claim's, the claim is allocated, and
its allocation is sane (a bounded number of results, opaque configs that are JSON objects
of bounded size). Every problem is a :class:`~kubedevice.errors.ClaimError` with one clear
line; it becomes that claim's ``error`` in the answer, never a traceback.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

from kubedevice.dra.model.types import AllocatedDevice, Claim, ClaimRef, Device, OpaqueConfig
from kubedevice.errors import ClaimError

__all__ = ["MAX_OPAQUE_BYTES", "MAX_RESULTS", "claim_from_object"]

#: At most this many allocation results in one claim (the API allows far fewer today).
MAX_RESULTS: Final = 128
#: An opaque config's parameters: at most 10 KiB of JSON, as the API server allows.
MAX_OPAQUE_BYTES: Final = 10 * 1024

_FROM_CLASS: Final = "FromClass"
_FROM_CLAIM: Final = "FromClaim"


def claim_from_object(
    ref: ClaimRef,
    obj: Mapping[str, Any],
    *,
    driver_name: str,
    pool: str,
    devices: Mapping[str, Device],
) -> Claim:
    """The :class:`Claim` of ``obj`` for this driver and ``pool``.

    Args:
        ref: The claim as the kubelet named it.
        obj: The ResourceClaim (JSON) read from the API server.
        driver_name: This driver.
        pool: This node's pool.
        devices: The driver's current devices by name.

    Raises:
        ClaimError: The UID differs, the claim is not allocated, or its allocation is bad.
    """
    metadata = _mapping(obj.get("metadata"), "metadata")
    uid = metadata.get("uid")
    if uid != ref.uid:
        raise ClaimError(
            f"claim {ref.namespace}/{ref.name} has UID {uid}, not {ref.uid} "
            "(deleted and created again?)"
        )
    status = _mapping(obj.get("status"), "status")
    allocation = status.get("allocation")
    if not allocation:
        raise ClaimError(f"claim {ref.namespace}/{ref.name} is not allocated")
    allocated = _mapping(_mapping(allocation, "status.allocation").get("devices"), "devices")
    results = allocated.get("results") or []
    if not isinstance(results, list):
        raise ClaimError("status.allocation.devices.results is not a list")
    if len(results) > MAX_RESULTS:
        raise ClaimError(
            f"claim {ref.namespace}/{ref.name} has {len(results)} allocation results; "
            f"this driver takes at most {MAX_RESULTS}"
        )
    configs = _configs(allocated.get("config") or [], driver_name)
    out: list[AllocatedDevice] = []
    for index, result in enumerate(results):
        where = f"status.allocation.devices.results[{index}]"
        result = _mapping(result, where)
        if result.get("driver") != driver_name or result.get("pool") != pool:
            continue
        request = _string(result.get("request"), f"{where}.request")
        name = _string(result.get("device"), f"{where}.device")
        share_id = result.get("shareID")
        tolerations = result.get("tolerations") or []
        if not isinstance(tolerations, list) or not all(
            isinstance(t, Mapping) for t in tolerations
        ):
            raise ClaimError(f"{where}.tolerations is not a list of objects")
        consumed = result.get("consumedCapacity") or {}
        if not isinstance(consumed, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str | int) for k, v in consumed.items()
        ):
            raise ClaimError(f"{where}.consumedCapacity is not a map of quantities")
        out.append(
            AllocatedDevice(
                request=request,
                pool=pool,
                name=name,
                device=devices.get(name),
                configs=tuple(c for c in configs if c.applies_to(request)),
                admin_access=bool(result.get("adminAccess")),
                share_id=None if share_id is None else str(share_id),
                tolerations=tuple(tolerations),
                consumed_capacity={k: str(v) for k, v in consumed.items()},
            )
        )
    return Claim(ref=ref, devices=tuple(out), configs=configs, resource_claim=obj)


def _configs(raw: Any, driver_name: str) -> tuple[OpaqueConfig, ...]:
    if not isinstance(raw, list):
        raise ClaimError("status.allocation.devices.config is not a list")
    from_class: list[OpaqueConfig] = []
    from_claim: list[OpaqueConfig] = []
    for index, entry in enumerate(raw):
        where = f"status.allocation.devices.config[{index}]"
        entry = _mapping(entry, where)
        opaque = entry.get("opaque")
        if not opaque:
            continue  # a config kind this kit does not know; not ours
        opaque = _mapping(opaque, f"{where}.opaque")
        if opaque.get("driver") != driver_name:
            continue
        parameters = opaque.get("parameters")
        if isinstance(parameters, str):  # raw bytes handed through as text
            try:
                parameters = json.loads(parameters)
            except ValueError as exc:
                raise ClaimError(f"{where}.opaque.parameters is not JSON: {exc}") from None
        size = len(json.dumps(parameters, separators=(",", ":")))
        if size > MAX_OPAQUE_BYTES:
            raise ClaimError(
                f"{where}.opaque.parameters is {size} bytes of JSON; at most {MAX_OPAQUE_BYTES}"
            )
        if not isinstance(parameters, dict):
            raise ClaimError(f"{where}.opaque.parameters must be a JSON object")
        requests = entry.get("requests") or []
        if not isinstance(requests, list) or not all(isinstance(r, str) for r in requests):
            raise ClaimError(f"{where}.requests must be a list of request names")
        source = entry.get("source") or _FROM_CLAIM
        config = OpaqueConfig(parameters=parameters, requests=tuple(requests), source=source)
        (from_class if source == _FROM_CLASS else from_claim).append(config)
    return (*from_class, *from_claim)


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ClaimError(f"{where} is not an object")
    return value


def _string(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise ClaimError(f"{where} is missing or not a string")
    return value

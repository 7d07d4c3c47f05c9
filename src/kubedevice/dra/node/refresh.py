"""A prepared claim made true again: the driver's ``refresh`` answer checked and merged.

The ``refresh`` hook (:meth:`kubedevice.dra.Driver.refresh`) runs for each prepared claim
at start and before every answer from the checkpoint; what it remade (a MIG device a reboot
destroyed, say) replaces those devices' ``data`` and CDI edits in the claim's checkpoint
entry. The CDI IDs stay: the kubelet holds them.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from kubedevice.dra.driver import Driver
from kubedevice.dra.model.types import (
    AllocatedDevice,
    ContainerEdits,
    PreparedClaim,
    PreparedDevice,
)
from kubedevice.dra.state.cdi import cdi_edits
from kubedevice.errors import ClaimError

__all__ = ["ask_refresh", "check_prepared_device", "merge_refresh"]

log = logging.getLogger(__name__)


async def ask_refresh(
    driver: Driver,
    prepared: PreparedClaim,
    call_hook: Callable[[Callable[[Any], Any], Any], Awaitable[Any]],
    json_data: Callable[[PreparedDevice], Mapping[str, Any]],
) -> PreparedClaim | None:
    """Call ``driver``'s ``refresh`` hook for ``prepared``; the entry it changed, or ``None``.

    A driver without the hook, or an entry older than the edits it keeps (that one is
    prepared again instead), is not asked.

    Raises:
        ClaimError: The hook failed (any exception, logged with its traceback) or its
            answer is wrong.
    """
    if type(driver).refresh is Driver.refresh or any(e is None for e in prepared.edits):
        return None
    try:
        answer = await call_hook(driver.refresh, prepared)
    except ClaimError:
        raise
    except Exception as exc:
        log.exception("the refresh hook failed for claim %s", prepared.ref)
        raise ClaimError(f"refreshing failed: {type(exc).__name__}: {exc}") from None
    merged = merge_refresh(prepared, answer, json_data)
    if merged is not None:
        log.warning("claim %s: the driver remade some of its devices", prepared.ref)
    return merged


def check_prepared_device(item: Any, what: str) -> PreparedDevice:
    """``item`` of a hook's answer (``what``: "the prepare hook"), if it is a
    :class:`PreparedDevice` of an :class:`AllocatedDevice` with :class:`ContainerEdits`.

    Raises:
        ClaimError: It is not (one line naming what it is).
    """
    if not isinstance(item, PreparedDevice):
        raise ClaimError(f"{what} returned {type(item).__name__}, not PreparedDevice")
    if not isinstance(item.device, AllocatedDevice):
        raise ClaimError(
            f"{what} returned a PreparedDevice whose device is {type(item.device).__name__}, "
            "not the AllocatedDevice of the claim"
        )
    if not isinstance(item.edits, ContainerEdits):
        raise ClaimError(
            f"{what} returned device {item.device.name} with edits "
            f"{type(item.edits).__name__}, not ContainerEdits"
        )
    return item


def merge_refresh(
    prepared: PreparedClaim,
    answer: Any,
    json_data: Callable[[PreparedDevice], Mapping[str, Any]],
) -> PreparedClaim | None:
    """``prepared`` with what the hook remade; ``None`` when it remade nothing.

    Args:
        prepared: The claim's checkpoint entry (with its edits).
        answer: What the hook returned: ``None``, or one entry per device.
        json_data: Checks a :class:`PreparedDevice`'s ``data`` and returns it as the
            checkpoint will give it back (raises :class:`ClaimError`).

    Raises:
        ClaimError: The answer is not one entry per device, names another device, or
            gives a device edits where it had none (or none where it had some).
    """
    if answer is None:
        return None
    what = "the refresh hook"
    if not isinstance(answer, list | tuple) or len(answer) != len(prepared.devices):
        raise ClaimError(f"{what} must return None or one entry per device of the claim")
    data: list[Mapping[str, Any]] = list(prepared.data) + [{}] * (
        len(prepared.devices) - len(prepared.data)
    )
    edits = list(prepared.edits)
    changed = False
    for i, item in enumerate(answer):
        if item is None:
            continue
        item = check_prepared_device(item, what)
        request, _pool, name = prepared.devices[i]
        if (item.device.request, item.device.name) != (request, name):
            raise ClaimError(
                f"{what} returned device {item.device.name} (request {item.device.request}) "
                f"where the claim has {name} (request {request})"
            )
        own = cdi_edits(item.edits)
        had = bool(prepared.cdi_ids[i]) if i < len(prepared.cdi_ids) else False
        if bool(own) != had:
            raise ClaimError(
                f"{what}: device {name} was answered {'with' if had else 'without'} a CDI "
                "device; it must stay so"
            )
        data[i] = json_data(item)
        edits[i] = own
        changed = True
    if not changed:
        return None
    return dataclasses.replace(prepared, data=tuple(data), edits=tuple(edits))

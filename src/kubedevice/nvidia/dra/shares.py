"""Memory shares (``dra.memoryShares``): the env telling a container its claim's share.

A share is an allocation of a whole GPU that allows multiple allocations, with ``memory``
in its consumed capacity. Nothing enforces it without MPS: the workload is advised.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Final

from kubedevice.dra.model.capacity import quantity_value
from kubedevice.dra.model.types import AllocatedDevice
from kubedevice.errors import ConfigError

__all__ = ["MEMORY_LIMIT_ENV", "share_bytes", "share_env"]

log = logging.getLogger(__name__)

#: The env a memory share is told its size in (bytes); ``..._<GPU UUID>`` per GPU.
MEMORY_LIMIT_ENV: Final = "KUBEDEVICE_GPU_MEMORY_LIMIT"


def share_bytes(allocated: AllocatedDevice) -> int | None:
    """The memory share (bytes, rounded up) an allocated device holds, if it is a share."""
    memory = allocated.consumed_capacity.get("memory")
    if allocated.share_id is None or not memory:
        return None
    try:
        size = quantity_value(memory)
    except ConfigError:
        log.warning(
            "share %s of %s: memory %r is no quantity", allocated.share_id, allocated.name, memory
        )
        return None
    return -(-size.numerator // size.denominator)


def share_env(
    devices: Sequence[tuple[AllocatedDevice, str]],
) -> list[dict[str, str]]:
    """The env telling each device's containers the claim's memory share of its GPU.

    A claim's shares of one GPU add up (two requests of 10Gi and 15Gi: 25Gi): every share
    of a GPU is told the claim's total on that GPU, so a container given them all is told
    what the claim holds, whichever CDI device's env the runtime applies last.

    Args:
        devices: Each allocated device and its GPU's (or MIG device's) UUID, in order.

    Returns:
        One env per device (empty for a device that is no share): the total in
        ``KUBEDEVICE_GPU_MEMORY_LIMIT_<UUID>`` and, when the claim's shares are all of one
        GPU, in ``KUBEDEVICE_GPU_MEMORY_LIMIT`` too.
    """
    sizes = [share_bytes(allocated) for allocated, _ in devices]
    totals: dict[str, int] = {}
    for (_, uuid), size in zip(devices, sizes, strict=True):
        if size is not None:
            totals[uuid] = totals.get(uuid, 0) + size
    out: list[dict[str, str]] = []
    for (_, uuid), size in zip(devices, sizes, strict=True):
        if size is None:
            out.append({})
            continue
        limit = str(totals[uuid])
        env = {f"{MEMORY_LIMIT_ENV}_{uuid.replace('-', '_').upper()}": limit}
        if len(totals) == 1:
            env[MEMORY_LIMIT_ENV] = limit
        out.append(env)
    return out

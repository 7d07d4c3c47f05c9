"""GetPreferredAllocation: the default policy and the invariants every answer must keep.

Invariants (checked on hook answers too): the answer contains every must-include ID,
never an ID that was not offered, no duplicates, and exactly ``size`` IDs when enough
were offered (never fewer than the must-include IDs).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from kubedevice.plugin.types import Device

__all__ = ["default_preferred_allocation", "enforce_preferred_invariants"]


def _unique(ids: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(ids))


def default_preferred_allocation(
    available: Sequence[Device], must_include: Sequence[Device], size: int
) -> list[str]:
    """The default choice: must-include first, then NUMA neighbours, then offered order.

    Devices that share at least one NUMA node with a must-include device come before the
    others; within each group the offered order is kept (stable).

    Args:
        available: The offered devices.
        must_include: Devices that must be in the answer.
        size: The total number of IDs wanted.

    Returns:
        The chosen IDs: all must-include IDs, then up to ``size`` in total.
    """
    chosen = _unique(d.id for d in must_include)
    taken = set(chosen)
    nodes = {n for d in must_include for n in d.numa_nodes}
    near: list[str] = []
    far: list[str] = []
    for dev in available:
        if dev.id in taken:
            continue
        taken.add(dev.id)
        (near if nodes and nodes.intersection(dev.numa_nodes) else far).append(dev.id)
    room = max(size - len(chosen), 0)
    return chosen + (near + far)[:room]


def enforce_preferred_invariants(
    answer: Iterable[str],
    available_ids: Sequence[str],
    must_include_ids: Sequence[str],
    size: int,
    fill: Sequence[str] = (),
) -> list[str]:
    """Repair an answer so that it keeps the invariants.

    Args:
        answer: The IDs a hook chose, in its order.
        available_ids: The IDs offered by the kubelet.
        must_include_ids: The IDs that must be in the answer.
        size: The total number of IDs wanted.
        fill: IDs to complete a short answer with, in order of preference (IDs that
            were not offered are skipped); the offered order is used after them.

    Returns:
        Must-include IDs first, then the hook's valid picks, then fill, so that the
        length is ``max(size, len(must_include))`` when enough IDs were offered.
    """
    must = _unique(must_include_ids)
    offered = set(available_ids).union(must)
    result = list(must)
    seen = set(result)
    target = max(size, len(must))
    for source in (answer, fill, available_ids):
        for dev_id in source:
            if len(result) >= target:
                return result
            if dev_id in offered and dev_id not in seen:
                seen.add(dev_id)
                result.append(dev_id)
    return result

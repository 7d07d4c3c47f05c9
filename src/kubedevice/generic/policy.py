"""Preferred allocation for the generic plugin: same NUMA node first, replicas spread or packed.

Pure functions over device IDs; the kubelet treats the answer as a hint only.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from typing import Literal

__all__ = ["Placement", "preferred_allocation"]

Placement = Literal["spread", "pack"]


def preferred_allocation(
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
    describe: Callable[[str], tuple[str, int | None]],
    placement: Placement = "spread",
) -> list[str]:
    """Choose ``size`` IDs: ``must_include`` first, then the best of ``available``.

    Args:
        available: Candidate IDs (order does not matter: the answer is deterministic).
        must_include: IDs that must be in the answer (they count toward ``size``).
        size: Total number of IDs wanted.
        describe: Maps an ID to (physical device ID, NUMA node or None).
        placement: ``spread`` takes replicas from the least-used physical device first;
            ``pack`` fills physical devices already in use, then the ones with the most
            free replicas, so the fewest physical devices are touched.

    Returns:
        The preferred IDs. NUMA nodes are tried in order: those of ``must_include``, then
        by number of free candidates (most first), devices without NUMA last.
    """
    chosen = list(dict.fromkeys(must_include))
    need = size - len(chosen)
    if need <= 0:
        return chosen
    taken = set(chosen)
    candidates = sorted(a for a in set(available) if a not in taken)
    used: dict[str, int] = {}
    must_numa: dict[int, int] = {}
    for dev_id in chosen:
        phys, numa = describe(dev_id)
        used[phys] = used.get(phys, 0) + 1
        if numa is not None:
            must_numa[numa] = must_numa.get(numa, 0) + 1
    replicas: dict[str, list[str]] = {}
    phys_numa: dict[str, int | None] = {}
    numa_count: dict[int, int] = {}
    for dev_id in candidates:
        phys, numa = describe(dev_id)
        replicas.setdefault(phys, []).append(dev_id)
        phys_numa[phys] = numa
        if numa is not None:
            numa_count[numa] = numa_count.get(numa, 0) + 1
    order = sorted(numa_count, key=lambda n: (-must_numa.get(n, 0), -numa_count[n], n))
    rank = {node: i for i, node in enumerate(order)}
    none_rank = len(order)

    def key(phys: str) -> tuple[int, int, int, str]:
        numa = phys_numa[phys]
        r = none_rank if numa is None else rank[numa]
        if placement == "spread":
            return (r, used.get(phys, 0), 0, phys)
        return (r, 0 if used.get(phys, 0) else 1, -len(replicas[phys]), phys)

    heap = [(key(p), p) for p in replicas]
    heapq.heapify(heap)
    for queue in replicas.values():
        queue.reverse()  # pop() from the end takes the lowest ID first
    while need > 0 and heap:
        _, phys = heapq.heappop(heap)
        chosen.append(replicas[phys].pop())
        used[phys] = used.get(phys, 0) + 1
        need -= 1
        if replicas[phys]:
            heapq.heappush(heap, (key(phys), phys))
    return chosen

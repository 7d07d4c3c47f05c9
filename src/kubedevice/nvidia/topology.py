"""Topology-aware GetPreferredAllocation: the set of GPUs with the best interconnect.

Two GPUs score (higher is better)::

    100 per NVLink link between them
    + 40 same board (INTERNAL) / 30 one PCIe switch (PIX) / 25 several switches (PXB)
    / 20 same host bridge (PHB) / 10 same NUMA node (NODE) / 0 across sockets (SYS)

so any NVLink beats any PCIe path, a shared switch beats a shared NUMA node, and a
shared NUMA node beats crossing sockets. When NVML cannot tell how two GPUs connect, the
NUMA nodes read from sysfs decide (10 when equal and known, else 0). A set scores the sum
over its pairs.

Choosing ``size`` device IDs out of ``available`` (``(device_id, gpu_uuid)`` pairs, so
replica IDs ``<uuid>::<n>`` and index IDs work alike):

1. the must-include IDs are kept, first, in their order;
2. the other picks fill the GPUs up like water: each round takes the GPUs with the
   fewest devices taken, counting those ``load`` says other containers hold and those
   this answer holds, so replicas spread over GPUs before two land on one, and
   time-sliced replicas spread over the node as NVIDIA's plugin balances them (four
   1-replica pods on four GPUs get one GPU each; a pod lands on a busy GPU only when
   it asks for it with must-include IDs, or when no idler GPU is left);
3. when a round's GPUs outnumber the picks left, the ones that maximise the set's
   score; exhaustively when there are at most :data:`EXACT_LIMIT` combinations (always
   the case with up to 8 GPUs: at most 70), else greedy builds improved by 1-for-1
   swaps (a fixed number of rounds), a few milliseconds for 16 GPUs.

Ties go to the earlier GPU in the offered order, so the answer is deterministic.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kubedevice.errors import NvmlError
from kubedevice.nvidia.backend import GpuInfo, Link, NvmlBackend, P2PLevel

__all__ = [
    "EXACT_LIMIT",
    "Topology",
    "build_topology",
    "pair_score",
    "preferred_allocation",
    "set_score",
]

EXACT_LIMIT = 500  # combinations tried exhaustively; beyond, the bounded heuristic
_SWAP_ROUNDS = 4

_LEVEL_SCORE = {
    P2PLevel.INTERNAL: 40,
    P2PLevel.SINGLE: 30,
    P2PLevel.MULTIPLE: 25,
    P2PLevel.HOSTBRIDGE: 20,
    P2PLevel.NODE: 10,
    P2PLevel.SYSTEM: 0,
}
_NVLINK_SCORE = 100
_SAME_NUMA_SCORE = 10


@dataclass(frozen=True)
class Topology:
    """How every pair of GPUs is connected (pairs NVML could not tell are absent)."""

    links: Mapping[frozenset[str], Link]
    numa: Mapping[str, int | None]

    def link(self, a: str, b: str) -> Link | None:
        """The link between two GPUs, or ``None`` when unknown."""
        return self.links.get(frozenset((a, b)))


def build_topology(
    backend: NvmlBackend, gpus: Sequence[GpuInfo], numa: Mapping[str, int | None]
) -> Topology:
    """Ask NVML about every pair of ``gpus``; a pair whose call fails is left unknown."""
    links: dict[frozenset[str], Link] = {}
    for a, b in itertools.combinations(gpus, 2):
        try:
            link = backend.link(a.uuid, b.uuid)
        except NvmlError:
            link = None
        if link is not None:
            links[frozenset((a.uuid, b.uuid))] = link
    return Topology(links=links, numa=dict(numa))


def pair_score(topology: Topology, a: str, b: str) -> int:
    """How well two GPUs are connected (see the module docstring); 0 for the same GPU."""
    if a == b:
        return 0
    link = topology.link(a, b)
    if link is not None:
        return _NVLINK_SCORE * link.nvlinks + _LEVEL_SCORE.get(link.level, 0)
    na, nb = topology.numa.get(a), topology.numa.get(b)
    return _SAME_NUMA_SCORE if na is not None and na == nb else 0


def set_score(topology: Topology, uuids: Sequence[str]) -> int:
    """The sum of :func:`pair_score` over the distinct GPUs of ``uuids``."""
    distinct = list(dict.fromkeys(uuids))
    return sum(pair_score(topology, a, b) for a, b in itertools.combinations(distinct, 2))


def _gpu_of(device_id: str, owner: Mapping[str, str]) -> str:
    if device_id in owner:
        return owner[device_id]
    return device_id.split("::", 1)[0]


def preferred_allocation(
    topology: Topology,
    available: Sequence[tuple[str, str]],
    must_include: Sequence[str],
    size: int,
    load: Mapping[str, int] | None = None,
) -> list[str]:
    """The device IDs to allocate: must-include first, then the best-connected picks.

    Args:
        topology: From :func:`build_topology`.
        available: ``(device_id, gpu_uuid)`` pairs offered by the kubelet.
        must_include: IDs that must be in the answer (kept even if not offered).
        size: How many IDs are wanted in total.
        load: GPU UUID -> how many of its devices (replicas) are taken already; the
            least-loaded GPUs are preferred. ``None``: every GPU counts as idle.

    Returns:
        ``max(size, len(must_include))`` distinct IDs when enough were offered
        (fewer only when fewer exist); never an ID that was neither offered nor required.
    """
    owner = {dev: gpu for dev, gpu in available}
    chosen = list(dict.fromkeys(must_include))
    taken = set(chosen)
    # Free device IDs per GPU, GPUs in offered order.
    free: dict[str, list[str]] = {}
    for dev, gpu in available:
        if dev not in taken:
            taken.add(dev)
            free.setdefault(gpu, []).append(dev)
    want = max(size - len(chosen), 0)
    if want == 0:
        return chosen
    used: dict[str, int] = {}
    for dev in chosen:
        g = _gpu_of(dev, owner)
        used[g] = used.get(g, 0) + 1
    # Water-filling: each round takes the GPUs with the fewest devices taken (before and
    # by this request) that still have a free one; when that tier holds more GPUs than
    # picks are left, the best connected to the GPUs chosen so far win.
    load = load or {}
    level = {g: load.get(g, 0) + used.get(g, 0) for g in free}
    members = list(used)
    while want > 0:
        open_gpus = [g for g in free if free[g]]
        if not open_gpus:
            break
        low = min(level[g] for g in open_gpus)
        tier = [g for g in open_gpus if level[g] == low]
        for g in _best_gpus(topology, members, tier, min(want, len(tier))):
            chosen.append(free[g].pop(0))
            level[g] += 1
            want -= 1
            if g not in used:
                members.append(g)
            used[g] = used.get(g, 0) + 1
    return chosen


def _best_gpus(
    topology: Topology, fixed: Sequence[str], candidates: Sequence[str], k: int
) -> list[str]:
    """``k`` of ``candidates`` maximising the score of ``fixed`` plus them (ties: earlier)."""
    n = len(candidates)
    if k <= 0:
        return []
    if k >= n:
        return list(candidates)
    # Scores as plain lists: s[i][j] between candidates, base[i] towards the fixed GPUs.
    s = [[pair_score(topology, a, b) for b in candidates] for a in candidates]
    base = [sum(pair_score(topology, a, f) for f in fixed) for a in candidates]
    if math.comb(n, k) <= EXACT_LIMIT:
        return [candidates[i] for i in _exact(s, base, n, k)]
    return [candidates[i] for i in _heuristic(s, base, n, k)]


def _value(s: list[list[int]], base: list[int], pick: Sequence[int]) -> int:
    total = sum(base[i] for i in pick)
    for x, i in enumerate(pick):
        row = s[i]
        for j in pick[x + 1 :]:
            total += row[j]
    return total


def _exact(s: list[list[int]], base: list[int], n: int, k: int) -> tuple[int, ...]:
    best: tuple[int, ...] = tuple(range(k))
    best_value = _value(s, base, best)
    for pick in itertools.combinations(range(n), k):  # lexicographic: ties keep the earlier
        v = _value(s, base, pick)
        if v > best_value:
            best, best_value = pick, v
    return best


def _heuristic(s: list[list[int]], base: list[int], n: int, k: int) -> list[int]:
    """Greedy builds, each improved by up to _SWAP_ROUNDS best 1-for-1 swaps; the best wins.

    One build grows the set from each seed GPU; one more (picking over half the GPUs)
    starts from all of them and drops the weakest member until ``k`` remain.
    """
    best: list[int] = []
    best_value = -1
    starts: list[tuple[list[int], list[bool], list[int]]] = []
    if 2 * k > n:
        inside = [True] * n
        gain = [base[c] + sum(s[c]) for c in range(n)]  # s[c][c] == 0
        pick = list(range(n))
        while len(pick) > k:
            c = min(pick, key=lambda c: (gain[c], -c))
            pick.remove(c)
            inside[c] = False
            row = s[c]
            for x in range(n):
                gain[x] -= row[x]
        starts.append((pick, inside, gain))
    for seed in range(n):
        pick = [seed]
        inside = [False] * n
        inside[seed] = True
        gain = [base[c] + s[c][seed] for c in range(n)]  # value added by c joining
        while len(pick) < k:
            c = max((c for c in range(n) if not inside[c]), key=lambda c: (gain[c], -c))
            pick.append(c)
            inside[c] = True
            row = s[c]
            for x in range(n):
                gain[x] += row[x]
        starts.append((pick, inside, gain))
    for pick, inside, gain in starts:
        pick = _swaps(s, base, n, pick, inside, gain)
        value = _value(s, base, pick)
        if value > best_value:
            best, best_value = sorted(pick), value
    return best


def _swaps(
    s: list[list[int]],
    base: list[int],
    n: int,
    pick: list[int],
    inside: list[bool],
    gain: list[int],
) -> list[int]:
    """Improve ``pick`` by the best 1-for-1 exchange, at most _SWAP_ROUNDS times.

    ``gain[c]`` is ``base[c]`` plus c's scores towards every member of ``pick``, kept up
    to date; for a member that is exactly what it contributes to the set's value.
    """
    for _ in range(_SWAP_ROUNDS):
        move: tuple[int, int, int] | None = None  # (delta, out, in)
        for out in pick:
            g_out = gain[out]
            row_out = s[out]
            for inc in range(n):
                if inside[inc]:
                    continue
                delta = gain[inc] - row_out[inc] - g_out
                if delta > 0 and (move is None or delta > move[0]):
                    move = (delta, out, inc)
        if move is None:
            break
        _, out, inc = move
        pick[pick.index(out)] = inc
        inside[out], inside[inc] = False, True
        row_in, row_out = s[inc], s[out]
        for x in range(n):
            gain[x] += row_in[x] - row_out[x]
    return pick

"""Topology-aware preferred allocation: scenarios on the packaged machines and properties."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from kubedevice.nvidia.backend import Link, P2PLevel
from kubedevice.nvidia.fake import FakeNvml
from kubedevice.nvidia.topology import (
    Topology,
    build_topology,
    pair_score,
    preferred_allocation,
    set_score,
)


def _fake(name: str) -> Iterator[tuple[FakeNvml, Topology, list[str]]]:
    f = FakeNvml.from_file(name)
    f.init()
    gpus = f.gpus()
    topo = build_topology(f, gpus, {g.info.uuid: g.numa_node for g in f.machine.gpus})
    try:
        yield f, topo, [g.uuid for g in gpus]
    finally:
        f.close()


@pytest.fixture
def dgx() -> Iterator[tuple[FakeNvml, Topology, list[str]]]:
    yield from _fake("dgx-8gpu")


@pytest.fixture
def pcie() -> Iterator[tuple[FakeNvml, Topology, list[str]]]:
    yield from _fake("pcie-4gpu")


def test_score_order_nvlink_switch_numa_sockets() -> None:
    a, b, c, d, e = "A", "B", "C", "D", "E"
    topo = Topology(
        links={
            frozenset((a, b)): Link(P2PLevel.SYSTEM, nvlinks=1),
            frozenset((a, c)): Link(P2PLevel.SINGLE),
            frozenset((a, d)): Link(P2PLevel.NODE),
            frozenset((a, e)): Link(P2PLevel.SYSTEM),
        },
        numa={a: 0, b: 1, c: 0, d: 0, e: 1, "F": 0, "G": None},
    )
    scores = [pair_score(topo, a, x) for x in (b, c, d, e)]
    assert scores == sorted(scores, reverse=True)
    assert len(set(scores)) == 4
    assert pair_score(topo, a, "F") == pair_score(topo, a, d)  # unknown link: NUMA decides
    assert pair_score(topo, a, "G") == 0


def test_dgx_four_gpus_get_the_full_nvlink_clique(
    dgx: tuple[FakeNvml, Topology, list[str]],
) -> None:
    _, topo, u = dgx
    # Offer the GPUs in an order that puts the degraded clique first.
    order = [u[i] for i in (5, 6, 4, 7, 0, 1, 2, 3)]
    got = preferred_allocation(topo, [(x, x) for x in order], [], 4)
    assert set(got) == set(u[:4])


def test_dgx_pair_prefers_nvlink_on_one_switch(dgx: tuple[FakeNvml, Topology, list[str]]) -> None:
    _, topo, u = dgx
    got = preferred_allocation(topo, [(x, x) for x in u[2:]], [], 2)
    assert set(got) == {u[2], u[3]}  # 18 links and one PCIe switch


def test_dgx_must_include_pulls_the_set_to_its_clique(
    dgx: tuple[FakeNvml, Topology, list[str]],
) -> None:
    _, topo, u = dgx
    got = preferred_allocation(topo, [(x, x) for x in u], [u[6]], 3)
    assert got[0] == u[6]
    assert set(got) <= set(u[4:])
    assert u[5] not in got  # 5-6 is the degraded link


def test_pcie_box_pair_shares_a_switch(pcie: tuple[FakeNvml, Topology, list[str]]) -> None:
    _, topo, u = pcie
    got = preferred_allocation(topo, [(x, x) for x in (u[0], u[2], u[3])], [], 2)
    assert set(got) == {u[2], u[3]}
    got = preferred_allocation(topo, [(x, x) for x in u], [u[1]], 2)
    assert got == [u[1], u[0]]


def test_replicas_spread_over_gpus_first(dgx: tuple[FakeNvml, Topology, list[str]]) -> None:
    _, topo, u = dgx
    avail = [(f"{g}::{n}", g) for g in u[:2] for n in range(4)]
    got = preferred_allocation(topo, avail, [], 2)
    assert {x.split("::")[0] for x in got} == {u[0], u[1]}
    got = preferred_allocation(topo, avail, [f"{u[0]}::0"], 3)
    gpus = [x.split("::")[0] for x in got]
    assert got[0] == f"{u[0]}::0"
    assert sorted(gpus.count(g) for g in set(gpus)) == [1, 2]
    got = preferred_allocation(topo, avail, [], 8)
    assert sorted(got) == sorted(d for d, _ in avail)


def test_replicas_go_to_the_least_loaded_gpus(pcie: tuple[FakeNvml, Topology, list[str]]) -> None:
    _, topo, u = pcie
    # GPU A has replicas ::0..::2 taken, only A::3 is offered; B, C and D are idle
    avail = [(f"{u[0]}::3", u[0])] + [(f"{g}::{n}", g) for g in u[1:] for n in range(4)]
    load = {u[0]: 3, u[1]: 0, u[2]: 0, u[3]: 0}
    (got,) = preferred_allocation(topo, avail, [], 1, load)
    assert got.split("::")[0] != u[0]
    # five replicas: one on each idle GPU first, then the fewest taken (not A again)
    got5 = preferred_allocation(topo, avail, [], 5, load)
    gpus = [x.split("::")[0] for x in got5]
    assert gpus.count(u[0]) == 0
    assert sorted(gpus.count(g) for g in u[1:]) == [1, 2, 2]
    # asked for (must-include), A is packed
    assert preferred_allocation(topo, avail, [f"{u[0]}::3"], 1, load) == [f"{u[0]}::3"]


def test_four_one_replica_pods_land_on_four_gpus(
    pcie: tuple[FakeNvml, Topology, list[str]],
) -> None:
    _, topo, u = pcie
    taken: list[str] = []
    for _ in range(4):
        avail = [(f"{g}::{n}", g) for g in u for n in range(4) if f"{g}::{n}" not in taken]
        load = {g: sum(t.startswith(g) for t in taken) for g in u}
        taken += preferred_allocation(topo, avail, [], 1, load)
    assert sorted(t.split("::")[0] for t in taken) == sorted(u)


def test_must_include_not_offered_is_kept_and_size_below_must(
    dgx: tuple[FakeNvml, Topology, list[str]],
) -> None:
    _, topo, u = dgx
    assert preferred_allocation(topo, [(u[1], u[1])], [u[0], u[0]], 1) == [u[0]]
    assert preferred_allocation(topo, [(u[1], u[1])], [u[0]], 5) == [u[0], u[1]]


# ---- properties


def _random_topology(n: int, data: st.DataObject) -> tuple[Topology, list[str]]:
    uuids = [f"GPU-{i}" for i in range(n)]
    links = {}
    for a, b in itertools.combinations(uuids, 2):
        if data.draw(st.booleans(), label="known"):
            links[frozenset((a, b))] = Link(
                data.draw(st.sampled_from(list(P2PLevel)), label="level"),
                nvlinks=data.draw(st.sampled_from([0, 0, 0, 1, 2, 4, 12, 18]), label="nv"),
            )
    numa = {u: data.draw(st.sampled_from([None, 0, 1]), label="numa") for u in uuids}
    return Topology(links=links, numa=numa), uuids


def _key(topo: Topology, ids: list[str], owner: dict[str, str]) -> tuple[int, int]:
    gpus = list(dict.fromkeys(owner.get(i, i.split("::")[0]) for i in ids))
    return len(gpus), set_score(topo, gpus)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_invariants_and_optimal_against_brute_force(data: st.DataObject) -> None:
    n = data.draw(st.integers(1, 8), label="gpus")
    topo, uuids = _random_topology(n, data)
    replicas = data.draw(st.integers(1, 3), label="replicas")
    devices = [(f"{u}::{r}" if replicas > 1 else u, u) for u in uuids for r in range(replicas)]
    # At most 12 offered IDs keeps the brute force below C(12, 6) = 924 sets.
    available = data.draw(
        st.lists(st.sampled_from(devices), unique=True, min_size=1, max_size=min(12, len(devices))),
        label="available",
    )
    ids = [d for d, _ in available]
    must = data.draw(
        st.lists(st.sampled_from(ids), unique=True, max_size=min(3, len(ids))), label="must"
    )
    size = data.draw(st.integers(len(must), len(ids)), label="size")
    owner = dict(available)
    got = preferred_allocation(topo, available, must, size)
    assert len(got) == size
    assert len(set(got)) == len(got)
    assert got[: len(must)] == must
    assert set(got) <= set(ids)
    # Brute force over every way to complete the must-include IDs.
    rest = [i for i in ids if i not in must]
    best = max(
        _key(topo, must + list(c), owner) for c in itertools.combinations(rest, size - len(must))
    )
    assert _key(topo, got, owner) == best


@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_heuristic_beyond_eight_gpus_keeps_invariants(data: st.DataObject) -> None:
    topo, uuids = _random_topology(16, data)
    size = data.draw(st.integers(1, 16))
    must = data.draw(st.lists(st.sampled_from(uuids), unique=True, max_size=2))
    size = max(size, len(must))
    got = preferred_allocation(topo, [(u, u) for u in uuids], must, size)
    assert len(got) == size
    assert len(set(got)) == size
    assert got[: len(must)] == must


def _dgx16() -> tuple[Topology, list[str]]:
    """Two 8-GPU NVSwitch-like halves (NV18 inside a half), 2 GPUs per PCIe switch."""
    u = [f"GPU-{i:02d}" for i in range(16)]
    links = {}
    for i, j in itertools.combinations(range(16), 2):
        same_half = i // 8 == j // 8
        level = (
            P2PLevel.SINGLE
            if i // 2 == j // 2
            else (P2PLevel.NODE if same_half else P2PLevel.SYSTEM)
        )
        nv = 18 if same_half else 0
        if (i, j) in ((1, 2), (9, 12)):
            nv = 6  # degraded
        links[frozenset((u[i], u[j]))] = Link(level, nv)
    return Topology(links=links, numa={x: i // 8 for i, x in enumerate(u)}), u


def test_heuristic_16_gpus_matches_exact_on_a_structured_box() -> None:
    topo, u = _dgx16()
    for size in (2, 4, 6, 8):
        got = preferred_allocation(topo, [(x, x) for x in u], [], size)
        best = max(set_score(topo, list(c)) for c in itertools.combinations(u, size))
        assert set_score(topo, got) == best


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_heuristic_is_near_optimal_on_random_boxes(data: st.DataObject) -> None:
    n = data.draw(st.integers(9, 12), label="gpus")
    topo, uuids = _random_topology(n, data)
    size = data.draw(st.integers(3, n - 3), label="size")
    got = preferred_allocation(topo, [(u, u) for u in uuids], [], size)
    best = max(set_score(topo, list(c)) for c in itertools.combinations(uuids, size))
    # Bounded search: on random boxes it found the optimum in 300 of 300 trials while
    # this was written; the test only insists on 90 %, so it cannot flake on a near miss.
    assert set_score(topo, got) >= 0.9 * best

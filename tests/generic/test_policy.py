"""Preferred allocation: property tests (hypothesis) for NUMA, spread and pack."""

from __future__ import annotations

from collections import Counter

from hypothesis import assume, given, settings, strategies as st

from kubedevice.generic.ids import split_replica
from kubedevice.generic.policy import preferred_allocation

# A physical device: (replica count, NUMA node or None)
_PHYS = st.lists(
    st.tuples(st.integers(1, 4), st.one_of(st.none(), st.integers(0, 2))), min_size=1, max_size=8
)


def _world(phys: list[tuple[int, int | None]]) -> tuple[list[str], dict[str, int | None]]:
    ids: list[str] = []
    numa: dict[str, int | None] = {}
    for i, (count, node) in enumerate(phys):
        numa[f"d{i}"] = node
        ids.extend(f"d{i}::{r}" for r in range(count))
    return ids, numa


def _describe(numa: dict[str, int | None]):  # type: ignore[no-untyped-def]
    def describe(dev_id: str) -> tuple[str, int | None]:
        phys, _ = split_replica(dev_id)
        return phys, numa[phys]

    return describe


@settings(max_examples=300, deadline=None)
@given(_PHYS, st.data(), st.sampled_from(["spread", "pack"]))
def test_invariants(
    phys: list[tuple[int, int | None]], data: st.DataObject, placement: str
) -> None:
    ids, numa = _world(phys)
    available = data.draw(st.lists(st.sampled_from(ids), unique=True, min_size=1))
    must = data.draw(st.lists(st.sampled_from(available), unique=True, max_size=3))
    size = data.draw(st.integers(len(must), len(available) + 1))
    out = preferred_allocation(available, must, size, _describe(numa), placement)  # type: ignore[arg-type]
    assert len(out) == len(set(out))
    assert set(must) <= set(out)
    assert set(out) <= set(available)
    assert len(out) == min(size, len(available))
    # the answer does not depend on the order the kubelet lists devices in
    again = preferred_allocation(list(reversed(available)), must, size, _describe(numa), placement)  # type: ignore[arg-type]
    assert set(again) == set(out)


@settings(max_examples=300, deadline=None)
@given(_PHYS, st.data(), st.sampled_from(["spread", "pack"]))
def test_one_numa_node_when_it_fits(
    phys: list[tuple[int, int | None]], data: st.DataObject, placement: str
) -> None:
    ids, numa = _world(phys)
    per_node = Counter(
        numa[split_replica(i)[0]] for i in ids if numa[split_replica(i)[0]] is not None
    )
    assume(per_node)
    size = data.draw(st.integers(1, max(per_node.values())))
    out = preferred_allocation(ids, [], size, _describe(numa), placement)  # type: ignore[arg-type]
    nodes = {numa[split_replica(i)[0]] for i in out}
    assert len(nodes) == 1
    assert None not in nodes


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, 5), min_size=1, max_size=8), st.data())
def test_spread_balances_replicas(counts: list[int], data: st.DataObject) -> None:
    ids, numa = _world([(c, None) for c in counts])
    size = data.draw(st.integers(1, len(ids)))
    out = preferred_allocation(ids, [], size, _describe(numa), "spread")
    used = Counter(split_replica(i)[0] for i in out)
    free = {f"d{i}": c - used.get(f"d{i}", 0) for i, c in enumerate(counts)}
    for p in free:
        for q in free:
            # p holds more than one replica above q only when q has none left to give
            if used.get(p, 0) > used.get(q, 0) + 1:
                assert free[q] == 0


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, 5), min_size=1, max_size=8), st.data())
def test_pack_touches_fewest_devices(counts: list[int], data: st.DataObject) -> None:
    ids, numa = _world([(c, None) for c in counts])
    size = data.draw(st.integers(1, len(ids)))
    out = preferred_allocation(ids, [], size, _describe(numa), "pack")
    touched = len({split_replica(i)[0] for i in out})
    fewest, total = 0, 0
    for c in sorted(counts, reverse=True):
        fewest, total = fewest + 1, total + c
        if total >= size:
            break
    assert touched == fewest


def test_must_include_pulls_its_numa_node() -> None:
    numa = {"a": 0, "b": 1, "c": 1, "d": 0}
    out = preferred_allocation(["a", "b", "c", "d"], ["b"], 2, lambda i: (i, numa[i]), "spread")
    assert out == ["b", "c"]


def test_spread_prefers_unused_devices_and_pack_fills_one() -> None:
    ids = [f"{d}::{r}" for d in ("g0", "g1") for r in range(2)]

    def describe(i: str) -> tuple[str, int | None]:
        return split_replica(i)[0], None

    assert preferred_allocation(ids, [], 2, describe, "spread") == ["g0::0", "g1::0"]
    assert preferred_allocation(ids, [], 2, describe, "pack") == ["g0::0", "g0::1"]
    assert preferred_allocation(ids, ["g1::1"], 2, describe, "pack") == ["g1::1", "g1::0"]

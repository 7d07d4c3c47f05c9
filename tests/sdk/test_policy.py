"""GetPreferredAllocation invariants, property-based: default policy and misbehaving hooks."""

from __future__ import annotations

from hypothesis import given, strategies as st

import kubedevice
from kubedevice.plugin.policy import enforce_preferred_invariants

ids = st.text(alphabet="abcdef", min_size=1, max_size=3)


@st.composite
def requests(draw: st.DrawFn) -> tuple[list[kubedevice.Device], list[kubedevice.Device], int]:
    names = draw(st.lists(ids, unique=True, max_size=12))
    devices = [
        kubedevice.Device(id=n, numa_nodes=tuple(draw(st.sets(st.integers(0, 3), max_size=2))))
        for n in names
    ]
    must = draw(st.lists(st.sampled_from(devices), unique_by=lambda d: d.id)) if devices else []
    size = draw(st.integers(-1, 15))
    return devices, must, size


def check(answer: list[str], offered: list[str], must: list[str], size: int) -> None:
    assert set(must) <= set(answer)
    assert set(answer) <= set(offered) | set(must)
    assert len(answer) == len(set(answer))
    assert len(answer) == min(max(size, len(set(must))), len(set(offered) | set(must)))


@given(requests())
def test_default_policy_invariants(
    req: tuple[list[kubedevice.Device], list[kubedevice.Device], int],
) -> None:
    available, must, size = req
    answer = kubedevice.default_preferred_allocation(available, must, size)
    check(answer, [d.id for d in available], [d.id for d in must], size)
    assert answer[: len(must)] == [d.id for d in must]


@given(requests(), st.lists(ids, max_size=20))
def test_any_hook_answer_is_repaired(
    req: tuple[list[kubedevice.Device], list[kubedevice.Device], int], hook_answer: list[str]
) -> None:
    available, must, size = req
    offered = [d.id for d in available]
    must_ids = [d.id for d in must]
    answer = enforce_preferred_invariants(hook_answer, offered, must_ids, size)
    check(answer, offered, must_ids, size)


def test_default_prefers_numa_neighbours() -> None:
    devs = [
        kubedevice.Device(id="a", numa_nodes=(0,)),
        kubedevice.Device(id="b", numa_nodes=(1,)),
        kubedevice.Device(id="c", numa_nodes=(1,)),
        kubedevice.Device(id="d"),
    ]
    assert kubedevice.default_preferred_allocation(devs, [devs[2]], 2) == ["c", "b"]
    assert kubedevice.default_preferred_allocation(devs, [], 3) == ["a", "b", "c"]


def test_valid_hook_answer_is_kept() -> None:
    assert enforce_preferred_invariants(["c", "a"], ["a", "b", "c"], ["c"], 2) == ["c", "a"]

"""Pod admission: device choice, init reuse, sidecars, NUMA, RPC arguments, rejections."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from kubelet_helpers import PluginFactory, pod_manifest
from rawplugin import Dev, devs

from kubedevice._api import dp
from kubedevice.errors import AdmissionError, EmulatorError, ManifestError
from kubedevice.kubelet import AdmissionEvent, Emulator

R = "example.com/foo"
G = "example.com/gpu"


@pytest.fixture
async def emu(dp_dir: Path) -> AsyncIterator[Emulator]:
    """The NUMA cases here run under the best-effort topology manager policy."""
    async with Emulator(
        dp_dir, control_socket=False, dial_timeout_s=2.0, topology_manager_policy="best-effort"
    ) as e:
        yield e


async def test_one_device(emu: Emulator, plugin: PluginFactory) -> None:
    p = await plugin(R, devs(2))
    await emu.wait_for_resource(R, allocatable=2)
    pod = await emu.apply_pod(pod_manifest("p1", {R: 1}))
    c = pod.container("c")
    assert c.devices == {R: ("d0",)}
    assert c.runtime.envs == {"DEVICES": "d0"}
    assert p.calls.allocate == [[["d0"]]]
    assert emu.node().resources[R].allocated == 1
    assert emu.events.of_type(AdmissionEvent)[-1].reason is None


async def test_multi_device_and_delete_frees(emu: Emulator, plugin: PluginFactory) -> None:
    p = await plugin(R, devs(4))
    await emu.wait_for_resource(R, allocatable=4)
    a = await emu.apply_pod(pod_manifest("a", {R: 3}))
    assert a.container("c").devices[R] == ("d0", "d1", "d2")
    with pytest.raises(AdmissionError) as err:
        await emu.apply_pod(pod_manifest("b", {R: 2}))
    assert err.value.reason == "UnexpectedAdmissionError"
    assert err.value.message == (
        "Allocate failed due to requested number of devices unavailable for example.com/foo. "
        "Requested: 2, Available: 1, which is unexpected"
    )
    await emu.delete_pod("a")
    b = await emu.apply_pod(pod_manifest("b", {R: 2}))
    assert b.container("c").devices[R] == ("d0", "d1")
    assert len(p.calls.allocate) == 2
    with pytest.raises(EmulatorError):
        await emu.delete_pod("a")


async def test_duplicate_pod_refused(emu: Emulator, plugin: PluginFactory) -> None:
    await plugin(R, devs(2))
    await emu.wait_for_resource(R, allocatable=2)
    await emu.apply_pod(pod_manifest("a", {R: 1}))
    with pytest.raises(ManifestError, match='pods "a" already exists'):
        await emu.apply_pod(pod_manifest("a", {R: 1}))


async def test_init_devices_reused_and_sidecars_exclusive(
    emu: Emulator, plugin: PluginFactory
) -> None:
    p = await plugin(R, devs(4))
    await emu.wait_for_resource(R, allocatable=4)
    pod = await emu.apply_pod(
        pod_manifest(
            "p",
            init=[("init1", {R: 2})],
            sidecars=[("side", {R: 1})],
            containers=[("app1", {R: 1}), ("app2", {R: 2})],
        )
    )
    d = {c.name: (c.kind, c.devices[R]) for c in pod.containers}
    assert d["init1"] == ("init", ("d0", "d1"))
    assert d["side"] == ("sidecar", ("d0",))  # takes from the init pool, keeps it exclusively
    assert d["app1"] == ("app", ("d1",))  # the rest of the pool
    assert d["app2"] == ("app", ("d2", "d3"))
    assert p.calls.allocate == [[["d0", "d1"]], [["d0"]], [["d1"]], [["d2", "d3"]]]
    assert emu.node().resources[R].allocated == 4


def _numa(i: int) -> tuple[int, ...]:
    return (i % 2,)


async def test_numa_alignment_across_resources(emu: Emulator, plugin: PluginFactory) -> None:
    # foo: d0..d3 on NUMA 0,1,0,1; gpu: g0 (node 1) only healthy one on node 1... pick node 1
    await plugin(R, devs(4, numa=_numa))
    await plugin(G, [Dev("g0", numa=(1,)), Dev("g1", numa=(0,), health="Unhealthy")])
    await emu.wait_for_resource(R, allocatable=4)
    await emu.wait_for_resource(G, allocatable=1)
    assert emu.node().numa_nodes == (0, 1)
    pod = await emu.apply_pod(pod_manifest("p", {R: 2, G: 1}))
    c = pod.container("c")
    assert c.devices == {R: ("d1", "d3"), G: ("g0",)}


async def test_preferred_allocation_arguments(emu: Emulator, plugin: PluginFactory) -> None:
    p = await plugin(R, devs(4), preferred_available=True)
    p.preferred_fn = lambda avail, must, size: ["d3", "zz", "d2"]
    await emu.wait_for_resource(R, allocatable=4)
    pod = await emu.apply_pod(pod_manifest("p", {R: 2}))
    assert p.calls.preferred == [(["d0", "d1", "d2", "d3"], [], 2)]
    assert pod.container("c").devices[R] == ("d2", "d3")  # answer ∩ available, unknown ignored


async def test_preferred_allocation_with_reuse_and_numa(
    emu: Emulator, plugin: PluginFactory
) -> None:
    p = await plugin(R, devs(6, numa=_numa), preferred_available=True)
    p.preferred_fn = lambda avail, must, size: []  # short answer: kubelet fills itself
    await emu.wait_for_resource(R, allocatable=6)
    await emu.apply_pod(pod_manifest("p", init=[("i", {R: 1})], containers=[("app", {R: 3})]))
    # init: 1 of 6; hint = node 0 (fewest nodes), needed 1 < 3 aligned → GPA over aligned
    assert p.calls.preferred[0] == (["d0", "d2", "d4"], [], 1)
    # app: reuses d0 (must include), needs 2 more; aligned on node 0 = d2,d4 (== needed) →
    # takes them without asking; no GPA call since needed == |aligned|
    assert len(p.calls.preferred) == 1
    assert p.calls.allocate[-1] == [["d0", "d2", "d4"]]


async def test_reused_devices_satisfy_request_no_preferred_call(
    emu: Emulator, plugin: PluginFactory
) -> None:
    p = await plugin(R, devs(3), preferred_available=True)
    await emu.wait_for_resource(R, allocatable=3)
    await emu.apply_pod(pod_manifest("p", init=[("i", {R: 2})], containers=[("a", {R: 2})]))
    assert len(p.calls.preferred) == 1  # only for the init container
    assert p.calls.allocate == [[["d0", "d1"]], [["d0", "d1"]]]


async def test_prestart_called_when_required(emu: Emulator, plugin: PluginFactory) -> None:
    p = await plugin(R, devs(2), pre_start_required=True)
    await emu.wait_for_resource(R, allocatable=2)
    pod = await emu.apply_pod(pod_manifest("p", {R: 2}))
    assert p.calls.pre_start == [["d0", "d1"]]
    assert pod.container("c").started
    p.pre_start_error = "device busy"
    pod2 = await emu.apply_pod(pod_manifest("q", {}))
    assert pod2.container("c").started  # no devices, no PreStart
    await emu.delete_pod("p")
    pod3 = await emu.apply_pod(pod_manifest("r", {R: 1}))
    c = pod3.container("c")
    assert not c.started
    assert c.start_error == (
        "device plugin PreStartContainer rpc failed with err: "
        "rpc error: code = Unknown desc = device busy"
    )


async def test_no_prestart_when_not_required(emu: Emulator, plugin: PluginFactory) -> None:
    p = await plugin(R, devs(2))
    await emu.wait_for_resource(R, allocatable=2)
    await emu.apply_pod(pod_manifest("p", {R: 1}))
    assert p.calls.pre_start == []


async def test_reject_unregistered(emu: Emulator) -> None:
    with pytest.raises(AdmissionError) as err:
        await emu.apply_pod(pod_manifest("p", {R: 1}))
    assert err.value.message == (
        "Allocate failed due to cannot allocate unregistered device example.com/foo, "
        "which is unexpected"
    )
    ev = emu.events.of_type(AdmissionEvent)[-1]
    assert ev.reason == "UnexpectedAdmissionError"
    assert emu.pods() == []


async def test_reject_no_healthy_devices(emu: Emulator, plugin: PluginFactory) -> None:
    await plugin(R, devs(2, health="Unhealthy"))
    await emu.wait_for_resource(R)
    with pytest.raises(AdmissionError) as err:
        await emu.apply_pod(pod_manifest("p", {R: 1}))
    assert err.value.message == (
        "Allocate failed due to no healthy devices present; cannot allocate unhealthy devices "
        "example.com/foo, which is unexpected"
    )


async def test_reject_allocate_failed_and_rollback(emu: Emulator, plugin: PluginFactory) -> None:
    await plugin(R, devs(2))
    g = await plugin(G, devs(2, "g"))
    await emu.wait_for_resource(R, allocatable=2)
    await emu.wait_for_resource(G, allocatable=2)
    g.allocate_error = "boom"
    with pytest.raises(AdmissionError) as err:
        await emu.apply_pod(pod_manifest("p", {R: 1, G: 1}))
    assert err.value.message == (
        "Allocate failed due to rpc error: code = Unknown desc = boom, which is unexpected"
    )
    assert emu.node().resources[R].allocated == 0  # the earlier allocation is released


async def test_reject_empty_allocate_response(emu: Emulator, plugin: PluginFactory) -> None:
    p = await plugin(R, devs(2))
    p.allocate_fn = lambda ids: None
    await emu.wait_for_resource(R, allocatable=2)
    with pytest.raises(AdmissionError, match="no containers return in allocation response"):
        await emu.apply_pod(pod_manifest("p", {R: 1}))


async def test_reject_preferred_allocation_error(emu: Emulator, plugin: PluginFactory) -> None:
    p = await plugin(R, devs(3), preferred_available=True)
    p.preferred_error = "nope"
    await emu.wait_for_resource(R, allocatable=3)
    with pytest.raises(AdmissionError) as err:
        await emu.apply_pod(pod_manifest("p", {R: 1}))
    assert err.value.message == (
        "Allocate failed due to device plugin GetPreferredAllocation rpc failed with err: "
        "rpc error: code = Unknown desc = nope, which is unexpected"
    )
    assert p.calls.allocate == []


async def test_disconnected_plugin_rejects(emu: Emulator, plugin: PluginFactory) -> None:
    p = await plugin(R, devs(2))
    await emu.wait_for_resource(R, allocatable=2)
    p.end_streams()
    await emu.wait_for_resource(R, allocatable=0)
    with pytest.raises(AdmissionError, match="no healthy devices present"):
        await emu.apply_pod(pod_manifest("p", {R: 1}))


async def test_runtime_view_merge_and_conflicts(emu: Emulator, plugin: PluginFactory) -> None:
    a = await plugin(R, devs(1, "a"))
    b = await plugin(G, devs(1, "b"))

    def resp_a(ids: list[str]) -> dp.ContainerAllocateResponse:
        r = dp.ContainerAllocateResponse(envs={"SHARED": "1", "A": "x"}, annotations={"k": "a"})
        r.mounts.add(container_path="/m", host_path="/host/a", read_only=True)
        r.devices.add(container_path="/dev/x", host_path="/dev/a0", permissions="rw")
        r.cdi_devices.add(name="vendor.com/c=one")
        return r

    def resp_b(ids: list[str]) -> dp.ContainerAllocateResponse:
        r = dp.ContainerAllocateResponse(envs={"SHARED": "2", "B": "y"}, annotations={"k": "b"})
        r.mounts.add(container_path="/m", host_path="/host/b")
        r.devices.add(container_path="/dev/x", host_path="/dev/b0", permissions="r")
        r.cdi_devices.add(name="vendor.com/c=one")
        r.cdi_devices.add(name="vendor.com/c=two")
        return r

    a.allocate_fn, b.allocate_fn = resp_a, resp_b
    await emu.wait_for_resource(R, allocatable=1)
    await emu.wait_for_resource(G, allocatable=1)
    rt = (await emu.apply_pod(pod_manifest("p", {R: 1, G: 1}))).container("c").runtime
    # resources are merged in sorted order: example.com/foo before example.com/gpu
    assert rt.envs == {"A": "x", "SHARED": "1", "B": "y"}
    assert [(m.container_path, m.host_path, m.read_only) for m in rt.mounts] == [
        ("/m", "/host/a", True)
    ]
    assert [d.host_path for d in rt.devices] == ["/dev/a0"]
    assert rt.annotations == {"k": "a"}
    assert rt.cdi_devices == ("vendor.com/c=one", "vendor.com/c=two")
    at = f'resource="{G}"'
    assert rt.conflicts == (
        f'"Environment variable has conflicting setting" envKey="SHARED" expected="2" got="1" {at}',
        '"Container device has conflicting mapping host devices" '
        f'containerPath="/dev/x" got="/dev/a0" expected="/dev/b0" {at}',
        '"Container mount has conflicting mapping host mounts" '
        f'containerPath="/m" got="/host/a" expected="/host/b" {at}',
        f'"Annotation has conflicting setting" annotationKey="k" expected="a" got="b" {at}',
    )


async def test_numa_hint_spanning_two_nodes(emu: Emulator, plugin: PluginFactory) -> None:
    p = await plugin(R, devs(8, numa=lambda i: (i // 2,)), preferred_available=True)
    p.preferred_fn = lambda avail, must, size: avail[-size:]
    await emu.wait_for_resource(R, allocatable=8)
    assert emu.node().numa_nodes == (0, 1, 2, 3)
    pod = await emu.apply_pod(pod_manifest("p", {R: 3}))
    # one node holds 2 devices: the preferred hints have 2 nodes; {0, 1} wins (lowest ids)
    assert p.calls.preferred == [(["d0", "d1", "d2", "d3"], [], 3)]
    assert pod.container("c").devices[R] == ("d1", "d2", "d3")
    # free: d0 (node 0), d4..d7 (nodes 2, 3); 2-node masks with 3 free devices: {0,2},
    # {0,3}, {2,3}; the lowest, {0,2}, has exactly 3 aligned devices: taken without asking
    pod2 = await emu.apply_pod(pod_manifest("q", {R: 3}))
    assert len(p.calls.preferred) == 1
    assert pod2.container("c").devices[R] == ("d0", "d4", "d5")


async def test_preferred_allocation_must_include_reused_devices(
    emu: Emulator, plugin: PluginFactory
) -> None:
    # contract.md#allocation: available = all available ∪ chosen, must_include = chosen,
    # size = TOTAL request
    p = await plugin(R, devs(6), preferred_available=True)
    p.preferred_fn = lambda avail, must, size: ["d5", "d0", "d4"]
    await emu.wait_for_resource(R, allocatable=6)
    pod = await emu.apply_pod(pod_manifest("p", init=[("i", {R: 1})], containers=[("app", {R: 3})]))
    assert p.calls.preferred[1] == (["d0", "d1", "d2", "d3", "d4", "d5"], ["d0"], 3)
    assert pod.container("app").devices[R] == ("d0", "d4", "d5")
    assert p.calls.allocate[-1] == [["d0", "d4", "d5"]]


async def test_preferred_allocation_aligned_with_reuse(
    emu: Emulator, plugin: PluginFactory
) -> None:
    # needed < |aligned|: available = aligned ∪ chosen, must_include = chosen, size = total
    p = await plugin(R, devs(8, numa=_numa), preferred_available=True)
    p.preferred_fn = lambda avail, must, size: ["d1", "d6"] if must else []  # d1: wrong node
    await emu.wait_for_resource(R, allocatable=8)
    pod = await emu.apply_pod(pod_manifest("p", init=[("i", {R: 1})], containers=[("app", {R: 3})]))
    assert p.calls.preferred[0] == (["d0", "d2", "d4", "d6"], [], 1)
    assert p.calls.preferred[1] == (["d0", "d2", "d4", "d6"], ["d0"], 3)
    # answer ∩ aligned (d6), then filled from aligned (d2); d1 (node 1) ignored
    assert pod.container("app").devices[R] == ("d0", "d6", "d2")


async def test_preferred_answer_intersected_with_available(
    emu: Emulator, plugin: PluginFactory
) -> None:
    p = await plugin(R, devs(4), preferred_available=True)
    await emu.wait_for_resource(R, allocatable=4)
    await emu.apply_pod(pod_manifest("a", {R: 1}))  # holds d0
    p.preferred_fn = lambda avail, must, size: ["d0", "zz", "d3"]
    pod = await emu.apply_pod(pod_manifest("b", {R: 2}))
    assert p.calls.preferred[-1] == (["d1", "d2", "d3"], [], 2)
    # d0 (in use) and zz (unknown) are dropped; the shortfall is filled by the kubelet
    assert set(pod.container("c").devices[R]) == {"d1", "d3"}


async def test_manifest_uid_never_shared_between_pods(emu: Emulator, plugin: PluginFactory) -> None:
    await plugin(R, devs(2))
    await emu.wait_for_resource(R, allocatable=2)
    a, b = pod_manifest("a", {R: 1}), pod_manifest("b", {R: 1})
    a["metadata"]["uid"] = b["metadata"]["uid"] = "copied-from-kubectl-get"
    await emu.apply_pod(a)
    await emu.apply_pod(b)
    assert {p.name: p.container("c").devices[R] for p in emu.pods()} == {
        "a": ("d0",),
        "b": ("d1",),
    }
    await emu.delete_pod("a")
    assert emu.pod("b").container("c").devices[R] == ("d1",)
    assert emu.node().resources[R].allocated == 1


async def test_huge_request_rejected_quickly(emu: Emulator, plugin: PluginFactory) -> None:
    await plugin(R, devs(2, numa=_numa))
    await emu.wait_for_resource(R, allocatable=2)
    with pytest.raises(AdmissionError) as err:
        await emu.apply_pod(pod_manifest("p", {R: "1e999999999"}))
    assert err.value.message == (
        "Allocate failed due to requested number of devices unavailable for example.com/foo. "
        "Requested: 9223372036854775807, Available: 2, which is unexpected"
    )


async def test_concurrent_applies_never_share_devices(emu: Emulator, plugin: PluginFactory) -> None:
    p = await plugin(R, devs(6), preferred_available=True)
    p.preferred_fn = lambda avail, must, size: avail[:size]
    await emu.wait_for_resource(R, allocatable=6)
    results = await asyncio.gather(
        *(emu.apply_pod(pod_manifest(f"p{i}", {R: 2})) for i in range(4)),
        return_exceptions=True,
    )
    admitted = [r for r in results if not isinstance(r, BaseException)]
    rejected = [r for r in results if isinstance(r, AdmissionError)]
    assert (len(admitted), len(rejected)) == (3, 1)
    held = [d for r in admitted for d in r.container("c").devices[R]]
    assert sorted(held) == [f"d{i}" for i in range(6)]


async def test_rpc_deadlines_like_the_kubelet(emu: Emulator, plugin: PluginFactory) -> None:
    # PreStartContainer: 30 s; GetPreferredAllocation and Allocate: none (contract.md#timeouts)
    p = await plugin(R, devs(2), pre_start_required=True, preferred_available=True)
    await emu.wait_for_resource(R, allocatable=2)
    await emu.apply_pod(pod_manifest("p", {R: 1}))
    got = dict(p.calls.deadlines)
    assert set(got) == {"GetPreferredAllocation", "Allocate", "PreStartContainer"}
    assert got["GetPreferredAllocation"] is None
    assert got["Allocate"] is None
    assert got["PreStartContainer"] is not None
    assert 25 < got["PreStartContainer"] < 31  # grpc rounds deadlines up a little
    assert Emulator(emu.device_plugin_dir).dial_timeout_s == 10.0


async def test_numa_tie_broken_by_bitmask_value(emu: Emulator, plugin: PluginFactory) -> None:
    # 3 devices per node, healthy: node0 1, node1 2, node2 2, node3 3; request 4 → 2-node
    # masks are preferred; those with 4 free devices: {1,2}, {0,3}, {1,3}, {2,3}. The
    # topology manager keeps the numerically smaller bitmask (IsNarrowerThan/IsLessThan:
    # 0b0110 < 0b1001), i.e. {1,2}, not the lexicographically smaller {0,3}.
    healthy = [1, 2, 2, 3]
    await plugin(
        R,
        [
            Dev(f"n{k}{x}", "Healthy" if i < healthy[k] else "Unhealthy", (k,))
            for k in range(4)
            for i, x in enumerate("abc")
        ],
    )
    await emu.wait_for_resource(R, allocatable=8)
    pod = await emu.apply_pod(pod_manifest("p", {R: 4}))
    assert sorted(pod.container("c").devices[R]) == ["n1a", "n1b", "n2a", "n2b"]


async def test_invalid_numa_ids_never_crash(emu: Emulator, plugin: PluginFactory) -> None:
    # a plugin reporting NUMA ids no machine has (negative, >= 64): never aligned, no crash
    await plugin(R, [Dev("bad", numa=(-1,)), Dev("huge", numa=(99,)), Dev("ok", numa=(0,))])
    await emu.wait_for_resource(R, allocatable=3)
    pod = await emu.apply_pod(pod_manifest("p", {R: 2}))
    assert sorted(pod.container("c").devices[R]) == ["bad", "ok"]


async def test_numa_merge_preferred_only_when_affinities_equal(
    emu: Emulator, plugin: PluginFactory
) -> None:
    # foo (2 of 4, 2 per node) prefers {0} or {1}; gpu (2 of 2, one per node) prefers {0,1}.
    # The kubelet's mergePermutation marks a merge preferred only if all affinities are
    # EQUAL, so {0} (= {0} AND {0,1}) is not preferred; with no preferred merge the
    # HintMerger keeps the non-preferred mask whose width reaches the widest narrowest
    # hint (2): {0,1}. foo then takes its two smallest IDs, not node 0's.
    await plugin(R, [Dev("a0", numa=(1,)), Dev("a1", numa=(1,)), Dev("a2", numa=(0,)),
                     Dev("a3", numa=(0,))])  # fmt: skip
    await plugin(G, [Dev("b0", numa=(0,)), Dev("b1", numa=(1,))])
    await emu.wait_for_resource(R, allocatable=4)
    await emu.wait_for_resource(G, allocatable=2)
    pod = await emu.apply_pod(pod_manifest("p", {R: 2, G: 2}))
    assert pod.container("c").devices == {R: ("a0", "a1"), G: ("b0", "b1")}

"""PodResources v1 over its real socket."""

from __future__ import annotations

import os
import stat

import grpc
import pytest
from kubelet_helpers import PluginFactory, pod_manifest
from rawplugin import Dev, devs

from kubedevice._api import pr, pr_grpc
from kubedevice.kubelet import Emulator

R = "example.com/foo"


def _elements(devices: list[pr.ContainerDevices]) -> list[tuple[str, list[str], list[int] | None]]:
    return [
        (
            d.resource_name,
            list(d.device_ids),
            [n.ID for n in d.topology.nodes] if d.HasField("topology") else None,
        )
        for d in devices
    ]


async def test_list_get_allocatable(emu: Emulator, plugin: PluginFactory) -> None:
    await plugin(
        R,
        [Dev("a", numa=(0,)), Dev("b", numa=(0, 1)), Dev("c"), Dev("z", "Unhealthy", (1,))],
    )
    await emu.wait_for_resource(R, allocatable=3)
    await emu.apply_pod(
        pod_manifest(
            "p", init=[("i", {R: 1})], sidecars=[("s", {R: 1})], containers=[("app", {R: 2})]
        )
    )
    sock = emu.pod_resources_socket
    assert sock == emu.device_plugin_dir.parent / "pod-resources" / "kubelet.sock"
    assert stat.S_IMODE(os.stat(sock).st_mode) == 0o600
    async with grpc.aio.insecure_channel(f"unix://{sock}") as ch:
        stub = pr_grpc.PodResourcesListerStub(ch)
        alloc = await stub.GetAllocatableResources(pr.AllocatableResourcesRequest())
        assert _elements(list(alloc.devices)) == [
            (R, ["a"], [0]),
            (R, ["b"], [0]),
            (R, ["b"], [1]),
            (R, ["c"], None),
        ]
        listed = await stub.List(pr.ListPodResourcesRequest())
        [pod] = listed.pod_resources
        assert (pod.name, pod.namespace) == ("p", "default")
        assert [c.name for c in pod.containers] == ["s", "app"]  # regular init omitted
        by_name = {c.name: _elements(list(c.devices)) for c in pod.containers}
        # numa hint {0}: init takes a; sidecar reuses a; app takes b (multi-NUMA) and c
        assert by_name["s"] == [(R, ["a"], [0])]
        assert by_name["app"] == [(R, ["c"], None), (R, ["b"], [0]), (R, ["b"], [1])]
        got = await stub.Get(pr.GetPodResourcesRequest(pod_name="p", pod_namespace="default"))
        assert got.pod_resources == pod
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Get(pr.GetPodResourcesRequest(pod_name="x", pod_namespace="ns"))
        assert err.value.details() == "pod x in namespace ns not found"


async def test_custom_socket(dp_dir, plugin: PluginFactory) -> None:  # type: ignore[no-untyped-def]
    sock = dp_dir.parent / "pr.sock"
    async with Emulator(dp_dir, control_socket=False, pod_resources_socket=sock) as emu:
        await plugin(R, devs(1))
        await emu.wait_for_resource(R, allocatable=1)
        async with grpc.aio.insecure_channel(f"unix://{sock}") as ch:
            resp = await pr_grpc.PodResourcesListerStub(ch).List(pr.ListPodResourcesRequest())
        assert list(resp.pod_resources) == []


async def test_rate_limit(dp_dir) -> None:  # type: ignore[no-untyped-def]
    async with Emulator(
        dp_dir, control_socket=False, pod_resources_qps=0.001, pod_resources_burst=2
    ) as emu:
        async with grpc.aio.insecure_channel(f"unix://{emu.pod_resources_socket}") as ch:
            stub = pr_grpc.PodResourcesListerStub(ch)
            await stub.List(pr.ListPodResourcesRequest())
            await stub.GetAllocatableResources(pr.AllocatableResourcesRequest())
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.List(pr.ListPodResourcesRequest())
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert err.value.details() == "rejected by rate limit"

"""ResourceSlices on a real API server: chunks, generations, ownership, stale ones, cleanup."""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
from e2e.cluster import find_binaries

import kubedevice.dra as dra
from dra import clients
from dra.api import RESOURCE, Api
from dra.conftest import REPO, api_server
from dra.fakes import DRIVER, FakeDriver, gpus, server

pytestmark = pytest.mark.timeout(90)


def _foreign_slice(name: str, driver: str, node: str) -> dict:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 7, "resourceSliceCount": 1},
            "devices": [{"name": "old-0"}],
        },
    }


async def test_devices_published_in_chunks_of_128_with_types_and_owner(
    kdir: Path, kubeconfig: Path, node_name: str, api: Api
) -> None:
    node = api.call("GET", f"/api/v1/nodes/{node_name}")
    driver = FakeDriver(gpus(300))
    async with server(driver, kdir, kubeconfig, node_name) as srv:
        await asyncio.wait_for(srv.wait_published(), 30)
        slices = api.slices(DRIVER, node_name)
        assert [len(s["spec"]["devices"]) for s in slices] == [128, 128, 44]
        for s in slices:
            spec = s["spec"]
            assert spec["driver"] == DRIVER
            assert spec["nodeName"] == node_name
            assert spec["pool"] == {"name": node_name, "generation": 1, "resourceSliceCount": 3}
            assert s["metadata"]["ownerReferences"] == [
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "name": node_name,
                    "uid": node["metadata"]["uid"],
                    "controller": True,
                }
            ]
        first = slices[0]["spec"]["devices"][0]
        assert first == {
            "name": "gpu-0",
            "attributes": {
                "index": {"int": 0},
                "model": {"string": "Fake H100"},
                "mig": {"bool": False},
                "driverVersion": {"version": "550.54.15"},
                "resource.kubernetes.io/pcieRoot": {"string": "pci0000:00"},
            },
            "capacity": {"memory": {"value": "80Gi"}},
        }
        names = {d["name"] for s in slices for d in s["spec"]["devices"]}
        assert names == {f"gpu-{i}" for i in range(300)}

        # a change: fewer devices, one unhealthy -> one generation up, the stale slice gone
        driver.snapshots.put_nowait(gpus(130, unhealthy=[5]))
        await asyncio.sleep(0)  # let the device list reach the publisher
        await asyncio.wait_for(srv.wait_published(), 30)
        slices = api.slices(DRIVER, node_name)
        # a slice with a tainted device holds at most 64 (the API server's limit)
        assert [len(s["spec"]["devices"]) for s in slices] == [64, 66]
        assert {s["spec"]["pool"]["generation"] for s in slices} == {2}
        assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {2}
        tainted = {d["name"] for s in slices for d in s["spec"]["devices"] if d.get("taints")}
        assert tainted == {"gpu-5"}
        assert len({d["name"] for s in slices for d in s["spec"]["devices"]}) == 130


async def test_start_adopts_by_fields_and_updates_but_not_others(
    kdir: Path, kubeconfig: Path, node_name: str, api: Api
) -> None:
    stale = f"{node_name}-stale"
    foreign = f"{node_name}-foreign"
    api.call("POST", f"{RESOURCE}/resourceslices", _foreign_slice(stale, DRIVER, node_name))
    api.call("POST", f"{RESOURCE}/resourceslices", _foreign_slice(foreign, "other.io", node_name))
    async with server(FakeDriver(gpus(2)), kdir, kubeconfig, node_name) as srv:
        await asyncio.wait_for(srv.wait_published(), 30)
        slices = api.slices(DRIVER, node_name)
        # the driver's slice on the node is adopted by its fields (whatever its name)
        assert [s["metadata"]["name"] for s in slices] == [stale]
        assert slices[0]["spec"]["pool"]["generation"] == 8  # above the adopted pool's 7
        assert len(api.slices("other.io", node_name)) == 1
    # a restart with the same devices adopts them without writing
    async with server(FakeDriver(gpus(2)), kdir, kubeconfig, node_name) as srv:
        await asyncio.wait_for(srv.wait_published(), 30)
        assert srv.publisher is not None
        assert srv.publisher.writes == 0
        assert api.slices(DRIVER, node_name)[0]["spec"]["pool"]["generation"] == 8


async def test_reregistration_republishes_deleted_slices(
    kdir: Path, kubeconfig: Path, node_name: str, api: Api
) -> None:
    async with server(FakeDriver(gpus(2)), kdir, kubeconfig, node_name) as srv:
        reg_sock = kdir / "plugins_registry" / f"{DRIVER}-reg.sock"
        await clients.register(reg_sock)
        await asyncio.wait_for(srv.wait_published(), 30)
        for s in api.slices(DRIVER, node_name):  # what the kubelet does after unregistration
            api.call("DELETE", f"{RESOURCE}/resourceslices/{s['metadata']['name']}")
        await clients.register(reg_sock)  # the kubelet restarted and registered us again
        await asyncio.wait_for(srv.wait_published(), 30)
        slices = api.slices(DRIVER, node_name)
        assert [len(s["spec"]["devices"]) for s in slices] == [2]


async def test_cleanup_removes_slices_and_cdi_specs(
    kdir: Path, kubeconfig: Path, node_name: str, api: Api
) -> None:
    options = dra.DriverOptions(
        node_name=node_name, kubelet_dir=kdir, cdi_dir=kdir / "cdi", kubeconfig=kubeconfig
    )
    async with server(FakeDriver(gpus(200)), kdir, kubeconfig, node_name) as srv:
        await asyncio.wait_for(srv.wait_published(), 30)
    (kdir / "cdi").mkdir()
    (kdir / "cdi" / f"k8s.{DRIVER}-claim_abc.json").write_text("{}")
    (kdir / "cdi" / "someone-else.json").write_text("{}")
    removed = await dra.cleanup(FakeDriver([]), options)
    assert removed == 3
    assert api.slices(DRIVER, node_name) == []
    assert sorted(p.name for p in (kdir / "cdi").iterdir()) == ["someone-else.json"]


async def test_api_errors_are_retried_not_fatal(
    kdir: Path, kubeconfig: Path, api: Api, caplog: pytest.LogCaptureFixture
) -> None:
    # the Node does not exist yet: the owner reference cannot be made; retried, logged
    node_name = f"node-late-{uuid.uuid4().hex[:8]}"  # a valid DNS name whatever the temp dir
    failed = asyncio.Event()

    class _Seen(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "publishing ResourceSlices failed" in record.getMessage():
                failed.set()

    seen = _Seen()
    logging.getLogger("kubedevice.dra.api.slices").addHandler(seen)
    try:
        async with server(FakeDriver(gpus(1)), kdir, kubeconfig, node_name) as srv:
            assert srv.publisher is not None
            srv.publisher.backoff.maximum = 0.5
            await asyncio.wait_for(failed.wait(), 30)
            info = await clients.get_info(kdir / "plugins_registry" / f"{DRIVER}-reg.sock")
            assert info.name == DRIVER  # serving meanwhile
            api.call("POST", "/api/v1/nodes", {"metadata": {"name": node_name}})
            try:
                await asyncio.wait_for(srv.wait_published(), 30)
                assert len(api.slices(DRIVER, node_name)) == 1
            finally:
                api.call("DELETE", f"/api/v1/nodes/{node_name}")
    finally:
        logging.getLogger("kubedevice.dra.api.slices").removeHandler(seen)
    assert "404" in caplog.text


async def test_a_conflict_lists_again_and_wins(
    kdir: Path, kubeconfig: Path, node_name: str, api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kubedevice.dra.api.kube import KubeClient

    replace = KubeClient.replace_slice
    meddled: list[str] = []

    async def meddling_replace(self: KubeClient, body: dict) -> dict:
        if not meddled:  # someone else writes the slice between our list and our write
            name = body["metadata"]["name"]
            current = api.call("GET", f"{RESOURCE}/resourceslices/{name}")
            current["metadata"].setdefault("labels", {})["meddled"] = "yes"
            api.call("PUT", f"{RESOURCE}/resourceslices/{name}", current)
            meddled.append(name)
        return await replace(self, body)

    driver = FakeDriver(gpus(2))
    async with server(driver, kdir, kubeconfig, node_name) as srv:
        await asyncio.wait_for(srv.wait_published(), 30)
        monkeypatch.setattr(KubeClient, "replace_slice", meddling_replace)
        driver.snapshots.put_nowait(gpus(3))
        await asyncio.sleep(0)  # let the device list reach the publisher
        await asyncio.wait_for(srv.wait_published(), 30)
    assert meddled
    slices = api.slices(DRIVER, node_name)
    assert [len(s["spec"]["devices"]) for s in slices] == [3]


async def test_slices_deleted_behind_the_drivers_back_come_back(
    kdir: Path, kubeconfig: Path, node_name: str, api: Api, caplog: pytest.LogCaptureFixture
) -> None:
    """A restarting kubelet wipes its node's slices (no delay, retried until it can read its
    Node), possibly after the driver registered again: the periodic check republishes them,
    with no registration or device change to prompt it."""
    caplog.set_level(logging.INFO, logger="kubedevice.dra.api.slices")
    republished = asyncio.Event()

    class _Seen(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "generation 2" in record.getMessage():  # written again, nothing else changed
                republished.set()

    seen = _Seen()
    logging.getLogger("kubedevice.dra.api.slices").addHandler(seen)
    try:
        async with server(FakeDriver(gpus(2)), kdir, kubeconfig, node_name) as srv:
            assert srv.publisher is not None
            srv.publisher.resync_s = 0.2
            await asyncio.wait_for(srv.wait_published(), 30)
            for s in api.slices(DRIVER, node_name):
                api.call("DELETE", f"{RESOURCE}/resourceslices/{s['metadata']['name']}")
            assert api.slices(DRIVER, node_name) == []
            await asyncio.wait_for(republished.wait(), 30)
            assert [len(s["spec"]["devices"]) for s in api.slices(DRIVER, node_name)] == [2]
    finally:
        logging.getLogger("kubedevice.dra.api.slices").removeHandler(seen)


async def test_slices_deleted_behind_the_drivers_back_come_back_on_the_watch_not_a_poll(
    kdir: Path, kubeconfig: Path, node_name: str, api: Api
) -> None:
    """The publisher watches its slices: a deletion is reconciled when it happens, with no
    periodic check to wait for (here: one an hour), and idles with no poll meanwhile."""
    async with server(FakeDriver(gpus(2)), kdir, kubeconfig, node_name) as srv:
        publisher = srv.publisher
        assert publisher is not None
        publisher.resync_s = 3600.0
        await asyncio.wait_for(srv.wait_published(), 30)
        lists = 0
        listing = publisher.kube.list_slices_at

        async def counted(driver: str, node: str) -> tuple[list[dict], str]:
            nonlocal lists
            lists += 1
            return await listing(driver, node)

        publisher.kube.list_slices_at = counted  # type: ignore[method-assign]
        async with asyncio.timeout(30):
            while not publisher.watching:  # the watch starts after the first list
                publisher.request()
                await publisher.wait_published()
        writes, lists_before = publisher.writes, lists
        for s in api.slices(DRIVER, node_name):
            api.call("DELETE", f"{RESOURCE}/resourceslices/{s['metadata']['name']}")
        # (in a thread: the driver runs on this loop) well before an hour
        await asyncio.to_thread(api.wait_for_slices, DRIVER, node_name, 2, 20)
        await asyncio.wait_for(publisher.wait_published(), 30)
        assert publisher.writes == writes + 1
        # one list for the deletion (and at most one more, for the echo of its own write
        # when that arrives before the write's answer): no periodic lists
        assert 1 <= lists - lists_before <= 2
        assert publisher.watching
    # the watch ended with the server (no thread left reading)
    assert not [t for t in threading.enumerate() if t.name == "kube-watch"]


async def test_a_watch_the_api_server_ends_is_renewed_without_a_list(
    kdir: Path, kubeconfig: Path, node_name: str, api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The API server ends every watch after its timeout (30 min here, 2 s in this test):
    the publisher watches on from the newest version it saw (bookmarks keep it recent),
    with no LIST: a quiet node makes no list in an hour, and still sees a change."""
    from kubedevice.dra.api.kube import KubeClient

    calls = {"lists": 0, "watches": 0}
    listing, watching = KubeClient.list_slices_at, KubeClient.watch_slices

    async def counted_list(self: KubeClient, driver: str, node: str) -> tuple[list[dict], str]:
        calls["lists"] += 1
        return await listing(self, driver, node)

    async def short_watch(self: KubeClient, *args: Any, **kwargs: Any) -> None:
        calls["watches"] += 1
        await watching(self, *args, timeout_s=2)

    monkeypatch.setattr(KubeClient, "list_slices_at", counted_list)
    monkeypatch.setattr(KubeClient, "watch_slices", short_watch)
    async with server(FakeDriver(gpus(2)), kdir, kubeconfig, node_name) as srv:
        publisher = srv.publisher
        assert publisher is not None
        await asyncio.wait_for(srv.wait_published(), 30)
        async with asyncio.timeout(30):
            while not calls["watches"]:
                await asyncio.sleep(0.05)
        lists, watches, writes = calls["lists"], calls["watches"], publisher.writes
        async with asyncio.timeout(30):
            while calls["watches"] < watches + 3:  # three watches ended by the API server
                await asyncio.sleep(0.2)
        assert calls["lists"] == lists, "a renewed watch listed the slices again"
        # the renewed watch still sees a deletion behind the driver's back
        for s in api.slices(DRIVER, node_name):
            api.call("DELETE", f"{RESOURCE}/resourceslices/{s['metadata']['name']}")
        await asyncio.to_thread(api.wait_for_slices, DRIVER, node_name, 2, 20)
        await asyncio.wait_for(publisher.wait_published(), 30)
        assert publisher.writes == writes + 1


def _taints(api: Api, node: str) -> dict[str, list[dict]]:
    return {
        d["name"]: d.get("taints", [])
        for s in api.slices(DRIVER, node)
        for d in s["spec"]["devices"]
    }


async def test_unhealthy_devices_are_tainted_keeping_the_time_they_were_first_tainted(
    kdir: Path, kubeconfig: Path, node_name: str, api: Api
) -> None:
    # a slice of an earlier run of this driver: gpu-1 tainted since 2020, gpu-0 out of date
    earlier = _foreign_slice(f"{node_name}-{DRIVER}-0", DRIVER, node_name)
    old_taint = {
        "key": f"{DRIVER}/unhealthy",
        "value": "Unhealthy",
        "effect": "NoSchedule",
        "timeAdded": "2020-01-02T03:04:05Z",
    }
    earlier["spec"]["devices"] = [{"name": "gpu-0"}, {"name": "gpu-1", "taints": [old_taint]}]
    api.call("POST", f"{RESOURCE}/resourceslices", earlier)
    driver = FakeDriver(gpus(3, unhealthy=[1]))
    async with server(driver, kdir, kubeconfig, node_name) as srv:
        await asyncio.wait_for(srv.wait_published(), 30)
        assert srv.publisher is not None
        taints = _taints(api, node_name)
        assert taints == {"gpu-0": [], "gpu-1": [old_taint], "gpu-2": []}
        writes = srv.publisher.writes

        # nothing changed: a reconcile writes nothing (the server's timeAdded is not a change)
        srv.publisher.request()
        await asyncio.wait_for(srv.publisher.wait_published(), 30)
        assert srv.publisher.writes == writes

        # gpu-2 turns unhealthy too: tainted now, gpu-1 keeps its time
        driver.snapshots.put_nowait(gpus(3, unhealthy=[1, 2]))
        await asyncio.sleep(0)  # let the device list reach the publisher
        await asyncio.wait_for(srv.wait_published(), 30)
        taints = _taints(api, node_name)
        assert taints["gpu-1"] == [old_taint]
        [new] = taints["gpu-2"]
        assert new["key"] == f"{DRIVER}/unhealthy"
        assert new["effect"] == "NoSchedule"
        assert new["timeAdded"] != old_taint["timeAdded"]

        # all healthy again: no taint left
        driver.snapshots.put_nowait(gpus(3))
        await asyncio.sleep(0)
        await asyncio.wait_for(srv.wait_published(), 30)
        assert _taints(api, node_name) == {"gpu-0": [], "gpu-1": [], "gpu-2": []}


async def test_without_device_taints_in_the_api_server_unhealthy_devices_are_left_out(
    kdir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    bin_dir = find_binaries(REPO)
    if bin_dir is None:
        pytest.skip("no Kubernetes binaries (see tests/dra/conftest.py)")
    with api_server(bin_dir, "--feature-gates=DRADeviceTaints=false") as kubeconfig:
        api = Api(kubeconfig)
        node = f"node-{uuid.uuid4().hex[:8]}"
        api.call("POST", "/api/v1/nodes", {"metadata": {"name": node}})
        driver = FakeDriver(gpus(3, unhealthy=[1]))
        with caplog.at_level(logging.WARNING, logger="kubedevice.dra.api.slices"):
            async with server(driver, kdir, kubeconfig, node) as srv:
                await asyncio.wait_for(srv.wait_published(), 30)
                assert srv.publisher is not None
                assert not srv.publisher.taints_supported
                assert _taints(api, node) == {"gpu-0": [], "gpu-2": []}
                driver.snapshots.put_nowait(gpus(3))  # back: published again
                await asyncio.sleep(0)
                await asyncio.wait_for(srv.wait_published(), 30)
                assert _taints(api, node) == {"gpu-0": [], "gpu-1": [], "gpu-2": []}
        [warning] = [r.getMessage() for r in caplog.records if "taints" in r.getMessage()]
        assert "DRADeviceTaints" in warning
        assert "left out" in warning


@pytest.mark.parametrize(
    ("tainted", "count", "sizes"),
    [
        ((), 0, [0]),
        ((), 128, [128]),
        ((), 129, [128, 1]),
        ((0,), 65, [64, 1]),
        ((100,), 300, [100, 64, 128, 8]),
        ((127, 128), 256, [127, 64, 65]),
    ],
)
def test_slices_with_a_tainted_device_hold_at_most_64(
    tainted: tuple[int, ...], count: int, sizes: list[int]
) -> None:
    from kubedevice.dra.api.slices import _chunks, device_object
    from kubedevice.dra.model.taints import TaintPolicy

    devices = [device_object(d, TaintPolicy("x.io")) for d in gpus(count, unhealthy=tainted)]
    chunks = _chunks(devices)
    assert [len(c) for c in chunks] == sizes
    assert [d for c in chunks for d in c] == devices  # in order, none lost
    for c in chunks:
        assert len(c) <= (64 if any(d.get("taints") for d in c) else 128)

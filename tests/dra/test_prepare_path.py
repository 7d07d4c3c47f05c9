"""The claim path over the real DRA socket on a real API server: subrequests answered under
their request, CDI specs written again when lost, one device for one claim, specs a CDI
runtime accepts, unhealthy devices, interrupted prepares, planted checkpoint files."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest

import kubedevice.dra as dra
from dra import clients
from dra.api import Api, ApiError
from dra.conftest import result
from dra.fakes import DRIVER, FakeDriver, gpus, server
from kubedevice.dra.state.checkpoint import Checkpoint
from kubedevice.plugin.cdi import validate_spec

pytestmark = pytest.mark.timeout(60)

NS = "default"
BASE = f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims"


def _claim(
    api: Api,
    name: str,
    results: list[dict[str, Any]],
    requests: list[dict[str, Any]] | None = None,
    ns: str = NS,
) -> tuple[str, str, str]:
    """A claim (``requests`` as written in its spec) with ``results`` as its allocation,
    reserved for a pod (as the scheduler leaves it: a claim of no pod is one the driver
    waits to see unprepared, test_force_delete.py)."""
    requests = requests or [
        {"name": r, "exactly": {"deviceClassName": "example"}}
        for r in dict.fromkeys(x["request"].split("/")[0] for x in results)
    ]
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"devices": {"requests": requests}},
    }
    base = f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims"
    claim = api.call("POST", base, body)
    pod = {"resource": "pods", "name": f"pod-{name}"[:63], "uid": str(uuid.uuid4())}
    claim["status"] = {"allocation": {"devices": {"results": results}}, "reservedFor": [pod]}
    claim = api.call("PUT", f"{base}/{name}/status", claim)
    return (ns, name, claim["metadata"]["uid"])


@pytest.fixture(scope="module")
def admin_ns(api: Api) -> str:
    """A namespace where claims may have admin access (the API server wants the label)."""
    name = "kd-admin-access"
    label = {"resource.kubernetes.io/admin-access": "true"}
    with contextlib.suppress(ApiError):
        api.call("POST", "/api/v1/namespaces", {"metadata": {"name": name, "labels": label}})
    return name


def _sock(kdir: Path) -> Path:
    return kdir / "plugins" / DRIVER / "dra.sock"


def _spec(kdir: Path, uid: str) -> Path:
    return kdir / "cdi" / f"k8s.{DRIVER}-claim_{uid}.json"


def _label(ref: tuple[str, str, str]) -> str:
    return f"{ref[0]}/{ref[1]} ({ref[2]})"


# ---- 1: firstAvailable -----------------------------------------------------------------


async def test_a_subrequests_devices_are_answered_under_their_top_level_request(
    kdir: Path, kubeconfig: Path, node_name: str, api: Api
) -> None:
    """The kubelet gives a container the devices whose request names hold the request the
    container names (``resources.claims[].request``: a top-level request), never
    ``gpu/small``."""
    sub = {"deviceClassName": "example", "count": 2}
    ref = _claim(
        api,
        f"first-{node_name}",
        [
            result("gpu/small", DRIVER, node_name, "gpu-0"),
            result("gpu/small", DRIVER, node_name, "gpu-1"),
            result("nic", DRIVER, node_name, "gpu-2"),
        ],
        requests=[
            {
                "name": "gpu",
                "firstAvailable": [
                    {"name": "big", "deviceClassName": "example"},
                    {"name": "small", **sub},
                ],
            },
            {"name": "nic", "exactly": {"deviceClassName": "example"}},
        ],
    )
    driver = FakeDriver(gpus(3))
    async with server(driver, kdir, kubeconfig, node_name):
        answer = (await clients.prepare(_sock(kdir), [ref])).claims[ref[2]]
        again = (await clients.prepare(_sock(kdir), [ref])).claims[ref[2]]  # the checkpoint's
    assert answer.error == ""
    assert [(list(d.request_names), d.device_name) for d in answer.devices] == [
        (["gpu"], "gpu-0"),
        (["gpu"], "gpu-1"),
        (["nic"], "gpu-2"),
    ]
    assert again == answer
    # the driver still sees which subrequest was chosen
    assert [d.request for d in driver.prepared[0].devices] == ["gpu/small", "gpu/small", "nic"]


# ---- 2: CDI specs written again ---------------------------------------------------------


async def test_a_lost_spec_is_written_again_when_the_kubelet_prepares_again(
    kdir: Path, kubeconfig: Path, node_name: str, api: Api
) -> None:
    ref = _claim(api, f"lost-{node_name}", [result("gpu", DRIVER, node_name, "gpu-0")])
    driver = FakeDriver(gpus(1))
    async with server(driver, kdir, kubeconfig, node_name):
        first = (await clients.prepare(_sock(kdir), [ref])).claims[ref[2]]
        spec = _spec(kdir, ref[2])
        written = spec.read_text()
        spec.unlink()  # a reboot empties the CDI dir (a tmpfs)
        again = (await clients.prepare(_sock(kdir), [ref])).claims[ref[2]]
        assert again == first
        assert spec.read_text() == written
        spec.write_text('{"cdiVersion": "0.5.0"}')  # changed under us: written again too
        await clients.prepare(_sock(kdir), [ref])
        assert spec.read_text() == written
    assert len(driver.prepared) == 1  # from the checkpoint, never the hook again


async def test_a_start_writes_every_prepared_claims_spec_again(
    kdir: Path, kubeconfig: Path, node_name: str, api: Api
) -> None:
    ref = _claim(api, f"boot-{node_name}", [result("gpu", DRIVER, node_name, "gpu-0")])
    async with server(FakeDriver(gpus(1)), kdir, kubeconfig, node_name):
        assert (await clients.prepare(_sock(kdir), [ref])).claims[ref[2]].error == ""
    written = _spec(kdir, ref[2]).read_text()
    for path in (kdir / "cdi").iterdir():  # the reboot
        path.unlink()
    (kdir / "cdi").rmdir()
    async with server(FakeDriver(gpus(1)), kdir, kubeconfig, node_name):
        # before any call: a container restarted by the runtime finds its spec
        assert _spec(kdir, ref[2]).read_text() == written
        validate_spec(json.loads(written))


async def test_an_old_checkpoint_entry_without_edits_is_prepared_again_when_its_spec_is_gone(
    kdir: Path, kubeconfig: Path, node_name: str, api: Api
) -> None:
    ref = _claim(api, f"old-{node_name}", [result("gpu", DRIVER, node_name, "gpu-0")])
    old = Checkpoint(kdir / "plugins" / DRIVER / "checkpoint.json", DRIVER)
    cdi_id = f"k8s.{DRIVER}/claim={ref[2]}-gpu-0"
    old.claims[ref[2]] = dra.PreparedClaim(
        ref=dra.ClaimRef(*ref),
        devices=(("gpu", node_name, "gpu-0"),),
        cdi_ids=((cdi_id,),),
        share_ids=(None,),
        data=({},),
    )
    old.save()
    assert "edits" not in old.path.read_text()  # as an older version wrote it
    driver = FakeDriver(gpus(1))
    async with server(driver, kdir, kubeconfig, node_name):
        answer = (await clients.prepare(_sock(kdir), [ref])).claims[ref[2]]
    assert answer.error == ""
    assert [list(d.cdi_device_ids) for d in answer.devices] == [[cdi_id]]
    assert [c.ref.uid for c in driver.prepared] == [ref[2]]  # the hook ran again
    spec = json.loads(_spec(kdir, ref[2]).read_text())
    assert spec["devices"][0]["containerEdits"]["env"] == ["FAKE_GPU=0"]
    saved = json.loads(old.path.read_text())["claims"][ref[2]]["devices"][0]
    assert saved["edits"]["env"] == ["FAKE_GPU=0"]  # and now the checkpoint can rebuild it


# ---- 3: one device, one claim -----------------------------------------------------------


async def test_a_device_prepared_for_one_claim_is_refused_to_another(
    kdir: Path, kubeconfig: Path, node_name: str, api: Api
) -> None:
    one = _claim(api, f"one-{node_name}", [result("gpu", DRIVER, node_name, "gpu-1")])
    two = _claim(api, f"two-{node_name}", [result("gpu", DRIVER, node_name, "gpu-1")])
    driver = FakeDriver(gpus(2))
    async with server(driver, kdir, kubeconfig, node_name):
        assert (await clients.prepare(_sock(kdir), [one])).claims[one[2]].error == ""
        error = (await clients.prepare(_sock(kdir), [two])).claims[two[2]].error
    assert error == (
        f"device gpu-1 (pool {node_name}) is already prepared for claim {_label(one)}; "
        f"claim {_label(two)} is allocated the same device without admin access (the "
        "device does not allow multiple allocations): not prepared"
    )
    assert [c.ref.uid for c in driver.prepared] == [one[2]]
    assert not _spec(kdir, two[2]).exists()
    # after a restart (from the checkpoint) too, and free again once the first is unprepared
    async with server(FakeDriver(gpus(2)), kdir, kubeconfig, node_name):
        assert (
            "already prepared" in (await clients.prepare(_sock(kdir), [two])).claims[two[2]].error
        )
        assert (await clients.unprepare(_sock(kdir), [one])).claims[one[2]].error == ""
        assert (await clients.prepare(_sock(kdir), [two])).claims[two[2]].error == ""


async def test_two_claims_of_one_call_naming_one_device_get_it_once(
    kdir: Path, kubeconfig: Path, node_name: str, api: Api
) -> None:
    one = _claim(api, f"a-{node_name}", [result("gpu", DRIVER, node_name, "gpu-0")])
    two = _claim(api, f"b-{node_name}", [result("gpu", DRIVER, node_name, "gpu-0")])
    async with server(FakeDriver(gpus(1)), kdir, kubeconfig, node_name):
        answer = await clients.prepare(_sock(kdir), [one, two])
    errors = sorted(answer.claims[r[2]].error for r in (one, two))
    assert errors[0] == ""
    assert "device gpu-0" in errors[1]
    assert "is already prepared for claim" in errors[1]


@pytest.mark.parametrize(
    ("first", "second", "shared", "allowed"),
    [
        ({"adminAccess": True}, {}, False, True),
        ({}, {"adminAccess": True}, False, True),
        ({"shareID": str(uuid.UUID(int=1))}, {"shareID": str(uuid.UUID(int=2))}, True, True),
        ({"shareID": str(uuid.UUID(int=1))}, {"shareID": str(uuid.UUID(int=1))}, True, False),
        ({"shareID": str(uuid.UUID(int=1))}, {}, True, False),
        # shares of a device the driver does not publish as shareable: refused
        ({"shareID": str(uuid.UUID(int=1))}, {"shareID": str(uuid.UUID(int=2))}, False, False),
    ],
    ids=[
        "admin-first",
        "admin-second",
        "two-shares",
        "same-share",
        "share-and-whole",
        "two-shares-of-an-unshared-device",
    ],
)
async def test_admin_access_or_distinct_shares_may_share_a_device(
    kdir: Path,
    kubeconfig: Path,
    node_name: str,
    api: Api,
    first: dict[str, Any],
    second: dict[str, Any],
    shared: bool,
    allowed: bool,
    admin_ns: str,
) -> None:
    device = result("gpu", DRIVER, node_name, "gpu-0")
    one = _claim(api, f"x-{node_name}", [{**device, **first}], ns=admin_ns)
    two = _claim(api, f"y-{node_name}", [{**device, **second}], ns=admin_ns)
    for ref, given in ((one, first), (two, second)):
        path = f"/apis/resource.k8s.io/v1/namespaces/{admin_ns}/resourceclaims/{ref[1]}"
        [got] = api.call("GET", path)["status"]["allocation"]["devices"]["results"]
        assert set(given) <= set(got), f"the API server dropped {sorted(given)}"
    async with server(FakeDriver(gpus(1, shared=shared)), kdir, kubeconfig, node_name):
        assert (await clients.prepare(_sock(kdir), [one])).claims[one[2]].error == ""
        error = (await clients.prepare(_sock(kdir), [two])).claims[two[2]].error
    assert (error == "") is allowed, error


# ---- 9: only specs a CDI runtime accepts ------------------------------------------------


class _Edits(FakeDriver):
    """Gives each device the edits ``edits_for(allocated)`` returns."""

    def __init__(self, devices: Sequence[dra.Device], edits_for: Any) -> None:
        super().__init__(devices)
        self.edits_for = edits_for

    async def prepare(self, claim: dra.Claim) -> Sequence[dra.PreparedDevice]:
        self.prepared.append(claim)
        return [dra.PreparedDevice(d, self.edits_for(d)) for d in claim.devices]


async def test_devices_without_edits_get_no_cdi_id_and_no_spec_file(
    kdir: Path, kubeconfig: Path, node_name: str, api: Api
) -> None:
    ref = _claim(api, f"bare-{node_name}", [result("gpu", DRIVER, node_name, "gpu-0")])
    driver = _Edits(gpus(1), lambda d: dra.ContainerEdits())
    async with server(driver, kdir, kubeconfig, node_name):
        answer = (await clients.prepare(_sock(kdir), [ref])).claims[ref[2]]
        assert answer.error == ""
        assert [(d.device_name, list(d.cdi_device_ids)) for d in answer.devices] == [("gpu-0", [])]
        # a spec without devices is refused by the CDI libraries: none is written
        assert not _spec(kdir, ref[2]).exists()
        assert (await clients.unprepare(_sock(kdir), [ref])).claims[ref[2]].error == ""


async def test_one_device_in_two_requests_is_one_spec_device_or_two_distinct_names(
    kdir: Path, kubeconfig: Path, node_name: str, api: Api
) -> None:
    results = [result("a", DRIVER, node_name, "gpu-0"), result("b", DRIVER, node_name, "gpu-0")]
    same = _claim(api, f"same-{node_name}", results)
    differ = _claim(api, f"differ-{node_name}", results)
    async with server(FakeDriver(gpus(1)), kdir, kubeconfig, node_name):
        answer = (await clients.prepare(_sock(kdir), [same])).claims[same[2]]
        assert answer.error == ""
        ids = [list(d.cdi_device_ids) for d in answer.devices]
        assert ids == [[f"k8s.{DRIVER}/claim={same[2]}-gpu-0"]] * 2
        spec = json.loads(_spec(kdir, same[2]).read_text())
        validate_spec(spec)  # no name twice
        assert [d["name"] for d in spec["devices"]] == [f"{same[2]}-gpu-0"]
    driver = _Edits(gpus(1), lambda d: dra.ContainerEdits(env={"REQUEST": d.request}))
    async with server(driver, kdir, kubeconfig, node_name):
        assert (await clients.unprepare(_sock(kdir), [same])).claims[same[2]].error == ""
        answer = (await clients.prepare(_sock(kdir), [differ])).claims[differ[2]]
        assert answer.error == ""
        spec = json.loads(_spec(kdir, differ[2]).read_text())
        validate_spec(spec)
        assert {d["name"]: d["containerEdits"]["env"] for d in spec["devices"]} == {
            f"{differ[2]}-gpu-0": ["REQUEST=a"],
            f"{differ[2]}-gpu-0_1": ["REQUEST=b"],
        }
        assert [list(d.cdi_device_ids) for d in answer.devices] == [
            [f"k8s.{DRIVER}/claim={differ[2]}-gpu-0"],
            [f"k8s.{DRIVER}/claim={differ[2]}-gpu-0_1"],
        ]


async def test_a_claim_with_no_device_of_this_node_is_an_error(
    kdir: Path, kubeconfig: Path, node_name: str, api: Api
) -> None:
    ref = _claim(api, f"elsewhere-{node_name}", [result("gpu", DRIVER, "other-node", "gpu-0")])
    driver = FakeDriver(gpus(1))
    async with server(driver, kdir, kubeconfig, node_name):
        answer = (await clients.prepare(_sock(kdir), [ref])).claims[ref[2]]
    assert answer.error == (
        f"claim {_label(ref)} has no device of driver {DRIVER} in pool {node_name} allocated: "
        "nothing to prepare on this node"
    )
    assert list(answer.devices) == []
    assert driver.prepared == []


# ---- 10: unhealthy devices --------------------------------------------------------------


async def test_a_claim_on_an_unhealthy_device_is_refused_unless_it_tolerates_the_taint(
    kdir: Path, kubeconfig: Path, node_name: str, api: Api
) -> None:
    bad = _claim(api, f"sick-{node_name}", [result("gpu", DRIVER, node_name, "gpu-1")])
    toleration = {"key": f"{DRIVER}/unhealthy", "operator": "Exists", "effect": "NoSchedule"}
    tolerant = _claim(
        api,
        f"tolerant-{node_name}",
        [{**result("gpu", DRIVER, node_name, "gpu-1"), "tolerations": [toleration]}],
    )
    driver = FakeDriver(gpus(2, unhealthy=[1]))
    async with server(driver, kdir, kubeconfig, node_name):
        error = (await clients.prepare(_sock(kdir), [bad])).claims[bad[2]].error
        assert error == (
            f"device gpu-1 is Unhealthy (tainted {DRIVER}/unhealthy=Unhealthy:NoSchedule) and "
            f"claim {_label(bad)} does not tolerate it: not prepared"
        )
        got = api.call("GET", f"{BASE}/{tolerant[1]}")["status"]["allocation"]["devices"]
        if "tolerations" not in got["results"][0]:
            pytest.skip("this API server drops tolerations from allocation results")
        assert (await clients.prepare(_sock(kdir), [tolerant])).claims[tolerant[2]].error == ""
    assert [c.ref.uid for c in driver.prepared] == [tolerant[2]]


# ---- 7: a prepare cut short by the caller's deadline -----------------------------------


class _Blocking(FakeDriver):
    def __init__(self, devices: Sequence[dra.Device]) -> None:
        super().__init__(devices)
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def prepare(self, claim: dra.Claim) -> Sequence[dra.PreparedDevice]:
        self.prepared.append(claim)
        self.entered.set()
        await self.release.wait()
        return await dra.Driver.prepare(self, claim)


async def test_a_prepare_cut_short_by_the_deadline_runs_on_and_the_next_unprepare_undoes_it(
    kdir: Path, kubeconfig: Path, node_name: str, api: Api
) -> None:
    """The caller gives up; the hook goes on to its end (test_cutoff.py has more), and the
    unprepare that follows waits for it, then undoes what it made."""
    ref = _claim(api, f"cut-{node_name}", [result("gpu", DRIVER, node_name, "gpu-0")])
    driver = _Blocking(gpus(1))
    async with server(driver, kdir, kubeconfig, node_name):
        from kubedevice._api.dra.v1 import api_pb2 as v1, api_pb2_grpc as v1_grpc

        async with clients.channel(_sock(kdir)) as ch:
            call = v1_grpc.DRAPluginStub(ch).NodePrepareResources(
                v1.NodePrepareResourcesRequest(
                    claims=[v1.Claim(namespace=NS, name=ref[1], uid=ref[2])]
                ),
                timeout=2,
            )
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await call
        assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert driver.entered.is_set()  # the hook was running when the caller gave up
        unprepare = asyncio.ensure_future(clients.unprepare(_sock(kdir), [ref]))
        done, _ = await asyncio.wait({unprepare}, timeout=0.3)
        assert not done  # it waits for the hook
        driver.release.set()
        assert (await unprepare).claims[ref[2]].error == ""
        assert [c.ref.uid for c in driver.unprepared] == [ref[2]]  # the hook's work undone
        saved = json.loads((kdir / "plugins" / DRIVER / "checkpoint.json").read_text())
        assert saved["claims"] == {}


# ---- 8: what is planted at the checkpoint path -----------------------------------------


@pytest.mark.parametrize("kind", ["fifo", "directory", "symlink"])
async def test_a_planted_checkpoint_is_moved_aside_and_the_driver_starts_empty(
    kdir: Path,
    kubeconfig: Path,
    node_name: str,
    api: Api,
    kind: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    path = kdir / "plugins" / DRIVER / "checkpoint.json"
    path.parent.mkdir(parents=True)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
        (path / "inside").write_text("x")
    else:
        target = kdir / "elsewhere.json"
        target.write_text("{}")
        path.symlink_to(target)
    ref = _claim(api, f"planted-{node_name}", [result("gpu", DRIVER, node_name, "gpu-0")])
    caplog.set_level(logging.WARNING, logger="kubedevice.dra.state.checkpoint")
    srv = server(FakeDriver(gpus(1)), kdir, kubeconfig, node_name)
    async with asyncio.timeout(15):  # a FIFO once hung the start here
        await srv.start()
    try:
        [aside] = path.parent.glob("checkpoint.json.corrupt-*")
        [record] = [r for r in caplog.records if "is unusable" in r.getMessage()]
        what = {"fifo": "a FIFO", "directory": "a directory", "symlink": "a symbolic link"}[kind]
        assert f"is {what}, not a regular file" in record.getMessage()
        assert "\n" not in record.getMessage()
        assert record.exc_info is None
        assert srv.checkpoint.set_aside == aside
        assert srv.checkpoint.claims == {}
        assert (await clients.prepare(_sock(kdir), [ref])).claims[ref[2]].error == ""
        assert ref[2] in json.loads(path.read_text())["claims"]  # a regular file again
    finally:
        await srv.stop()
    if kind == "symlink":
        assert (kdir / "elsewhere.json").read_text() == "{}"  # never written through


async def test_the_generic_driver_refuses_a_claim_on_its_unhealthy_device_too(
    kdir: Path, kubeconfig: Path, node_name: str, api: Api
) -> None:
    """The same rule as the GPU driver's, from the kit (it once prepared such a claim)."""
    from kubedevice.generic import FakeHost
    from kubedevice.generic.config import parse_config
    from kubedevice.generic.dra import GenericDraDriver

    host = FakeHost(kdir / "host")
    host.add_char_device("/dev/dri/renderD129")
    host.set_attr("/sys/class/drm/renderD129/device/enable", "0")  # its check fails
    group = {
        "paths": [{"path": "/dev/dri/renderD*"}],
        "health": {
            "periodSeconds": 3600,
            "sysfsAttribute": {"path": "/sys/class/drm/{name}/device/enable", "expect": "1"},
        },
    }
    config = parse_config(
        {"version": "v1", "resources": [{"name": "example.com/render", "groups": [group]}]}
    ).with_roots(str(host.dev_root), str(host.sys_root))
    driver_name = GenericDraDriver.driver_name
    async with server(GenericDraDriver(config), kdir, kubeconfig, node_name) as srv:
        [name] = srv.devices
        assert srv.devices[name].health == dra.Health.UNHEALTHY
        ref = _claim(api, f"render-{node_name}", [result("gpu", driver_name, node_name, name)])
        sock = kdir / "plugins" / driver_name / "dra.sock"
        error = (await clients.prepare(sock, [ref])).claims[ref[2]].error
    assert error.startswith(f"device {name} is Unhealthy (")
    assert f"tainted {driver_name}/health-check=" in error  # the generic driver's fault
    assert not (kdir / "cdi" / f"k8s.{driver_name}-claim_{ref[2]}.json").exists()

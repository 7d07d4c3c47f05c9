"""A small, independent DRA driver for the DRA kit's tests; each --break flag breaks one rule.

Written with raw ``grpc.aio``, ``kubedevice._api`` and a few lines of HTTP (never the DRA kit,
nor the conformance kit's client), so the kit is proven against a driver that shares no code
with ours or with the kit. Without flags it follows the contract: it serves, then its
registration socket appears; it publishes one ResourceSlice of ``--devices`` devices for its
node and publishes it again when someone deletes it; it prepares a claim's devices under the
claim's top-level request names with one CDI spec per claim (written again when it is gone),
refuses a device prepared for another claim, answers per-claim errors, keeps a checkpoint
for restarts, and on SIGTERM removes its sockets and exits 0. It offers no health stream.
``$KIT_DRIVER_PREPARE_DELAY`` (seconds) slows every prepare call: the kit's ``--slow-env``.

Run: ``python kit_driver.py --node-name N --kubeconfig F --kubelet-dir D --cdi-dir C
[--pod-uid U] [--devices 6] [--break FLAG ...]`` (the kubeconfig: a token and a CA file).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import json
import os
import signal
import ssl
import sys
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

import grpc
import yaml

from kubedevice._api.dra.v1 import api_pb2 as v1, api_pb2_grpc as v1_grpc
from kubedevice._api.dra.v1beta1 import api_pb2 as v1beta1, api_pb2_grpc as v1beta1_grpc
from kubedevice._api.pluginregistration.v1 import api_pb2 as reg, api_pb2_grpc as reg_grpc

DRIVER = "kit.example.com"  # short: socket paths stay under 108 bytes
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
#: Seconds each prepare call takes at least (the kit's --slow-env sets it).
DELAY_ENV = "KIT_DRIVER_PREPARE_DELAY"

#: Each flag reintroduces one bug class that the mutation set of tests/conformance/dra_mutants/
#: (a driver on kubedevice.dra) does not; tests/conformance/test_dra_kit.py maps each to the
#: case that must fail.
BREAK_FLAGS = (
    "list-resync",  # LISTs slices every second
    "unprepare-unknown-error",  # unprepare of a claim it does not know is an error
)


class Api:
    """Blocking JSON calls with the kubeconfig's token and CA."""

    def __init__(self, kubeconfig: Path) -> None:
        config = yaml.safe_load(kubeconfig.read_text())
        cluster = config["clusters"][0]["cluster"]
        url = urlsplit(cluster["server"])
        self.host, self.port = url.hostname or "", url.port or 443
        self.ctx = ssl.create_default_context(cafile=cluster.get("certificate-authority"))
        token = config["users"][0]["user"]["token"]
        self.headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}

    def call(self, method: str, path: str, body: Any = None, timeout: float | None = 10) -> Any:
        conn = http.client.HTTPSConnection(self.host, self.port, context=self.ctx, timeout=timeout)
        try:
            conn.request(method, path, None if body is None else json.dumps(body), self.headers)
            response = conn.getresponse()
            text = response.read().decode()
        finally:
            conn.close()
        if response.status >= 300:
            raise LookupError(f"{response.status} {text[:200]}")
        return json.loads(text)

    def watch_deletions(self, path: str, version: str, on_delete: Any) -> None:
        conn = http.client.HTTPSConnection(self.host, self.port, context=self.ctx)
        conn.request("GET", f"{path}&watch=1&resourceVersion={version}", None, self.headers)
        response = conn.getresponse()
        while line := response.readline():
            if json.loads(line).get("type") == "DELETED":
                on_delete()


class Driver:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.broken = set(args.broken)
        self.api = Api(Path(args.kubeconfig))
        self.cdi = Path(args.cdi_dir)
        self.state = Path(args.kubelet_dir) / "plugins" / DRIVER
        self.state.mkdir(parents=True, exist_ok=True)
        suffix = f"-{args.pod_uid}" if args.pod_uid else ""
        self.dra_sock = self.state / f"dra{suffix}.sock"
        self.reg_sock = Path(args.kubelet_dir) / "plugins_registry" / f"{DRIVER}{suffix}-reg.sock"
        self.checkpoint = self.state / "checkpoint.json"
        self.lock = threading.Lock()

    # ---- slices

    def slice_body(self, node: str) -> dict[str, Any]:
        return {
            "metadata": {"name": f"{node}-{DRIVER}"},
            "spec": {
                "driver": DRIVER,
                "nodeName": node,
                "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                "devices": [{"name": f"dev-{i}"} for i in range(self.args.devices)],
            },
        }

    def publish(self) -> None:
        with contextlib.suppress(LookupError):  # 409: it is there
            self.api.call("POST", SLICES, self.slice_body(self.args.node_name))

    def keep_published(self) -> None:
        """Publish, then publish again on every deletion (a watch in a thread)."""
        query = urlencode({"fieldSelector": f"spec.driver={DRIVER}"})
        while True:
            listing = self.api.call("GET", f"{SLICES}?{query}")
            self.publish()
            version = listing["metadata"]["resourceVersion"]
            with contextlib.suppress(OSError, http.client.HTTPException, ValueError):
                self.api.watch_deletions(f"{SLICES}?{query}", version, self.publish)

    def misbehave(self) -> None:
        """The resync bug: a LIST every second."""
        while True:
            time.sleep(1)
            with contextlib.suppress(LookupError, OSError):
                self.api.call("GET", SLICES)

    # ---- claims

    def load(self) -> dict[str, Any]:
        try:
            return dict(json.loads(self.checkpoint.read_text()))
        except (OSError, ValueError):
            return {}

    def save(self, prepared: dict[str, Any]) -> None:
        tmp = self.checkpoint.with_suffix(".tmp")
        tmp.write_text(json.dumps(prepared))
        tmp.replace(self.checkpoint)

    def spec_path(self, uid: str) -> Path:
        return self.cdi / f"k8s.{DRIVER}-claim_{uid}.json"

    def write_spec(self, uid: str, devices: list[dict[str, Any]]) -> None:
        node = "/dev/null"
        spec = {
            "cdiVersion": "0.5.0",
            "kind": f"k8s.{DRIVER}/claim",
            "devices": [
                {"name": f"{uid}-{d['device']}", "containerEdits": {
                    "env": [f"KIT_DEVICE={d['device']}"],
                    "deviceNodes": [{"path": f"/dev/{d['device']}", "hostPath": node}]}}
                for d in devices
            ],
        }  # fmt: skip
        self.cdi.mkdir(parents=True, exist_ok=True)
        tmp = self.spec_path(uid).with_suffix(".tmp")
        tmp.write_text(json.dumps(spec))
        tmp.replace(self.spec_path(uid))

    def prepare_one(self, claim: Any, prepared: dict[str, Any]) -> list[dict[str, Any]]:
        if claim.uid in prepared:
            devices = prepared[claim.uid]
            if not self.spec_path(claim.uid).exists():
                self.write_spec(claim.uid, devices)
            return list(devices)
        path = f"/apis/resource.k8s.io/v1/namespaces/{claim.namespace}/resourceclaims/{claim.name}"
        obj = self.api.call("GET", path)
        if obj["metadata"]["uid"] != claim.uid:
            raise LookupError(f"claim {claim.name} has UID {obj['metadata']['uid']}")
        allocation = (obj.get("status") or {}).get("allocation")
        if not allocation:
            raise LookupError(f"claim {claim.name} is not allocated")
        in_use = {d["device"]: uid for uid, ds in prepared.items() for d in ds}
        devices = []
        for result in allocation["devices"]["results"]:
            if result["driver"] != DRIVER:
                continue
            owner = in_use.get(result["device"])
            if owner and not result.get("adminAccess"):
                raise LookupError(f"{result['device']} is prepared for claim {owner}")
            request = result["request"].split("/")[0]  # the top-level request's name
            devices.append({"request": request, "pool": result["pool"],
                            "device": result["device"]})  # fmt: skip
        self.write_spec(claim.uid, devices)
        prepared[claim.uid] = devices
        return devices

    def prepare_all(self, claims: list[Any]) -> dict[str, list[dict[str, Any]] | str]:
        """Prepare ``claims`` (devices, or the error, by UID), all under the lock, in a thread:
        a call the kubelet cuts off still finishes and saves before its retry starts."""
        with self.lock:
            time.sleep(float(os.environ.get(DELAY_ENV) or 0))  # the knob: a slow prepare
            prepared = self.load()
            out: dict[str, list[dict[str, Any]] | str] = {}
            for claim in claims:
                try:
                    out[claim.uid] = self.prepare_one(claim, prepared)
                except LookupError as exc:
                    out[claim.uid] = str(exc)
            self.save(prepared)
            return out

    async def prepare(self, request: Any, pb: Any, context: Any) -> Any:
        results = await asyncio.to_thread(self.prepare_all, list(request.claims))
        out = {}
        for uid, devices in results.items():
            if isinstance(devices, str):
                out[uid] = pb.NodePrepareResourceResponse(error=devices)
                continue
            out[uid] = pb.NodePrepareResourceResponse(devices=[
                pb.Device(request_names=[d["request"]], pool_name=d["pool"],
                          device_name=d["device"],
                          cdi_device_ids=[f"k8s.{DRIVER}/claim={uid}-{d['device']}"])
                for d in devices])  # fmt: skip
        return pb.NodePrepareResourcesResponse(claims=out)

    def unprepare_all(self, uids: list[str]) -> dict[str, str]:
        with self.lock:
            prepared = self.load()
            out = {}
            for uid in uids:
                error = ""
                if uid not in prepared and "unprepare-unknown-error" in self.broken:
                    error = f"claim {uid} is not prepared"
                prepared.pop(uid, None)
                self.spec_path(uid).unlink(missing_ok=True)
                out[uid] = error
            self.save(prepared)
            return out

    async def unprepare(self, request: Any, pb: Any) -> Any:
        errors = await asyncio.to_thread(self.unprepare_all, [c.uid for c in request.claims])
        return pb.NodeUnprepareResourcesResponse(
            claims={uid: pb.NodeUnprepareResourceResponse(error=e) for uid, e in errors.items()}
        )


def servicer(driver: Driver, pb: Any, grpc_mod: Any) -> Any:
    class Servicer(grpc_mod.DRAPluginServicer):  # type: ignore[misc,name-defined]
        async def NodePrepareResources(self, request: Any, context: Any) -> Any:
            return await driver.prepare(request, pb, context)

        async def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
            return await driver.unprepare(request, pb)

    return Servicer()


class Registration(reg_grpc.RegistrationServicer):
    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint

    async def GetInfo(self, request: Any, context: Any) -> Any:
        return reg.PluginInfo(type="DRAPlugin", name=DRIVER, endpoint=self.endpoint,
                              supported_versions=["v1.DRAPlugin", "v1beta1.DRAPlugin"])  # fmt: skip

    async def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
        print(f"kit-driver: registered={request.plugin_registered} {request.error}", flush=True)
        return reg.RegistrationStatusResponse()


async def main() -> int:
    parser = argparse.ArgumentParser()
    for flag in ("--node-name", "--kubeconfig", "--kubelet-dir", "--cdi-dir"):
        parser.add_argument(flag, required=True)
    parser.add_argument("--pod-uid", default="")
    parser.add_argument("--devices", type=int, default=6)
    parser.add_argument("--break", dest="broken", action="append", default=[],
                        choices=BREAK_FLAGS)  # fmt: skip
    driver = Driver(parser.parse_args())
    for sock in (driver.dra_sock, driver.reg_sock):
        sock.unlink(missing_ok=True)
    dra = grpc.aio.server()
    v1_grpc.add_DRAPluginServicer_to_server(servicer(driver, v1, v1_grpc), dra)
    v1beta1_grpc.add_DRAPluginServicer_to_server(servicer(driver, v1beta1, v1beta1_grpc), dra)
    dra.add_insecure_port(f"unix://{driver.dra_sock}")
    await dra.start()
    registration = grpc.aio.server()
    reg_grpc.add_RegistrationServicer_to_server(Registration(str(driver.dra_sock)), registration)
    registration.add_insecure_port(f"unix://{driver.reg_sock}")
    await registration.start()
    threading.Thread(target=driver.keep_published, daemon=True).start()
    if "list-resync" in driver.broken:
        threading.Thread(target=driver.misbehave, daemon=True).start()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await registration.stop(None)
    await dra.stop(None)
    for sock in (driver.dra_sock, driver.reg_sock):
        sock.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))

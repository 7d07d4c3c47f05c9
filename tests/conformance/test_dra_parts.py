"""The DRA kit's parts that need no driver: the catalogue and the CDI dir as a runtime reads it."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from grpc import aio

from kubedevice._api.pluginregistration.v1 import api_pb2 as reg, api_pb2_grpc as reg_grpc
from kubedevice.conformance.catalogue import Level
from kubedevice.conformance.dra import DRA_CASES
from kubedevice.conformance.dra.catalogue import AREAS
from kubedevice.conformance.dra.cdi import CdiDir
from kubedevice.conformance.dra.kubelet import PluginWatcher


def test_catalogue_has_40_judged_cases_in_known_areas() -> None:
    ids = [c.id for c in DRA_CASES]
    assert len(ids) == len(set(ids))
    assert sum(1 for c in DRA_CASES if c.level is not Level.INFO) >= 40
    assert all(c.id.split("-")[0] in AREAS for c in DRA_CASES)
    assert all(c.section and c.title for c in DRA_CASES)


def _spec(path: Path, kind: str, devices: list[dict[str, object]]) -> None:
    path.write_text(json.dumps({"cdiVersion": "0.5.0", "kind": kind, "devices": devices}))


def test_cdi_ids_resolve_only_to_valid_specs_with_existing_nodes(tmp_path: Path) -> None:
    host = tmp_path / "host"
    (host / "dev").mkdir(parents=True)
    (host / "dev" / "a0").write_text("")
    cdi = CdiDir(tmp_path / "cdi", host)
    cdi.path.mkdir()
    edits = {"deviceNodes": [{"path": "/dev/a0"}]}
    _spec(cdi.path / "good.json", "example.com/claim", [{"name": "u-a0", "containerEdits": edits}])
    missing = {"deviceNodes": [{"path": "/dev/gone"}]}
    _spec(cdi.path / "bad.json", "example.com/other", [{"name": "x", "containerEdits": missing}])
    (cdi.path / "broken.yaml").write_text("{not yaml: [")
    found = cdi.resolve("example.com/claim=u-a0")
    assert not isinstance(found, str)
    assert found[0].problem == ""
    bad = cdi.resolve("example.com/other=x")
    assert not isinstance(bad, str)
    assert bad[0].problem == "device 'x': device node /dev/gone does not exist (under " \
        f"{host})"  # fmt: skip
    assert "no spec" in str(cdi.resolve("example.com/claim=nope"))
    assert "not a fully qualified" in str(cdi.resolve("u-a0"))
    assert any(s.problem.startswith("cannot be read") for s in cdi.specs())
    assert cdi.ids() == {"example.com/claim=u-a0", "example.com/other=x"}
    cdi.wipe()
    assert cdi.specs() == []


class _Registration(reg_grpc.RegistrationServicer):  # type: ignore[misc]
    async def GetInfo(self, request: reg.InfoRequest, context: object) -> reg.PluginInfo:
        return reg.PluginInfo(
            type="DRAPlugin", name="x.example.com", endpoint="/x.sock", supported_versions=["v1"]
        )

    async def NotifyRegistrationStatus(
        self, request: reg.RegistrationStatus, context: object
    ) -> reg.RegistrationStatusResponse:
        return reg.RegistrationStatusResponse()


def test_the_plugin_watcher_ignores_hidden_sockets_as_the_kubelet_does(tmp_path: Path) -> None:
    """Our drivers bind a hidden name (.kd-PID-N.sock) and rename it into place; the kubelet's
    plugin watcher ignores names that start with a dot. Before: the kit registered the
    hidden socket too, and when its rename came first the notification failed (reg-notify
    FAIL for a correct driver, more often on a busy machine)."""

    async def scenario() -> list[str]:
        servers = []
        for name in (".kd-1-1.sock", "visible.sock"):
            server = aio.server()
            reg_grpc.add_RegistrationServicer_to_server(_Registration(), server)
            server.add_insecure_port(f"unix:{tmp_path / name}")
            await server.start()
            servers.append(server)
        changed = asyncio.Event()
        watcher = PluginWatcher(tmp_path, changed.set)
        watcher.start()  # both sockets are there already: the first scan finds them
        try:
            while not watcher.registrations:
                await asyncio.wait_for(changed.wait(), 30)
            # and every registration under way (the hidden one's, were it taken) to its end
            await asyncio.gather(*watcher._pending)
            return sorted(r.socket.name for r in watcher.registrations)
        finally:
            await watcher.stop()
            for server in servers:
                await server.stop(None)

    assert asyncio.run(scenario()) == ["visible.sock"]

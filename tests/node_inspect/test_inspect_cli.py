"""``kubedevice inspect`` against the emulator: plugins, a hanging and a dead socket, pods."""

from __future__ import annotations

import json
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from kubedevice.kubelet.checkpoint import CheckpointData, CheckpointEntry, dumps, loads
from node_inspect.helpers import BAR, COUNTER, FOO, Node, inspect_json, run_inspect


def _snapshot(d: Path) -> dict[str, tuple[int, int, bytes | None]]:
    out = {}
    for p in sorted(d.iterdir()):
        st = os.lstat(p)
        out[p.name] = (st.st_mode, st.st_mtime_ns, p.read_bytes() if p.is_file() else None)
    return out


def _codes(doc: dict[str, Any]) -> list[str]:
    return sorted(f["code"] for f in doc["findings"])


async def test_whole_node_with_a_hanging_and_a_dead_plugin(
    node: Node, hanging: Path, dead: Path
) -> None:
    before = _snapshot(node.dp_dir)
    start = time.monotonic()
    rc, doc, err = await inspect_json(node.dp_dir)
    elapsed = time.monotonic() - start
    assert rc == 1, err  # problems flagged, every input read
    assert (doc["inputErrors"], err) == ([], "")
    assert doc["seconds"] < 3.0  # the hanging socket is bounded at 2 s
    assert elapsed < 10
    assert doc["streamed"] is False
    plugins = {p["socket"]: p for p in doc["plugins"]}
    assert plugins["hang.sock"]["state"] == "no-answer"
    assert plugins["dead.sock"]["state"] == "stale"
    by_res = {p["resource"]: p for p in doc["plugins"] if p["state"] == "ok"}
    assert set(by_res) == {FOO, BAR, COUNTER}  # matched by socket name
    foo = by_res[FOO]
    assert foo["options"] == {"preStartRequired": False, "getPreferredAllocationAvailable": True}
    assert (foo["devices"], foo["health"], foo["numa"], foo["unhealthy"]) == (None,) * 4
    assert by_res[BAR]["options"]["preStartRequired"] is True
    assert node.foo.calls.list_and_watch == 1  # the kubelet's stream only
    assert node.bar.calls.list_and_watch == 1
    assert doc["kubeletSocket"] == "ok"
    cp = doc["checkpoint"]
    assert cp["checksumOk"] is True
    assert sorted(cp["healthyAtLastWrite"][FOO]) == ["foo-0", "foo-1", "foo-2"]
    assert sorted(cp["healthyAtLastWrite"]) == [BAR, COUNTER, FOO]
    assert sorted(len(e["deviceIDs"]) for e in cp["entries"]) == [1, 2]
    pr = doc["podResources"]
    assert sorted(pr["allocatable"][FOO]) == ["foo-0", "foo-1", "foo-2"]  # healthy ones
    assert pr["allocatableNuma"][FOO] == {"0": 2, "1": 1}
    assert pr["allocatableNuma"][BAR] == {"none": 3}
    assigned = {(a["namespace"], a["pod"], a["container"], a["resource"]) for a in pr["assigned"]}
    assert assigned == {("team", "train", "c", FOO), ("team", "serve", "app", BAR)}
    [train] = [a for a in pr["assigned"] if a["pod"] == "train"]
    [entry] = [e for e in cp["entries"] if e["resource"] == FOO]
    assert sorted(train["deviceIDs"]) == sorted(entry["deviceIDs"])
    assert _codes(doc) == ["plugin-not-answering", "stale-socket"]
    # read-only: nothing in the directory changed, the stale socket is still there
    assert _snapshot(node.dp_dir) == before


async def test_list_and_watch_is_asked_for_and_warns(node: Node) -> None:
    rc, doc, err = await inspect_json(node.dp_dir, "--list-and-watch")
    assert rc == 1
    [warning] = err.splitlines()
    assert warning.startswith("warning: --list-and-watch opens a second ListAndWatch stream")
    assert "never end a stream whose client left" in warning
    assert doc["streamed"] is True
    by_res = {p["resource"]: p for p in doc["plugins"] if p["state"] == "ok"}
    foo = by_res[FOO]
    assert foo["devices"] == 4
    assert foo["health"] == {"Healthy": 3, "Unhealthy": 1}
    assert foo["unhealthy"] == ["foo-3"]
    assert foo["numa"] == {"0": 2, "1": 2}
    assert by_res[BAR]["numa"] == {"none": 3}
    assert by_res[COUNTER]["devices"] == 4  # the SDK example plugin, a real process
    assert _codes(doc) == ["unhealthy-devices"]


async def test_table_output(node: Node, hanging: Path) -> None:
    rc, out, _ = await run_inspect(node.dp_dir)
    assert rc == 1
    lines = out.splitlines()
    [row] = [line for line in lines if line.startswith("example.com_foo.sock")]
    assert row.split() == ["example.com_foo.sock", FOO, "ok", "preferred", row.split()[-1]]
    [hang] = [line for line in lines if line.startswith("hang.sock")]
    assert hang.split()[:3] == ["hang.sock", "?", "no-answer"]
    assert any(line.startswith("team/train") and FOO in line for line in lines)
    assert any("CHECKPOINT  2 allocation(s), checksum ok" in line for line in lines)
    header = ["RESOURCE", "HEALTHY", "AT", "LAST", "WRITE", "ALLOCATED"]
    assert any(line.split() == header for line in lines)
    [alloc] = [line for line in lines if line.startswith(FOO) and "0:2 1:1" in line]
    assert alloc.split() == [FOO, "3", "0:2", "1:1", "2"]  # healthy, NUMA, in use
    hang_problem = "  error   hang.sock: accepts connections but GetDevicePluginOptions"
    assert any(line.startswith(hang_problem) for line in lines)


async def test_orphaned_checkpoint_entry(node: Node) -> None:
    path = node.dp_dir / "kubelet_internal_checkpoint"
    data = loads(path.read_bytes())
    ghost = CheckpointEntry("0000-gone", "worker", FOO, {0: ["foo-2"]}, b"")
    path.write_bytes(dumps(CheckpointData((*(data.entries or ()), ghost), data.registered)))
    rc, doc, _ = await inspect_json(node.dp_dir)
    assert rc == 1
    [orphan] = [f for f in doc["findings"] if f["code"] == "orphaned-allocation"]
    assert "foo-2" in orphan["message"]
    assert "0000-gone" in orphan["message"]
    assert doc["checkpoint"]["checksumOk"] is True


async def test_checksum_mismatch_is_reported_not_fatal(node: Node) -> None:
    path = node.dp_dir / "kubelet_internal_checkpoint"
    raw = path.read_bytes()
    good = loads(raw)
    tampered = raw.replace(b'"foo-', b'"fox-', 1)
    assert tampered != raw
    path.write_bytes(tampered)
    rc, doc, err = await inspect_json(node.dp_dir)
    assert rc == 1, err
    assert "checksum-mismatch" in _codes(doc)
    cp = doc["checkpoint"]
    assert cp["checksumOk"] is False
    assert len(cp["entries"]) == len(good.entries or ())  # still decoded and shown


@pytest.fixture
async def clean_node(emu: Any, dp_dir: Path) -> AsyncIterator[Path]:
    """One registered plugin with two healthy devices, nothing else: its plugin dir."""
    from rawplugin import RawPlugin, devs

    p = await RawPlugin(dp_dir, FOO, devs(2)).start()
    try:
        await emu.wait_for_resource(FOO, allocatable=2)
        yield dp_dir
    finally:
        await p.stop()


async def test_clean_node_exits_0(clean_node: Path) -> None:
    rc, doc, err = await inspect_json(clean_node)
    assert (rc, doc["findings"], doc["inputErrors"], err) == (0, [], [], "")


async def test_relative_paths_are_dialled(clean_node: Path) -> None:
    """``--device-plugin-dir dp`` from the parent directory, as a user types it."""
    rc, out, err = await run_inspect(Path(clean_node.name), "-o", "json", cwd=clean_node.parent)
    doc = json.loads(out)
    assert (rc, doc["findings"], doc["inputErrors"], err) == (0, [], [], "")
    assert [(x["state"], x["resource"]) for x in doc["plugins"]] == [("ok", FOO)]
    assert len(doc["podResources"]["allocatable"][FOO]) == 2


async def test_missing_dir_is_one_line_exit_2(sock_dir: Path) -> None:
    rc, out, err = await run_inspect(sock_dir / "nope")
    assert rc == 2
    assert err.splitlines() == [f"error: device plugin dir {sock_dir / 'nope'} does not exist"]
    assert "Traceback" not in out + err
    assert "PLUGINS" in out  # what could be read is still shown
    assert f"no PodResources socket at {sock_dir / 'pod-resources' / 'kubelet.sock'}" in out


async def test_corrupt_checkpoint_shows_the_rest_exit_2(node: Node) -> None:
    (node.dp_dir / "kubelet_internal_checkpoint").write_bytes(b'{"Data": {"PodDeviceEntries": 7}')
    rc, doc, err = await inspect_json(node.dp_dir)
    assert rc == 2
    [line] = err.splitlines()
    assert line.startswith("error: corrupt checkpoint: ")
    assert "not valid JSON" in line
    assert {p["resource"] for p in doc["plugins"]} >= {FOO, BAR}
    assert doc["checkpoint"] is None


async def test_pod_resources_socket_that_is_not_a_socket(node: Node, sock_dir: Path) -> None:
    bogus = sock_dir / "file.sock"
    bogus.write_text("")
    rc, out, err = await run_inspect(node.dp_dir, pr_socket=bogus)
    assert rc == 2
    assert err.strip() == f"error: PodResources socket {bogus} is not a socket"
    assert "Traceback" not in out + err

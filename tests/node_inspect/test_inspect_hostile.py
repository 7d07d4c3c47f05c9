"""``inspect`` on a hostile or half-broken node: planted files, forged names, silent sockets."""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from grpc import aio

from kubedevice._api import pr, pr_grpc
from kubedevice.errors import CheckpointError
from kubedevice.inspect import inspect_node, read_checkpoint
from kubedevice.kubelet import Emulator
from kubedevice.kubelet.checkpoint import CheckpointData, CheckpointEntry, dumps
from node_inspect.helpers import FOO, inspect_json, run_inspect

from rawplugin import RawPlugin, devs  # isort: skip (on sys.path through helpers)


async def test_fifo_checkpoint_is_refused_within_the_timeouts(dp_dir: Path) -> None:
    dp_dir.mkdir(parents=True, exist_ok=True)
    os.mkfifo(dp_dir / "kubelet_internal_checkpoint")
    start = time.monotonic()
    rc, out, err = await run_inspect(dp_dir, "--timeout", "0.5")
    assert time.monotonic() - start < 20
    assert rc == 2
    cp = dp_dir / "kubelet_internal_checkpoint"
    assert err.splitlines() == [f"error: checkpoint {cp} is a FIFO, not a regular file; not read"]
    assert "Traceback" not in out


def test_symlinked_checkpoint_is_not_followed(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_bytes(dumps(CheckpointData((), {})))
    (tmp_path / "cp").symlink_to(target)
    with pytest.raises(OSError, match="a symbolic link, not a regular file"):
        read_checkpoint(tmp_path / "cp")


async def test_checkpoint_nested_100000_deep_is_one_line_exit_2(dp_dir: Path) -> None:
    dp_dir.mkdir(parents=True, exist_ok=True)
    (dp_dir / "kubelet_internal_checkpoint").write_text(
        '{"Data": ' + "[" * 100_000 + "]" * 100_000 + "}"
    )
    rc, out, err = await run_inspect(dp_dir, "--timeout", "0.5")
    assert rc == 2
    assert err.splitlines() == [
        "error: corrupt checkpoint: "
        f"{dp_dir / 'kubelet_internal_checkpoint'}: not a checkpoint (nested too deeply)"
    ]
    assert "Traceback" not in out


def test_pythons_own_hint_does_not_leak(tmp_path: Path) -> None:
    path = tmp_path / "cp"
    path.write_text('{"Data": {}, "Checksum": 1' + "0" * 5000 + "}")
    with pytest.raises(CheckpointError) as info:
        read_checkpoint(path)
    assert "set_int_max_str_digits" not in str(info.value)


async def test_a_socket_name_with_a_newline_cannot_forge_a_line(dp_dir: Path) -> None:
    dp_dir.mkdir(parents=True, exist_ok=True)
    name = "x.sock\n  error   forged.sock: \x1b[2Kall good"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(dp_dir / name))
    s.close()  # a stale socket: its name is printed in PLUGINS and in PROBLEMS
    rc, out, _ = await run_inspect(dp_dir, "--timeout", "0.5")
    assert rc == 1
    lines = out.splitlines()
    assert not any(
        "forged" in line and not line.startswith(("x.sock", "  error   x.sock")) for line in lines
    )
    assert not any("\x1b" in line for line in lines)
    escaped = "x.sock\\n  error   forged.sock: \\x1b[2Kall good"
    assert any(line.startswith(escaped) for line in lines)
    assert any(line.startswith(f"  error   {escaped}: nothing is listening") for line in lines)


async def test_missing_pod_resources_is_a_finding_and_the_checkpoint_names_the_pods(
    sock_dir: Path, dp_dir: Path
) -> None:
    dp_dir.mkdir(parents=True, exist_ok=True)
    entries = (
        CheckpointEntry("uid-train", "main", FOO, {0: ["foo-0", "foo-1"]}, b""),
        CheckpointEntry("uid-serve", "app", FOO, {-1: ["foo-2"]}, b""),
    )
    registered = {FOO: ["foo-0", "foo-1", "foo-2", "foo-3"]}
    (dp_dir / "kubelet_internal_checkpoint").write_bytes(dumps(CheckpointData(entries, registered)))
    p = RawPlugin(dp_dir, FOO, devs(4, prefix="foo-"))
    await p.serve()  # a live plugin socket, no kubelet at all
    try:
        rc, out, err = await run_inspect(dp_dir, "--timeout", "0.5")
        rc_json, doc, _ = await inspect_json(dp_dir, "--timeout", "0.5")
    finally:
        await p.stop()
    assert (rc, rc_json, err) == (1, 1, "")
    assert sorted(f["code"] for f in doc["findings"]) == ["no-kubelet-socket", "no-pod-resources"]
    pr_sock = sock_dir / "pod-resources" / "kubelet.sock"
    assert f"  warning no PodResources socket at {pr_sock}" in out
    lines = out.splitlines()
    assert any(line.split() == [FOO, "4", "3"] for line in lines)  # healthy at last write
    assert any(line.split() == ["uid-serve", "app", FOO, "foo-2"] for line in lines)
    assert any(line.split() == ["uid-train", "main", FOO, "foo-0,foo-1"] for line in lines)
    assert any(line.split() == ["POD", "UID", "CONTAINER", "RESOURCE", "DEVICES"] for line in lines)


class _SlowAllocatable(pr_grpc.PodResourcesListerServicer):
    """List answers at once; GetAllocatableResources never does."""

    async def List(self, request: Any, context: Any) -> pr.ListPodResourcesResponse:
        return pr.ListPodResourcesResponse()

    async def GetAllocatableResources(self, request: Any, context: Any) -> Any:
        await asyncio.Event().wait()


@pytest.fixture
async def slow_allocatable(sock_dir: Path) -> AsyncIterator[Path]:
    path = sock_dir / "pr-slow.sock"
    server = aio.server()
    pr_grpc.add_PodResourcesListerServicer_to_server(_SlowAllocatable(), server)
    server.add_insecure_port(f"unix://{path}")
    await server.start()
    try:
        yield path
    finally:
        await server.stop(None)


async def test_a_hanging_call_reports_the_configured_timeout(
    dp_dir: Path, slow_allocatable: Path
) -> None:
    dp_dir.mkdir(parents=True, exist_ok=True)
    report = await inspect_node(dp_dir, slow_allocatable, timeout=0.5)
    assert report.pod_resources is not None
    assert report.pod_resources.list_error is None
    assert report.pod_resources.allocatable_error == (
        "GetAllocatableResources: no answer within 0.5 s"
    )


async def test_a_socket_that_never_answers_says_the_timeout_once(
    dp_dir: Path, sock_dir: Path
) -> None:
    path = sock_dir / "pr.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    s.listen(8)
    try:
        start = time.monotonic()
        report = await inspect_node(dp_dir, path, timeout=0.5)
        assert time.monotonic() - start < 2.5
    finally:
        s.close()
    assert report.input_errors == ["PodResources List: no answer within 0.5 s"]
    assert [f.message for f in report.findings if "GetAllocatable" in f.message] == [
        "PodResources GetAllocatableResources: not asked (List got no answer)"
    ]


async def test_dead_plugin_and_a_kubelet_with_no_healthy_device(
    emu: Emulator, dp_dir: Path
) -> None:
    p = await RawPlugin(dp_dir, FOO, devs(2)).start()
    await emu.wait_for_resource(FOO, allocatable=2)
    p.devices = devs(2, health="Unhealthy")
    p.push()
    await emu.wait_for_resource(FOO, allocatable=0)
    try:
        rc, doc, _ = await inspect_json(dp_dir)
    finally:
        await p.stop()
    assert rc == 1
    [f] = doc["findings"]
    assert f["code"] == "no-healthy-devices"
    assert FOO in f["message"]


async def test_a_stale_pod_resources_socket_is_a_finding(dp_dir: Path, sock_dir: Path) -> None:
    dp_dir.mkdir(parents=True, exist_ok=True)
    path = sock_dir / "pr-dead.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    s.close()  # the kubelet is gone, its socket file stays
    rc, doc, err = await inspect_json(dp_dir, "--pod-resources-socket", str(path))
    assert (rc, doc["inputErrors"], err) == (1, [], "")
    [f] = [f for f in doc["findings"] if f["code"] == "pod-resources-stale"]
    assert f["severity"] == "error"
    assert "nothing is listening" in f["message"]

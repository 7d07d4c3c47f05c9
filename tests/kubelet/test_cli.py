"""The CLI as real processes against a running ``kubedevice kubelet`` process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubelet_helpers import pod_manifest

R = "example.com/foo"
KUBEDEVICE = [str(Path(sys.executable).parent / "kubedevice")]


def _env(dp_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["DP_DEVICE_PLUGIN_DIR"] = str(dp_dir)
    env["GRPC_VERBOSITY"] = "ERROR"
    return env


_DRAINS: dict[int, threading.Thread] = {}


def _start_kubelet(dp_dir: Path) -> subprocess.Popen[str]:
    """Start ``kubedevice kubelet``; return once it says it serves (stderr drained after)."""
    proc = subprocess.Popen(
        [*KUBEDEVICE, "kubelet", "--grace-period", "600"],
        env=_env(dp_dir),
        stderr=subprocess.PIPE,
        text=True,
    )
    ready = threading.Event()

    def drain() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            if "kubelet emulator serving" in line:
                ready.set()
        ready.set()

    thread = threading.Thread(target=drain, daemon=True)
    thread.start()
    _DRAINS[proc.pid] = thread
    assert ready.wait(30)
    assert proc.poll() is None, "emulator exited early"
    return proc


def _stop(proc: subprocess.Popen[str], sig: int = signal.SIGTERM) -> int:
    proc.send_signal(sig)
    rc = proc.wait(timeout=20)
    thread = _DRAINS.pop(proc.pid, None)
    if thread is not None:
        thread.join(10)
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()
    return rc


@pytest.fixture
def kubelet_proc(dp_dir: Path) -> Iterator[subprocess.Popen[str]]:
    proc = _start_kubelet(dp_dir)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            _stop(proc)


@pytest.fixture
def plugin_proc(dp_dir: Path, raw_plugin_path: Path) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [sys.executable, str(raw_plugin_path), "--dir", str(dp_dir), "--count", "3"],
        env=_env(dp_dir),
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "READY"
    try:
        yield proc
    finally:
        _stop(proc)


def kd(dp_dir: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*KUBEDEVICE, *args],
        env=_env(dp_dir),
        capture_output=True,
        text=True,
        input=stdin,
        timeout=60,
    )


def _write(path: Path, *docs: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump_all(docs))
    return path


def test_cli_end_to_end(
    dp_dir: Path, sock_dir: Path, kubelet_proc: subprocess.Popen[str], plugin_proc: Any
) -> None:
    r = kd(dp_dir, "node", "-o", "json", "--wait-for", R, "--allocatable", "3")
    assert r.returncode == 0, r.stderr
    node = json.loads(r.stdout)
    assert node["resources"][R]["capacity"] == 3
    # the control socket is not in the device-plugin dir
    assert sorted(p.name for p in dp_dir.iterdir()) == [
        "example.com_foo.sock",
        "kubelet.sock",
        "kubelet_internal_checkpoint",
    ]
    assert (sock_dir / "kubedevice-emulator" / "dp.sock").is_socket()
    assert node["resources"][R]["allocatable"] == 3

    f = _write(sock_dir / "pods.yaml", pod_manifest("a", {R: 1}), pod_manifest("b", {R: 1}))
    r = kd(dp_dir, "pod", "apply", "-f", str(f))
    assert r.returncode == 0, r.stderr
    assert "pod/a admitted" in r.stdout
    assert "pod/b admitted" in r.stdout

    r = kd(dp_dir, "pod", "get", "a", "-o", "json")
    assert json.loads(r.stdout)["containers"][0]["devices"] == {R: ["d0"]}
    r = kd(dp_dir, "pod", "get", "b")
    assert "DEVICES=d1" in r.stdout

    # rejection: reason + message, exit 3
    f2 = _write(sock_dir / "big.yaml", pod_manifest("big", {R: 2}))
    r = kd(dp_dir, "pod", "apply", "-f", str(f2))
    assert r.returncode == 3
    assert "UnexpectedAdmissionError" in r.stderr
    assert "Requested: 2, Available: 1" in r.stderr

    # bad manifests: exit 2 with a clear error
    bad = sock_dir / "bad.yaml"
    bad.write_text("kind: Pod\nmetadata: {name: [unclosed\n")
    r = kd(dp_dir, "pod", "apply", "-f", str(bad))
    assert r.returncode == 2
    assert r.stderr.startswith("error: cannot parse manifest")
    invalid = _write(sock_dir / "inv.yaml", pod_manifest("inv", {R: "500m"}))
    r = kd(dp_dir, "pod", "apply", "-f", str(invalid))
    assert r.returncode == 2
    assert "must be an integer" in r.stderr

    # a file with an invalid object admits nothing (validated before anything is sent)
    mixed = sock_dir / "mixed.yaml"
    mixed.write_text(
        yaml.safe_dump_all([pod_manifest("m1", {}), {"apiVersion": "v1", "kind": "Service"}])
    )
    r = kd(dp_dir, "pod", "apply", "-f", str(mixed))
    assert r.returncode == 2
    assert 'only kind "Pod" is supported' in r.stderr
    # admitted pods are reported even when a later one is rejected
    partial = _write(sock_dir / "partial.yaml", pod_manifest("m2", {}), pod_manifest("m3", {R: 2}))
    r = kd(dp_dir, "pod", "apply", "-f", str(partial))
    assert r.returncode == 3
    assert "pod/m2 admitted" in r.stdout
    assert "Requested: 2, Available: 1" in r.stderr
    r = kd(
        dp_dir, "pod", "apply", "-f", "-", "-o", "json", stdin=json.dumps(pod_manifest("m4", {}))
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["name"] == "m4"
    r = kd(dp_dir, "pod", "list", "-o", "json")
    assert [p["name"] for p in json.loads(r.stdout)] == ["a", "b", "m2", "m4"]
    for name in ("m2", "m4"):
        assert kd(dp_dir, "pod", "delete", name).returncode == 0

    r = kd(dp_dir, "pod", "delete", "a")
    assert r.returncode == 0, r.stderr
    r = kd(dp_dir, "pod", "delete", "a")
    assert r.returncode == 1
    r = kd(dp_dir, "pod", "list", "-o", "json")
    assert [p["name"] for p in json.loads(r.stdout)] == ["b"]

    r = kd(dp_dir, "kubelet", "restart")
    assert r.returncode == 0, r.stderr
    r = kd(dp_dir, "node")
    assert r.returncode == 0
    assert R in r.stdout
    assert "stopped" in r.stdout  # plugin socket wiped; the test plugin does not re-register

    assert _stop(kubelet_proc) == 0


def _plugin(dp_dir: Path, raw_plugin_path: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, str(raw_plugin_path), "--dir", str(dp_dir), "--count", "3"],
        env=_env(dp_dir),
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "READY"
    return proc


def test_pods_survive_process_restart(dp_dir: Path, sock_dir: Path, raw_plugin_path: Path) -> None:
    proc = _start_kubelet(dp_dir)
    plug = _plugin(dp_dir, raw_plugin_path)
    try:
        r = kd(dp_dir, "node", "--wait-for", R, "--allocatable", "3")
        assert r.returncode == 0, r.stderr
        f = _write(sock_dir / "p.yaml", pod_manifest("p", {R: 2}))
        assert kd(dp_dir, "pod", "apply", "-f", str(f)).returncode == 0
        assert _stop(proc, signal.SIGINT) == 0  # Ctrl-C stops it cleanly too
        proc = _start_kubelet(dp_dir)
        r = kd(dp_dir, "pod", "list", "-o", "json")
        [pod] = json.loads(r.stdout)
        assert pod["containers"][0]["devices"] == {R: ["d0", "d1"]}
        node = json.loads(kd(dp_dir, "node", "-o", "json").stdout)["resources"][R]
        assert (node["allocatable"], node["allocated"], node["connected"]) == (0, 2, False)
    finally:
        _stop(plug)
        if proc.poll() is None:
            _stop(proc)


def test_no_emulator_running(dp_dir: Path) -> None:
    r = kd(dp_dir, "node")
    assert r.returncode == 1
    assert "cannot reach the emulator" in r.stderr

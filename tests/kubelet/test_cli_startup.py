"""`kubedevice node --wait-for` right after `kubedevice kubelet &` waits for the emulator too."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
KUBEDEVICE = str(Path(sys.executable).with_name("kubedevice"))


def test_node_wait_for_tolerates_an_emulator_still_starting(sock_dir: Path) -> None:
    env = {**os.environ, "DP_DEVICE_PLUGIN_DIR": str(sock_dir / "dp")}
    # the waiting client first, then the emulator, then the plugin: no wait in between
    wait = ["--wait-for", "example.com/counter", "--allocatable", "4", "--timeout", "30"]
    node = subprocess.Popen(
        [KUBEDEVICE, "node", *wait, "-o", "json"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert node.stderr is not None
    first = node.stderr.readline()  # the client is waiting before the emulator exists
    assert "waiting for the emulator at" in first, first
    kubelet = subprocess.Popen(
        [KUBEDEVICE, "kubelet"], env=env, stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL
    )
    plugin = subprocess.Popen(
        [sys.executable, str(ROOT / "examples/minimal.py")],
        env=env,
        stderr=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
    )
    try:
        out, err = node.communicate(timeout=60)
        assert node.returncode == 0, err
        status = json.loads(out)["resources"]["example.com/counter"]
        assert (status["capacity"], status["allocatable"]) == (4, 4)
    finally:
        node.kill()
        for proc in (plugin, kubelet):
            proc.send_signal(signal.SIGTERM)
        assert plugin.wait(timeout=30) == 0
        assert kubelet.wait(timeout=30) == 0


def test_node_without_wait_fails_fast_when_no_emulator(sock_dir: Path) -> None:
    env = {**os.environ, "DP_DEVICE_PLUGIN_DIR": str(sock_dir / "dp")}
    node = subprocess.run(
        [KUBEDEVICE, "node"], env=env, capture_output=True, text=True, timeout=30, check=False
    )
    assert node.returncode == 1
    assert "cannot reach the emulator at" in node.stderr


def test_serving_line_printed_once_and_first(sock_dir: Path) -> None:
    env = {**os.environ, "DP_DEVICE_PLUGIN_DIR": str(sock_dir / "dp")}
    kubelet = subprocess.Popen(
        [KUBEDEVICE, "--log-level", "debug", "kubelet"],
        env=env,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    assert kubelet.stderr is not None
    lines = []
    for line in kubelet.stderr:
        lines.append(line)
        if "serving" in line:
            break
    kubelet.send_signal(signal.SIGTERM)
    rest = kubelet.stderr.read()
    kubelet.stderr.close()
    assert kubelet.wait(timeout=30) == 0
    every = [*lines, *rest.splitlines()]
    assert sum("serving" in x for x in every) == 1, every
    assert not any("WARNING" in x or "warning:" in x for x in every), every

"""Planted files at the emulator's state paths never block it; foreign allocations are named.

A FIFO at the checkpoint or the pod journal used to hang the emulator in ``open()`` before it
served ``kubelet.sock`` (and, blocked in a system call, it ignored SIGTERM). These tests run
the real ``kubedevice kubelet`` process, so that a hang on the old code is a bounded failure
here, not a hung test run.
"""

from __future__ import annotations

import logging
import os
import signal
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubelet_helpers import PluginFactory, pod_manifest
from rawplugin import devs

from kubedevice.kubelet import Emulator
from kubedevice.kubelet.checkpoint import CheckpointData, CheckpointEntry, dumps
from kubedevice.kubelet.control import state_dir

KUBEDEVICE = str(Path(sys.executable).with_name("kubedevice"))
R = "example.com/foo"


class EmulatorProcess:
    """``kubedevice kubelet`` on ``dp_dir``; its stderr lines are collected on a thread."""

    def __init__(self, dp_dir: Path) -> None:
        env = {**os.environ, "DP_DEVICE_PLUGIN_DIR": str(dp_dir)}
        self.proc = subprocess.Popen(
            [KUBEDEVICE, "kubelet"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self.serving = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))
            if "serving" in line:
                self.serving.set()

    def stop(self) -> int:
        """SIGTERM, then its exit status (killed, and the test failed, after 20 s)."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            pytest.fail("the emulator ignored SIGTERM")
        finally:
            self._reader.join(timeout=5)


@pytest.fixture
def emulator_process(dp_dir: Path) -> Iterator[list[EmulatorProcess]]:
    made: list[EmulatorProcess] = []
    yield made
    for e in made:
        if e.proc.poll() is None:
            e.proc.kill()
            e.proc.wait()
        e._reader.join(timeout=5)
        if e.proc.stderr is not None:
            e.proc.stderr.close()


def _start(dp_dir: Path, made: list[EmulatorProcess]) -> EmulatorProcess:
    e = EmulatorProcess(dp_dir)
    made.append(e)
    if not e.serving.wait(30):
        pytest.fail(f"the emulator never served kubelet.sock: {e.lines}")
    assert stat.S_ISSOCK(os.lstat(dp_dir / "kubelet.sock").st_mode)
    return e


def test_fifo_checkpoint_is_set_aside_and_the_emulator_serves(
    dp_dir: Path, emulator_process: list[EmulatorProcess]
) -> None:
    dp_dir.mkdir(parents=True, exist_ok=True)
    os.mkfifo(dp_dir / "kubelet_internal_checkpoint")
    e = _start(dp_dir, emulator_process)
    assert e.stop() == 0
    said = [x for x in e.lines if "FIFO" in x]  # the log line, and the CLI's warning
    assert said, e.lines
    assert all("checkpoint is a FIFO, not a regular file" in x for x in said), said
    assert all("moved aside" in x for x in said), said
    [aside] = dp_dir.glob("kubelet_internal_checkpoint.corrupt-*")
    assert stat.S_ISFIFO(os.lstat(aside).st_mode)
    assert stat.S_ISREG(os.lstat(dp_dir / "kubelet_internal_checkpoint").st_mode)


def test_fifo_pod_journal_is_set_aside_and_the_emulator_serves(
    dp_dir: Path, emulator_process: list[EmulatorProcess]
) -> None:
    journal = state_dir(dp_dir) / f"{dp_dir.name}.pods.jsonl"
    journal.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(journal)
    e = _start(dp_dir, emulator_process)
    assert e.stop() == 0
    said = [x for x in e.lines if "pod journal" in x]
    assert len(said) == 1, e.lines
    assert "a FIFO, not a regular file" in said[0]
    assert "moved aside" in said[0]
    [aside] = journal.parent.glob(f"{journal.name}.corrupt-*")
    assert stat.S_ISFIFO(os.lstat(aside).st_mode)


def test_fifo_at_the_checkpoint_temp_file_does_not_block_a_write(
    dp_dir: Path, emulator_process: list[EmulatorProcess]
) -> None:
    dp_dir.mkdir(parents=True, exist_ok=True)
    os.mkfifo(dp_dir / ".kubelet_internal_checkpoint.tmp")
    e = _start(dp_dir, emulator_process)  # start-up writes a fresh checkpoint through it
    assert e.stop() == 0
    assert stat.S_ISREG(os.lstat(dp_dir / "kubelet_internal_checkpoint").st_mode)


async def test_fifo_planted_at_the_journal_while_running_is_refused(
    dp_dir: Path, plugin: PluginFactory, caplog: pytest.LogCaptureFixture
) -> None:
    journal = state_dir(dp_dir) / f"{dp_dir.name}.pods.jsonl"
    async with Emulator(dp_dir, dial_timeout_s=2.0) as emu:
        await plugin(R, devs(2))
        await emu.wait_for_resource(R, allocatable=2)
        journal.parent.mkdir(parents=True, exist_ok=True)
        journal.unlink(missing_ok=True)
        os.mkfifo(journal)
        # old code: open(O_WRONLY) on a FIFO without a reader blocks the event loop here;
        # a reader thread unblocks it after 10 s so that the failure is bounded
        fired: list[bool] = []

        def release() -> None:
            fired.append(True)
            os.close(os.open(journal, os.O_RDONLY | os.O_NONBLOCK))

        unblock = threading.Timer(10, release)
        unblock.start()
        try:
            caplog.set_level(logging.ERROR)
            await emu.apply_pod(pod_manifest("p", {R: 1}))
        finally:
            unblock.cancel()
        assert fired == [], "the journal write blocked on the FIFO"
        errors = [r.getMessage() for r in caplog.records if "pod journal" in r.getMessage()]
        assert any("a FIFO, not a regular file" in m for m in errors), errors
        assert [p.name for p in emu.pods()] == ["p"]


async def test_deeply_nested_checkpoint_is_one_line(dp_dir: Path) -> None:
    dp_dir.mkdir(parents=True, exist_ok=True)
    (dp_dir / "kubelet_internal_checkpoint").write_text("[" * 100_000 + "]" * 100_000)
    async with Emulator(dp_dir, control_socket=False) as emu:
        [error] = emu.checkpoint_errors
        assert "nested too deeply" in error
        assert "\n" not in error


async def test_allocations_of_a_real_kubelets_checkpoint_are_named_when_released(
    dp_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A real kubelet's checkpoint holds pods the emulator never saw: each release is logged."""
    dp_dir.mkdir(parents=True, exist_ok=True)
    entries = (
        CheckpointEntry("uid-train", "main", R, {0: ["foo-0", "foo-1"]}, b"\n\x00"),
        CheckpointEntry("uid-train", "side", "example.com/bar", {-1: ["bar-3"]}, b""),
        CheckpointEntry("uid-serve", "app", R, {1: ["foo-2"]}, b""),
    )
    (dp_dir / "kubelet_internal_checkpoint").write_bytes(
        dumps(CheckpointData(entries, {R: ["foo-0", "foo-1", "foo-2"]}))
    )
    caplog.set_level(logging.WARNING)
    async with Emulator(dp_dir, dial_timeout_s=2.0) as emu:  # with a pod journal (none yet)
        assert emu.node().resources.get(R) is None or emu.node().resources[R].allocated == 0
    released = [r.getMessage() for r in caplog.records if "releasing" in r.getMessage()]
    assert sorted(released) == sorted(
        [
            "releasing the checkpoint's allocation of pod UID uid-train container main: "
            f"{R} foo-0,foo-1 (not in the pod journal)",
            "releasing the checkpoint's allocation of pod UID uid-train container side: "
            "example.com/bar bar-3 (not in the pod journal)",
            "releasing the checkpoint's allocation of pod UID uid-serve container app: "
            f"{R} foo-2 (not in the pod journal)",
        ]
    )


async def test_allocations_released_at_admission_without_a_journal_are_named(
    dp_dir: Path, plugin: PluginFactory, caplog: pytest.LogCaptureFixture
) -> None:
    dp_dir.mkdir(parents=True, exist_ok=True)
    entries = (CheckpointEntry("uid-old", "main", R, {-1: ["d1"]}, b""),)
    (dp_dir / "kubelet_internal_checkpoint").write_bytes(dumps(CheckpointData(entries, {R: []})))
    caplog.set_level(logging.WARNING)
    async with Emulator(dp_dir, control_socket=False, dial_timeout_s=2.0) as emu:
        await plugin(R, devs(2))
        await emu.wait_for_resource(R, allocatable=2)
        await emu.apply_pod(pod_manifest("p", {R: 2}))
    released = [r.getMessage() for r in caplog.records if "releasing" in r.getMessage()]
    assert released == [
        "releasing the checkpoint's allocation of pod UID uid-old container main: "
        f"{R} d1 (its pod is not known to the emulator)"
    ]

"""The claim path of a driver running as a real process: killed with ``-9`` in the middle of
its prepare hook, and a checkpoint that cannot be saved (a full tmpfs) at unprepare."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from dra import clients
from dra.api import Api
from dra.conftest import create_claim, result
from dra.fakes import DRIVER, wait_for_path

pytestmark = pytest.mark.timeout(90)

TESTS = Path(__file__).resolve().parents[1]
NS = "default"


class Proc:
    """``proc_driver.py`` as a process; ``mount_tmpfs`` puts its plugin dir on a small tmpfs
    in a private mount namespace (reached from here through ``/proc/<pid>/root``)."""

    def __init__(self, kdir: Path, kubeconfig: Path, node: str, *, mount_tmpfs: bool = False):
        self.kdir = kdir
        self.state = kdir / "state"
        self.plugin_dir = kdir / "plugins" / DRIVER
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        argv = [
            sys.executable, "-m", "dra.proc_driver", "--state", str(self.state),
            "--node-name", node, "--kubeconfig", str(kubeconfig), "--kubelet-dir", str(kdir),
            "--cdi-dir", str(kdir / "cdi"), "--no-health",
        ]  # fmt: skip
        if mount_tmpfs:
            mount = 'mount -t tmpfs -o size=128k,mode=0700 tmpfs "$1" && shift && exec "$@"'
            argv = ["unshare", "-m", "--propagation", "private", "sh", "-c", mount, "sh",
                    str(self.plugin_dir), *argv]  # fmt: skip
        self.log = (kdir / f"driver-{len(list(kdir.glob('driver-*')))}.log").open("w")
        self.process = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, cwd=TESTS)
        self.root = Path(f"/proc/{self.process.pid}/root") if mount_tmpfs else Path("/")

    def path(self, path: Path) -> Path:
        """``path`` as this process sees it (inside its mount namespace)."""
        return self.root / path.relative_to("/")

    @property
    def dra_sock(self) -> Path:
        return self.path(self.plugin_dir / "dra.sock")

    async def ready(self) -> None:
        reg = self.kdir / "plugins_registry" / f"{DRIVER}-reg.sock"
        await wait_for_path(reg, timeout=30)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()


@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    made: list[Proc] = []
    yield made
    for proc in made:
        proc.stop()


def _claim(api: Api, name: str, node: str) -> tuple[str, str, str]:
    claim = create_claim(api, NS, name, results=[result("gpu", DRIVER, node, "gpu-0")])
    return (NS, name, claim["metadata"]["uid"])


async def test_a_driver_killed_in_its_prepare_hook_undoes_it_before_serving_again(
    kdir: Path, kubeconfig: Path, node_name: str, api: Api, procs: list[Proc]
) -> None:
    ref = _claim(api, f"killed-{node_name}", node_name)
    first = Proc(kdir, kubeconfig, node_name)
    procs.append(first)
    await first.ready()
    effect = kdir / "state" / "effects" / ref[2]
    call = asyncio.create_task(clients.prepare(first.dra_sock, [ref]))
    await wait_for_path(effect)  # the hook has done its work and now waits
    first.process.kill()
    first.process.wait()
    with pytest.raises(grpc.aio.AioRpcError):
        await call
    (kdir / "plugins_registry" / f"{DRIVER}-reg.sock").unlink()  # left by the killed one
    second = Proc(kdir, kubeconfig, node_name)
    procs.append(second)
    await second.ready()  # the registration socket comes last: after the undo
    assert not effect.exists(), "the interrupted prepare's side effect is still there"
    assert (kdir / "state" / "journal").read_text() == f"unprepare {ref[2]}\n"
    assert (await clients.unprepare(second.dra_sock, [ref])).claims[ref[2]].error == ""
    assert (kdir / "state" / "journal").read_text() == f"unprepare {ref[2]}\n"  # once


def _fill(directory: Path) -> Path:
    """Fill the file system of ``directory`` up with one file; the file."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise
    finally:
        os.close(fd)
    return filler


async def test_an_unprepare_whose_checkpoint_cannot_be_saved_fails_and_is_retried(
    kdir: Path, kubeconfig: Path, node_name: str, api: Api, procs: list[Proc]
) -> None:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1) for a tmpfs in a private mount namespace")
    ref = _claim(api, f"full-{node_name}", node_name)
    (kdir / "state").mkdir()
    (kdir / "state" / "go").touch()  # the prepare hook does not wait here
    proc = Proc(kdir, kubeconfig, node_name, mount_tmpfs=True)
    procs.append(proc)
    await proc.ready()
    assert (await clients.prepare(proc.dra_sock, [ref])).claims[ref[2]].error == ""
    # the checkpoint's twin would take the write in its own blocks: a save needing new space
    proc.path(proc.plugin_dir / ".checkpoint.json.twin").unlink()
    filler = _fill(proc.path(proc.plugin_dir))
    error = (await clients.unprepare(proc.dra_sock, [ref])).claims[ref[2]].error
    assert error  # the kubelet retries
    filler.unlink()  # space again: the retry unprepares it for real (the hook again)
    assert (await clients.unprepare(proc.dra_sock, [ref])).claims[ref[2]].error == ""
    journal = (kdir / "state" / "journal").read_text().splitlines()
    assert journal == [f"unprepare {ref[2]}"] * 2, "the retry was answered without the hook"
    assert error.startswith(f"cannot save the checkpoint without claim {NS}/{ref[1]} ({ref[2]})")
    assert "No space left on device" in error
    assert "it stays prepared until an unprepare succeeds" in error
    checkpoint = proc.path(proc.plugin_dir / "checkpoint.json").read_text()
    assert ref[2] not in checkpoint
    with contextlib.suppress(FileNotFoundError):
        assert not list(proc.path(proc.plugin_dir).glob(".checkpoint.json.*.tmp"))


async def test_a_driver_killed_right_after_an_answered_unprepare_does_not_bring_it_back(
    kdir: Path, kubeconfig: Path, node_name: str, api: Api, procs: list[Proc]
) -> None:
    # the checkpoint's fsync after an unprepare is off the call's path: the answer comes
    # once the file without the claim is in place, so a restart never resurrects it
    ref = _claim(api, f"gone-{node_name}", node_name)
    (kdir / "state").mkdir()
    (kdir / "state" / "go").touch()  # the prepare hook does not wait here
    first = Proc(kdir, kubeconfig, node_name)
    procs.append(first)
    await first.ready()
    assert (await clients.prepare(first.dra_sock, [ref])).claims[ref[2]].error == ""
    assert (await clients.unprepare(first.dra_sock, [ref])).claims[ref[2]].error == ""
    first.process.kill()  # at once: no clean stop, no later fsync of ours to rely on
    first.process.wait()
    (kdir / "plugins_registry" / f"{DRIVER}-reg.sock").unlink()  # left by the killed one
    second = Proc(kdir, kubeconfig, node_name)
    procs.append(second)
    await second.ready()
    assert ref[2] not in (first.plugin_dir / "checkpoint.json").read_text()
    # the device is free: another claim on it prepares (a resurrected entry would hold it)
    other = _claim(api, f"next-{node_name}", node_name)
    answer = (await clients.prepare(second.dra_sock, [other])).claims[other[2]]
    assert answer.error == ""
    assert [d.device_name for d in answer.devices] == ["gpu-0"]
    journal = (kdir / "state" / "journal").read_text().splitlines()
    assert journal == [f"unprepare {ref[2]}"]  # undone once, not again at the restart

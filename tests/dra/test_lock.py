"""One DRA driver instance per node: the lock file (real flock, real processes)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dra import clients
from dra.fakes import DRIVER, FakeDriver, gpus, server
from kubedevice.dra.state.lock import (
    CLAIMS_LOCK_FILE,
    LOCK_FILE,
    ClaimsLock,
    InstanceLock,
    PodLock,
    pod_lock_file,
)
from kubedevice.errors import InstanceLockError

pytestmark = pytest.mark.timeout(60)


def test_a_second_lock_is_refused_naming_the_file_and_the_holder(tmp_path: Path) -> None:
    path = tmp_path / "plugins" / "x" / LOCK_FILE
    first = InstanceLock(path, "DRA driver x")
    first.acquire()
    assert json.loads(path.read_text())["pid"] == os.getpid()
    # another process (flock locks belong to the open file: a child opens its own)
    child = subprocess.run(
        [sys.executable, "-c",
         "import sys; from pathlib import Path\n"
         "from kubedevice.dra.state.lock import InstanceLock\n"
         "try:\n"
         f"    InstanceLock(Path({str(path)!r}), 'DRA driver x').acquire()\n"
         "except Exception as exc:\n"
         "    print(exc); sys.exit(3)\n"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert child.returncode == 3, child.stderr
    assert str(path) in child.stdout
    assert f"pid {os.getpid()}" in child.stdout
    assert "another instance of DRA driver x" in child.stdout
    first.release()
    again = InstanceLock(path, "DRA driver x")
    again.acquire()  # free once released
    again.release()


def test_the_lock_goes_with_a_killed_holder(tmp_path: Path) -> None:
    path = tmp_path / LOCK_FILE
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import time; from pathlib import Path\n"
         "from kubedevice.dra.state.lock import InstanceLock\n"
         f"InstanceLock(Path({str(path)!r}), 'x').acquire(); print('held', flush=True)\n"
         "time.sleep(60)\n"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(InstanceLockError, match=f"pid {holder.pid}"):
            InstanceLock(path, "x").acquire()
    finally:
        holder.kill()
        holder.wait()
        if holder.stdout is not None:
            holder.stdout.close()
    lock = InstanceLock(path, "x")
    lock.acquire()
    lock.release()


async def test_a_second_server_refuses_and_the_first_keeps_serving(
    kdir: Path, kubeconfig: Path, node_name: str
) -> None:
    async with server(FakeDriver(gpus(1)), kdir, kubeconfig, node_name) as first:
        dra_sock = first.settings.dra_socket
        identity = dra_sock.stat().st_ino
        second = server(FakeDriver(gpus(2)), kdir, kubeconfig, node_name)
        with pytest.raises(InstanceLockError) as caught:
            await second.start()
        await second.stop()
        assert str(kdir / "plugins" / DRIVER / LOCK_FILE) in str(caught.value)
        # the first's sockets are untouched and it still answers
        assert dra_sock.stat().st_ino == identity
        info = await asyncio.wait_for(clients.get_info(first.settings.registration_socket), 10)
        assert info.endpoint == str(dra_sock)


async def test_the_claims_lock_waits_for_another_process_and_a_cancelled_wait_lets_it_go(
    tmp_path: Path,
) -> None:
    """Another process holds claims.lock: a call waits (the event loop stays free); one
    cancelled while waiting leaves nothing held once it would have got it; calls of one
    process share it, and on_taken runs once per take."""
    path = tmp_path / CLAIMS_LOCK_FILE
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import fcntl, os, sys\n"
         f"fd = os.open({str(path)!r}, os.O_RDWR | os.O_CREAT)\n"
         "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True)\n"
         "sys.stdin.readline()\n"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    lock = ClaimsLock(path)
    taken: list[int] = []

    async def on_taken() -> None:
        taken.append(1)

    try:
        assert holder.stdout is not None
        assert holder.stdin is not None
        assert holder.stdout.readline().strip() == "held"

        async def call() -> None:
            async with lock.hold(on_taken):
                pass

        waiting = asyncio.ensure_future(call())
        done, _ = await asyncio.wait({waiting}, timeout=0.3)
        assert not done  # held by the other process; the loop still runs this test
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        assert lock.waits == 1
        holder.stdin.write("\n")  # the other process lets go
        holder.stdin.flush()
        assert holder.wait(10) == 0
        # the cancelled wait's thread got the lock and let it go: it is free
        async with lock.hold(on_taken), lock.hold(on_taken):  # shared within the process
            assert taken == [1]
        async with lock.hold(on_taken):
            assert taken == [1, 1]
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
        for stream in (holder.stdin, holder.stdout):
            if stream is not None:
                stream.close()


@pytest.mark.parametrize("name", [LOCK_FILE, pod_lock_file("u1"), CLAIMS_LOCK_FILE])
async def test_a_symlink_planted_as_a_lock_file_is_refused_never_written_through(
    tmp_path: Path, name: str
) -> None:
    """A root driver writes who holds the lock into the file: a symlink in its place (to
    /etc/shadow, say) is never followed, and the line names the file."""
    target = tmp_path / "precious"
    target.write_text("keep me\n")
    path = tmp_path / "plugins" / "x" / name
    path.parent.mkdir(parents=True)
    path.symlink_to(target)
    if name != CLAIMS_LOCK_FILE:
        lock = InstanceLock(path, "x") if name == LOCK_FILE else PodLock(path, "x", "u1")
        with pytest.raises(InstanceLockError) as caught:
            lock.acquire()
        assert str(caught.value) == (
            f"the lock file {path} is a symbolic link, not a regular file; "
            "refusing to use it (remove it)"
        )
    else:
        with pytest.raises(OSError, match="is a symbolic link, not a regular file"):
            async with ClaimsLock(path).hold():
                pass
    assert target.read_text() == "keep me\n"
    assert path.is_symlink()


async def test_a_server_refuses_a_planted_claims_lock_symlink_in_one_line(
    kdir: Path, kubeconfig: Path, node_name: str
) -> None:
    target = kdir / "precious"
    target.write_text("keep me\n")
    plugin_dir = kdir / "plugins" / DRIVER
    plugin_dir.mkdir(parents=True)
    (plugin_dir / CLAIMS_LOCK_FILE).symlink_to(target)
    second = server(FakeDriver(gpus(1)), kdir, kubeconfig, node_name)
    with pytest.raises(InstanceLockError) as caught:
        await second.start()
    await second.stop()
    assert str(caught.value) == (
        f"the lock file {plugin_dir / CLAIMS_LOCK_FILE} is a symbolic link, not a regular "
        "file; refusing to use it (remove it)"
    )
    assert target.read_text() == "keep me\n"
    assert not (plugin_dir / "dra.sock").exists()  # nothing served


def test_a_pod_uid_lock_is_held_by_one_process_and_its_file_goes_with_it(tmp_path: Path) -> None:
    path = tmp_path / pod_lock_file("u1")
    first = PodLock(path, "DRA driver x", "u1")
    first.acquire()
    child = subprocess.run(
        [sys.executable, "-c",
         "import sys; from pathlib import Path\n"
         "from kubedevice.dra.state.lock import PodLock\n"
         "try:\n"
         f"    PodLock(Path({str(path)!r}), 'DRA driver x', 'u1').acquire()\n"
         "except Exception as exc:\n"
         "    print(exc); sys.exit(3)\n"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert child.returncode == 3, child.stderr
    assert "another instance of DRA driver x with pod UID u1" in child.stdout
    assert f"{path} (pid {os.getpid()}" in child.stdout
    refused = PodLock(path, "DRA driver x", "u1")
    with pytest.raises(InstanceLockError):
        refused.acquire()
    refused.release()  # never held: the holder's file stays
    assert path.exists()
    first.release()
    assert not path.exists()
    again = PodLock(path, "DRA driver x", "u1")
    again.acquire()
    again.release()


@pytest.mark.parametrize("kind", ["a FIFO", "a directory", "a symbolic link"])
async def test_a_claims_lock_replaced_while_serving_is_each_claims_error_in_one_line(
    kdir: Path, kubeconfig: Path, node_name: str, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Before: the call failed INTERNAL ('NotRegularFileError: [Errno 22] ...') with a
    traceback logged; now each claim's answer is the lock file's refusal, one line."""
    uid = "0c0c0c0c-1111-4222-8333-555555555555"
    async with server(FakeDriver(gpus(1)), kdir, kubeconfig, node_name) as srv:
        lock = srv.settings.claims_lock
        lock.unlink()
        if kind == "a FIFO":
            os.mkfifo(lock)
        elif kind == "a directory":
            lock.mkdir()
        else:
            lock.symlink_to(kdir / "elsewhere")
        wanted = (
            f"the lock file {lock} is {kind}, not a regular file; refusing to use it (remove it)"
        )
        sock = srv.settings.dra_socket
        prepared = await clients.prepare(sock, [("default", "c", uid)], timeout=5)
        assert prepared.claims[uid].error == wanted
        unprepared = await clients.unprepare(sock, [("default", "c", uid)], timeout=5)
        assert unprepared.claims[uid].error == wanted
        assert not any(r.exc_info for r in caplog.records)
        assert not (kdir / "elsewhere").exists()

"""Moving a process into a cgroup of its own on the host (``kubedevice.nvidia.hostcgroup``),
on this machine's real cgroup file systems, and an MPS control daemon that so outlives the
"container" that started it: every process of that container's cgroup killed, as the
runtime does when a container stops (``runc kill --all``).

Needs root and a writable ``/sys/fs/cgroup``; skipped otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubedevice.nvidia import hostcgroup
from kubedevice.nvidia.fake.nvml import FakeNvml
from kubedevice.nvidia.hostcgroup import HostCgroupError
from kubedevice.nvidia.mps import CGROUP, MpsDaemons

from .conftest import alive

ROOT = Path("/sys/fs/cgroup")
UUID = "GPU-5e1f0c2a-0000-4000-8000-000000000001"


def _control_command() -> list[str]:
    """The fake NVML's MPS control daemon stand-in."""
    fake = FakeNvml.from_file("one-gpu-80gib")
    try:
        return fake.mps_control_command()
    finally:
        fake.close()


def _usable() -> str | None:
    if os.geteuid() != 0:
        return "needs root (it moves processes between the host's cgroups)"
    try:
        found = hostcgroup.hierarchies(ROOT)
    except HostCgroupError as exc:
        return str(exc)
    if not os.access(found[0], os.W_OK):
        return f"{found[0]} is not writable here"
    return None


needs_cgroups = pytest.mark.skipif(_usable() is not None, reason=f"cgroups: {_usable()}")


@pytest.fixture
def group() -> Iterator[str]:
    """A test cgroup (``kubedevice-test-<pid>``), emptied and removed afterwards."""
    name = f"kubedevice-test-{os.getpid()}"
    yield name
    for hierarchy in hostcgroup.hierarchies(ROOT):
        for procs in sorted((hierarchy / name).rglob("cgroup.procs"), reverse=True):
            for pid in procs.read_text().split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
        for sub in sorted((hierarchy / name).glob("**/"), key=lambda p: -len(p.parts)):
            with contextlib.suppress(OSError):
                sub.rmdir()


def _lines(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cgroup").read_text().splitlines()


@needs_cgroups
def test_a_process_is_moved_in_every_hierarchy_and_the_cgroups_removed(group: str) -> None:
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        inner = f"{group}/x"
        assert not hostcgroup.member(sleeper.pid, inner)
        hostcgroup.move(ROOT, inner, sleeper.pid)
        lines = _lines(sleeper.pid)
        # every hierarchy (the v1 cpuset one too: a new cpuset cgroup has no CPUs until
        # given its parent's, and takes no process before)
        assert all(line.endswith("/" + inner) for line in lines), lines
        assert hostcgroup.member(sleeper.pid, inner)
        hostcgroup.move(ROOT, inner, sleeper.pid)  # again: nothing changes, nothing fails
        left = hostcgroup.remove(ROOT, inner)  # it holds a process: left as it is
        assert len(left) == len(hostcgroup.hierarchies(ROOT)), left
        assert all(line.endswith(": Device or resource busy") for line in left), left
        assert all(line.endswith("/" + inner) for line in _lines(sleeper.pid))
    finally:
        sleeper.kill()
        sleeper.wait()
    assert hostcgroup.remove(ROOT, f"{group}/x") == []
    for hierarchy in hostcgroup.hierarchies(ROOT):
        assert not (hierarchy / group).exists(), hierarchy


def test_bad_group_names_and_roots_are_refused(tmp_path: Path) -> None:
    for bad in ("", "/abs", "a/../b", "..", "a//b", "a/.", "-x", "a b", "a\nb"):
        with pytest.raises(HostCgroupError, match="not a relative path of plain names"):
            hostcgroup.move(tmp_path, bad, os.getpid())
    with pytest.raises(HostCgroupError, match=f"{tmp_path} holds no cgroup hierarchy"):
        hostcgroup.move(tmp_path, "x", os.getpid())
    with pytest.raises(HostCgroupError, match="cannot read the host's cgroups"):
        hostcgroup.hierarchies(tmp_path / "missing")


@needs_cgroups
def test_links_out_of_the_root_are_not_followed(tmp_path: Path) -> None:
    """A root whose hierarchies are symbolic links (to the real ones) holds none."""
    for hierarchy in hostcgroup.hierarchies(ROOT):
        (tmp_path / hierarchy.name).symlink_to(hierarchy)
    with pytest.raises(HostCgroupError, match="holds no cgroup hierarchy"):
        hostcgroup.hierarchies(tmp_path)


_CONTAINER = """
import asyncio, sys
from pathlib import Path
from kubedevice.nvidia.mps import MpsDaemons

async def main() -> None:
    root, uuid, cgroups = sys.argv[1], sys.argv[2], sys.argv[3]
    command = sys.argv[4:]
    daemons = MpsDaemons(Path(root), command, cgroup_root=Path(cgroups) if cgroups else None)
    await daemons.hold(uuid, "claim-a")
    print(daemons.pid(uuid), flush=True)
    await daemons.close()
    sys.stdin.read()  # the container's process lives on until it is killed

asyncio.run(main())
"""


def _kill_container(group: str) -> None:
    """What the runtime does when a container stops: SIGKILL every process of its cgroup."""
    for hierarchy in hostcgroup.hierarchies(ROOT):
        procs = hierarchy / group / "cgroup.procs"
        for pid in procs.read_text().split() if procs.exists() else ():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)


def _start_in_container(group: str, root: Path, cgroups: str) -> tuple[subprocess.Popen[str], int]:
    command = _control_command()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen(
        [sys.executable, "-c", _CONTAINER, str(root), UUID, cgroups, *command],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    hostcgroup.move(ROOT, f"{group}/container", proc.pid)  # before it starts anything
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.strip().isdigit(), f"the container's driver printed {line!r}"
    return proc, int(line)


def _ends(pid: int, timeout: float) -> bool:
    """Whether ``pid`` ends (or is a zombie) within ``timeout`` (its pidfd turns readable)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        readable, _, _ = select.select([fd], [], [], timeout)
    finally:
        os.close(fd)
    return bool(readable) or not alive(pid)


@needs_cgroups
def test_an_mps_daemon_outlives_the_container_that_started_it(group: str, mps_root: Path) -> None:
    root = mps_root
    proc, pid = _start_in_container(group, root, str(ROOT))
    key = next(root.glob("*/gpu-uuid")).parent.name
    try:
        with proc:
            assert hostcgroup.member(pid, f"{CGROUP}/{key}"), _lines(pid)
            assert not hostcgroup.member(pid, f"{group}/container")
            _kill_container(f"{group}/container")
            assert proc.wait(timeout=10) == -signal.SIGKILL
        assert alive(pid), "the daemon went with the container"
    finally:
        # the next driver finds nobody holds it: stopped, its cgroups removed
        daemons = MpsDaemons(root, _control_command(), cgroup_root=ROOT)
        asyncio.run(daemons.adopt({}))
        assert daemons.pid(UUID) is None
    assert not alive(pid)
    for hierarchy in hostcgroup.hierarchies(ROOT):
        assert not (hierarchy / CGROUP / key).exists(), hierarchy


@needs_cgroups
def test_without_the_host_cgroups_the_daemon_ends_with_its_container(
    group: str, mps_root: Path
) -> None:
    """The control: a daemon left in the container's cgroup is killed with it."""
    proc, pid = _start_in_container(group, mps_root, "")
    with proc:
        assert hostcgroup.member(pid, f"{group}/container"), _lines(pid)
        _kill_container(f"{group}/container")
        proc.wait(timeout=10)
    assert _ends(pid, timeout=10), "the daemon outlived its container"


_JOIN = """
import sys
from pathlib import Path
from kubedevice.nvidia import hostcgroup

def view() -> str:
    return Path("/proc/thread-self/cgroup").read_text()

before, seen = view(), []
hostcgroup._in_namespace(sys.argv[1], lambda: seen.append(view()))
print(before + "--\\n" + seen[0] + "--\\n" + view(), end="")
"""


@needs_cgroups
@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs util-linux's unshare")
def test_a_thread_joins_the_hosts_cgroup_namespace_and_only_it(group: str) -> None:
    """As in a container on cgroup v2 with a cgroup namespace of its own: the move is made
    from a thread that joined the host's namespace (here: this test's), where the
    container's cgroup shows by its host path; the process's other threads keep their own."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    script = f'read go; exec unshare -C {sys.executable} -c "$0" "$1"'
    with subprocess.Popen(
        ["sh", "-c", script, _JOIN, f"/proc/{os.getpid()}/ns/cgroup"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
    ) as proc:  # fmt: skip
        hostcgroup.move(ROOT, f"{group}/container", proc.pid)  # then its namespace is made
        out, _ = proc.communicate("go\n", timeout=30)
    assert proc.returncode == 0, out
    before, joined, after = (part.splitlines() for part in out.split("--\n"))
    assert len(before) == len(joined) > 0, out
    assert all(line.endswith(":/") for line in before), before
    assert all(line.endswith(f"/{group}/container") for line in joined), joined
    assert after == before


@needs_cgroups
async def test_a_stopped_daemons_busy_cgroups_go_once_it_has(mps_root: Path) -> None:
    """Cgroups still busy at the stop (with the daemon's process not quite gone: one that
    is not the control program, here, so nothing asks it to quit) are removed once that
    process is, not left behind."""
    daemons = MpsDaemons(mps_root, _control_command(), cgroup_root=ROOT)
    group = daemons.cgroup(UUID)
    with subprocess.Popen(["sleep", "60"]) as lingering:
        hostcgroup.move(ROOT, group, lingering.pid)
        pipe = daemons.paths(UUID).pipe
        pipe.mkdir(parents=True)
        (pipe / "nvidia-cuda-mps-control.pid").write_text(f"{lingering.pid}\n")
        await daemons.release(UUID, "claim-a")  # the last holder: the daemon is stopped
        assert not pipe.exists()
        assert all((h / group).exists() for h in hostcgroup.hierarchies(ROOT))
        assert len(daemons._tasks) == 1
        lingering.kill()
        lingering.wait()
    await asyncio.wait_for(asyncio.gather(*daemons._tasks), timeout=30)
    assert not any((h / group).exists() for h in hostcgroup.hierarchies(ROOT))


@pytest.mark.parametrize("half", ["dra", "plugin"])
def test_a_host_cgroup_root_without_cgroups_is_refused_naming_the_flag(
    half: str, tmp_path: Path
) -> None:
    """The GPU DRA driver with --mps and the device plugin with sharing.mps: one line naming
    the flag, exit 2 (a real process of the CLI)."""
    empty = tmp_path / "cgroup"
    empty.mkdir()
    config = tmp_path / "config.yaml"
    config.write_text(
        "version: v1\nsharing:\n  mps:\n    resources:\n"
        "      - {name: nvidia.com/gpu, replicas: 4}\n"
    )
    common = ["--nvml", "fake:one-gpu-80gib", "--host-cgroup-root", str(empty)]
    if half == "dra":
        args = ["nvidia", "dra", *common, "--mps", "--node-name", "n1", "--kubelet-dir",
                str(tmp_path / "kubelet"), "--kubeconfig", str(tmp_path / "no")]  # fmt: skip
    else:
        (tmp_path / "dp").mkdir()
        args = ["nvidia", "run", *common, "--config", str(config),
                "--device-plugin-dir", str(tmp_path / "dp"), "--features-dir", ""]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    got = subprocess.run(
        [sys.executable, "-m", "kubedevice", *args],
        capture_output=True, text=True, env=env, timeout=60, check=False,
    )  # fmt: skip
    assert got.returncode == 2, got.stderr
    last = got.stderr.strip().splitlines()[-1]
    assert last == (
        f"error: flags.hostCgroupRoot (--host-cgroup-root): {empty} holds no cgroup hierarchy "
        "(no cgroup.procs there or in its directories): mount the host's /sys/fs/cgroup there"
    )

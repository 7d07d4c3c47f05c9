"""Moving a process into a cgroup of its own on the host, so it outlives this container.

When a container stops, the runtime stops every process in the container's cgroup (for a
pod with ``hostPID``, containerd's shim runs ``runc kill --all`` over it), and the kubelet
kills what is left in the pod's cgroup when it removes the pod. A process that must outlive
the container that started it (an MPS control daemon its GPU's clients still use) is moved
into ``<hierarchy>/<group>`` of every cgroup hierarchy of the host, outside the pod's.

``root`` is where the host's cgroup file systems are mounted as this process sees them:
``/sys/fs/cgroup`` on the host, a hostPath of it (``/host/sys/fs/cgroup``) in a container.
On cgroup v2 it is one hierarchy (``root/cgroup.procs``); on v1 every directory under it
that is a hierarchy (``cpu,cpuacct`` and its ``cpu``/``cpuacct`` links once), the
``unified`` one of a hybrid host included. Symbolic links are never followed.

The kernel lets a process move another only between cgroups its own cgroup namespace sees.
A container has the host's namespace on cgroup v1 and when privileged; an unprivileged one
on cgroup v2 has its own, and the move is done from a thread that joins the host's first
(``/proc/1/ns/cgroup``, with ``hostPID``), which needs ``CAP_SYS_ADMIN``. Where that is
not allowed, :func:`move` raises :class:`HostCgroupError` saying so.
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Final

from kubedevice.errors import KubeDeviceError

__all__ = ["HostCgroupError", "hierarchies", "member", "move", "remove"]

_PROCS: Final = "cgroup.procs"
_HOST_NAMESPACE: Final = "/proc/1/ns/cgroup"
_CLONE_NEWCGROUP: Final = 0x02000000
_PART: Final = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")


class HostCgroupError(KubeDeviceError):
    """A process could not be moved into its cgroup on the host."""


def hierarchies(root: Path) -> list[Path]:
    """The cgroup hierarchies mounted at ``root`` (v2: ``[root]``; v1: one per mount).

    Raises:
        HostCgroupError: None there.
    """
    if (root / _PROCS).is_file():
        return [root]
    found: list[Path] = []
    seen: set[int] = set()
    try:
        entries = sorted(root.iterdir())
    except OSError as exc:
        raise HostCgroupError(f"cannot read the host's cgroups at {root}: {exc.strerror}") from exc
    for entry in entries:
        if entry.is_symlink() or not (entry / _PROCS).is_file():
            continue
        dev = entry.stat().st_dev
        if dev not in seen:
            seen.add(dev)
            found.append(entry)
    if not found:
        raise HostCgroupError(
            f"{root} holds no cgroup hierarchy (no {_PROCS} there or in its directories): "
            "mount the host's /sys/fs/cgroup there"
        )
    return found


def move(root: Path, group: str, pid: int) -> None:
    """Move process ``pid`` (and so what it starts later) into ``<hierarchy>/<group>`` of
    every hierarchy at ``root``, making the cgroups that are missing.

    Raises:
        HostCgroupError: ``group`` is not a relative path of plain names, no hierarchy is
            at ``root``, or the kernel refused (the error names the file and why).
    """
    _check(group)
    found = hierarchies(root)
    if _private_namespace():
        _in_namespace(_HOST_NAMESPACE, lambda: _move(found, group, pid))
    else:
        _move(found, group, pid)


def remove(root: Path, group: str) -> list[str]:
    """Remove ``group``'s cgroups, deepest first, where they are empty; what is left, as
    ``<path>: <why>`` (best effort: one still holding a process stays)."""
    _check(group)
    try:
        found = hierarchies(root)
    except HostCgroupError:
        return []
    parts = group.split("/")
    left = []
    for hierarchy in found:
        for depth in range(len(parts), 0, -1):
            path = hierarchy / "/".join(parts[:depth])
            try:
                path.rmdir()
            except FileNotFoundError:
                continue
            except OSError as exc:
                if depth == len(parts):  # the group itself (its parents may hold others)
                    left.append(f"{path}: {exc.strerror}")
                break
    return left


def member(pid: int, group: str) -> bool:
    """Whether process ``pid`` is in ``group`` in any hierarchy (from ``/proc/<pid>/cgroup``)."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return False
    return any(line.rsplit(":", 1)[-1].endswith("/" + group) for line in lines)


def _check(group: str) -> None:
    if not all(_PART.match(part) for part in group.split("/")):
        raise HostCgroupError(f"cgroup {group!r}: not a relative path of plain names")


def _move(found: list[Path], group: str, pid: int) -> None:
    for hierarchy in found:
        target = hierarchy
        for part in group.split("/"):
            parent, target = target, target / part
            try:
                target.mkdir()
            except FileExistsError:
                pass
            except OSError as exc:
                raise HostCgroupError(f"cannot make cgroup {target}: {exc.strerror}") from exc
            _inherit_cpuset(parent, target)
        procs = target / _PROCS
        try:
            procs.write_text(f"{pid}\n")
        except OSError as exc:
            why = exc.strerror
            if exc.errno == errno.ENOENT:
                why = (
                    "outside this process's cgroup namespace (cgroup v2 in an unprivileged "
                    "container: the container needs CAP_SYS_ADMIN and hostPID)"
                )
            raise HostCgroupError(f"cannot move pid {pid} into {procs}: {why}") from exc


def _inherit_cpuset(parent: Path, child: Path) -> None:
    """A new v1 cpuset cgroup starts with no CPUs and no memory nodes, and takes no process
    until it has some: give it its parent's."""
    for name in ("cpuset.cpus", "cpuset.mems"):
        own = child / name
        try:
            if own.read_text().strip():
                continue
            own.write_text((parent / name).read_text())
        except FileNotFoundError:
            return
        except OSError as exc:
            raise HostCgroupError(f"cannot set {own}: {exc.strerror}") from exc


def _namespace(pid: str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/cgroup")
    except OSError:
        return None


def _private_namespace() -> bool:
    """Whether this process has a cgroup namespace of its own (``/proc/1`` is the host's
    init with ``hostPID``; one that cannot be read is taken as the same)."""
    host = _namespace("1")
    return host is not None and host != _namespace("self")


def _in_namespace(namespace: str, work: Callable[[], None]) -> None:
    """Run ``work`` in a thread of its own that first joins the cgroup namespace
    ``namespace`` (the host's: ``/proc/1/ns/cgroup``); a namespace joined is the thread's
    alone, and the thread ends with the work."""
    failure: list[BaseException] = []

    def run() -> None:
        try:
            fd = os.open(namespace, os.O_RDONLY | os.O_CLOEXEC)
            try:
                libc = ctypes.CDLL(None, use_errno=True)
                if libc.setns(fd, _CLONE_NEWCGROUP) != 0:
                    code = ctypes.get_errno()
                    raise HostCgroupError(
                        "cannot join the host's cgroup namespace: "
                        f"{os.strerror(code)} (it needs CAP_SYS_ADMIN)"
                    )
            finally:
                os.close(fd)
            work()
        except OSError as exc:
            failure.append(HostCgroupError(f"cannot join the host's cgroup namespace: {exc}"))
        except BaseException as exc:  # handed to the caller's thread
            failure.append(exc)

    thread = threading.Thread(target=run, name="kubedevice-host-cgroup", daemon=True)
    thread.start()
    thread.join()
    if failure:
        raise failure[0]

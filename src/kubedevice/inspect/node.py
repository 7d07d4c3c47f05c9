"""Gather everything ``kubedevice inspect`` shows about a node, and what is wrong there.

Reads only, and from the kubelet's own view: the checkpoint's registered (healthy) devices
and allocations, and PodResources ``List`` and ``GetAllocatableResources``. Each socket in
the device plugin directory is only dialled to tell a live plugin from a stale socket file
(a connect and ``GetDevicePluginOptions``); a plugin's own ListAndWatch list is read only
when asked (``stream_plugins``, see :mod:`kubedevice.inspect.probe` for why not by default).
It works the same on a real kubelet's node and on the emulator's directory. Problems
reading an input are ``input_errors`` (the CLI exits 2); what is wrong on the node is
``findings``.
"""

from __future__ import annotations

import asyncio
import errno
import os
import re
import stat
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from kubedevice._api import CHECKPOINT_FILE, KUBELET_SOCKET
from kubedevice._regular_file import NotRegularFileError
from kubedevice.errors import CheckpointError
from kubedevice.inspect.checkpoint import Checkpoint, read_checkpoint
from kubedevice.inspect.podresources import PodResourcesView, read_pod_resources
from kubedevice.inspect.probe import PluginProbe, bounded, unix_state

__all__ = ["Finding", "NodeReport", "inspect_node"]

#: How many device IDs a finding lists before "and N more".
_LIST_IDS = 10


@dataclass(frozen=True, slots=True)
class Finding:
    """Something wrong on the node: ``error`` or ``warning``, a stable code, a message."""

    severity: str
    code: str
    message: str


@dataclass(slots=True)
class NodeReport:
    """The whole picture of one node's device plugins."""

    device_plugin_dir: Path
    pod_resources_socket: Path
    timeout: float
    #: Whether each live plugin's first ListAndWatch list was read (``--list-and-watch``).
    streamed: bool = False
    kubelet_socket: str = "missing"  # ok | stale | missing | error: ...
    plugins: list[PluginProbe] = field(default_factory=list)
    checkpoint: Checkpoint | None = None
    pod_resources: PodResourcesView | None = None
    findings: list[Finding] = field(default_factory=list)
    input_errors: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def problem(self, severity: str, code: str, message: str) -> None:
        """Record a finding."""
        self.findings.append(Finding(severity, code, message))


def _ids(ids: list[str]) -> str:
    shown = ", ".join(ids[:_LIST_IDS])
    return shown + (f" and {len(ids) - _LIST_IDS} more" if len(ids) > _LIST_IDS else "")


def _os_error(what: str, path: Path, exc: OSError) -> str:
    if exc.errno == errno.ENOENT:
        return f"{what} {path} does not exist"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return f"{what} {path}: permission denied (run as root, like the kubelet)"
    if exc.errno == errno.ENOTDIR:
        return f"{what} {path} is not a directory"
    return f"{what} {path}: {exc.strerror or exc}"


def _list_sockets(report: NodeReport) -> list[Path]:
    """Socket files in the plugin dir (symlinks and other files are skipped)."""
    d = report.device_plugin_dir
    try:
        names = sorted(os.listdir(d))
    except OSError as exc:
        report.input_errors.append(_os_error("device plugin dir", d, exc))
        return []
    out = []
    for name in names:
        try:
            st = os.lstat(d / name)
        except OSError:
            continue  # vanished while listing
        if stat.S_ISSOCK(st.st_mode):
            out.append(d / name)
    return out


def _read_checkpoint(report: NodeReport) -> None:
    path = report.device_plugin_dir / CHECKPOINT_FILE
    try:
        report.checkpoint = read_checkpoint(path)
    except NotRegularFileError as exc:
        report.input_errors.append(f"checkpoint {path} {exc.strerror}; not read")
    except FileNotFoundError:
        if not report.input_errors:  # a missing dir is already said
            report.problem(
                "warning", "no-checkpoint", f"no {CHECKPOINT_FILE}: the kubelet has not written one"
            )
    except OSError as exc:
        report.input_errors.append(_os_error("checkpoint", path, exc))
    except CheckpointError as exc:
        report.input_errors.append(f"corrupt checkpoint: {exc}")
    else:
        cp = report.checkpoint
        if not cp.checksum_ok:
            report.problem(
                "error",
                "checksum-mismatch",
                f"{CHECKPOINT_FILE}: checksum mismatch (file says {cp.checksum_file}, "
                f"content hashes to {cp.checksum_computed}); the kubelet will discard it "
                "on its next start",
            )


async def _read_pod_resources(report: NodeReport) -> None:
    sock = report.pod_resources_socket
    try:
        st = os.stat(sock)
    except FileNotFoundError:
        report.problem(
            "warning",
            "no-pod-resources",
            f"no PodResources socket at {sock}: devices are not matched to pods by name "
            "(is the kubelet running? if its socket is elsewhere, name it with "
            "--pod-resources-socket)",
        )
        return
    except OSError as exc:
        report.input_errors.append(_os_error("PodResources socket", sock, exc))
        return
    if not stat.S_ISSOCK(st.st_mode):
        report.input_errors.append(f"PodResources socket {sock} is not a socket")
        return
    state, detail = await unix_state(sock)
    if state == "stale":
        report.problem("error", "pod-resources-stale", f"PodResources socket {sock}: {detail}")
        return
    if state != "ok":
        report.input_errors.append(f"PodResources socket {sock}: {detail}")
        return
    try:
        # List and GetAllocatableResources are each bounded by the timeout
        async with asyncio.timeout(2 * report.timeout + 1.0):
            view = await read_pod_resources(sock, report.timeout)
    except TimeoutError:
        report.input_errors.append(
            f"PodResources socket {sock}: no answer within {report.timeout:g} s"
        )
        return
    report.pod_resources = view
    if view.list_error:
        report.input_errors.append(f"PodResources {view.list_error}")
    if view.allocatable_error:
        report.problem("warning", "no-allocatable", f"PodResources {view.allocatable_error}")


def _norm(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


def _known_ids(report: NodeReport) -> dict[str, set[str]]:
    """Resource -> device IDs the kubelet's side knows (checkpoint and PodResources)."""
    known: dict[str, set[str]] = defaultdict(set)
    cp = report.checkpoint
    if cp is not None:
        for res, ids in (cp.registered or {}).items():
            known[res].update(ids or ())
        for e in cp.entries or ():
            known[e.resource].update(e.device_ids)
    view = report.pod_resources
    if view is not None:
        for res, ids in (view.allocatable or {}).items():
            known[res].update(ids)
        for a in view.assigned:
            known[a.resource].update(a.device_ids)
    return known


#: Parts of a resource name too common to tell resources apart by a socket's name.
_COMMON = frozenset({"com", "io", "org", "net", "dev", "k8s", "x"})


def _name_score(resource: str, stem: str) -> int:
    """2: the socket is named for the resource (``example.com_foo.sock``); 1: every telling
    part of the name is in the socket's (``nvidia.com/gpu`` and ``nvidia-gpu.sock``)."""
    if _norm(resource) == stem:
        return 2
    parts = [x for x in re.split(r"[^a-z0-9]+", resource.lower()) if x and x not in _COMMON]
    return int(bool(parts) and all(x in stem for x in parts))


def _infer_resources(report: NodeReport) -> None:
    """Name each socket's resource: a socket carries no name, so it is matched from the
    device IDs it listed (only with ``--list-and-watch``), else from its file name."""
    known = _known_ids(report)
    for p in report.plugins:
        ids = {d.id for d in p.devices or ()}
        stem = _norm(p.socket.removesuffix(".sock"))

        def score(res: str, ids: set[str] = ids, stem: str = stem) -> tuple[int, int]:
            return (len(ids & known[res]), _name_score(res, stem))

        ranked = sorted(known, key=score, reverse=True)
        unique = len(ranked) == 1 or (len(ranked) > 1 and score(ranked[0]) != score(ranked[1]))
        if ranked and score(ranked[0]) > (0, 0) and unique:
            p.resource = ranked[0]


def _healthy(report: NodeReport) -> dict[str, set[str]] | None:
    """Resource -> the kubelet's healthy devices: PodResources' allocatable (now), else the
    checkpoint's registered devices (at its last write); ``None`` if neither was read."""
    view = report.pod_resources
    if view is not None and view.allocatable is not None:
        return {r: set(ids) for r, ids in view.allocatable.items()}
    cp = report.checkpoint
    if cp is not None and cp.registered is not None:
        return {r: set(ids or ()) for r, ids in cp.registered.items()}
    return None


def _judge_sockets(report: NodeReport) -> None:
    for p in report.plugins:
        where = f"{p.socket}" + (f" ({p.resource})" if p.resource else "")
        if p.state == "stale":
            report.problem("error", "stale-socket", f"{where}: {p.detail}")
        elif p.state == "no-answer":
            report.problem("error", "plugin-not-answering", f"{where}: {p.detail}")
        elif p.state == "error":
            report.problem("error", "plugin-error", f"{where}: {p.detail}")
        elif bad := p.unhealthy:
            n = len(p.devices or ())
            report.problem(
                "warning",
                "unhealthy-devices",
                f"{where}: {len(bad)} of {n} device(s) not Healthy: {_ids(bad)}",
            )


def _judge_resources(report: NodeReport) -> None:
    healthy = _healthy(report)
    if healthy is None:
        return
    cp = report.checkpoint
    live = [p for p in report.plugins if p.state == "ok"]
    served = {p.resource for p in live if p.resource}
    unnamed = any(p.resource is None for p in live)
    for res in sorted(set(cp.registered or {}) if cp is not None else set()):
        if not healthy.get(res):
            report.problem(
                "warning",
                "no-healthy-devices",
                f"{res}: the kubelet has no healthy device of it (its plugin stopped, or "
                "every device is Unhealthy)",
            )
        elif res not in served and not unnamed:
            report.problem(
                "warning",
                "resource-without-plugin",
                f"{res}: the kubelet has healthy devices of it, but no plugin socket here "
                "answered for it",
            )
    held: dict[str, set[str]] = defaultdict(set)
    for e in cp.entries or () if cp is not None else ():
        held[e.resource].update(e.device_ids)
    for a in report.pod_resources.assigned if report.pod_resources is not None else ():
        held[a.resource].update(a.device_ids)
    for res, ids in sorted(held.items()):
        gone = sorted(ids - healthy.get(res, set()))
        if gone and healthy.get(res):  # a resource with none healthy is said above
            report.problem(
                "warning",
                "held-devices-not-healthy",
                f"{res}: {_ids(gone)} held by pods but not healthy in the kubelet's view "
                "(Unhealthy, or gone from the plugin's list)",
            )


def _judge_orphans(report: NodeReport) -> None:
    cp = report.checkpoint
    view = report.pod_resources
    if cp is None or view is None or view.list_error:
        return
    listed: dict[str, set[str]] = defaultdict(set)
    for a in view.assigned:
        listed[a.resource].update(a.device_ids)
    by_pod: dict[str, list[tuple[str, str, list[str]]]] = defaultdict(list)
    for e in cp.entries or ():
        if e.device_ids:
            by_pod[e.pod_uid].append((e.container, e.resource, e.device_ids))
    for uid, entries in by_pod.items():
        if any(set(ids) & listed[res] for _, res, ids in entries):
            continue  # the pod is listed (regular init containers are not, by design)
        for container, res, ids in entries:
            report.problem(
                "warning",
                "orphaned-allocation",
                f"{res}: checkpoint holds {_ids(ids)} for pod UID {uid} container {container}, "
                "a pod PodResources no longer lists",
            )


def _judge(report: NodeReport) -> None:
    _judge_sockets(report)
    _judge_resources(report)
    _judge_orphans(report)


async def inspect_node(
    device_plugin_dir: Path,
    pod_resources_socket: Path,
    *,
    timeout: float = 2.0,  # noqa: ASYNC109
    stream_plugins: bool = False,
) -> NodeReport:
    """Inspect one node's device plugins. Reads only; every dial is bounded by ``timeout``.

    ``stream_plugins``: also read each live plugin's first ListAndWatch list (its own view
    of its devices' health and NUMA). Off by default: a plugin built on the upstream Go
    stub keeps feeding the stream after it is closed, and the kubelet loses updates to it.
    """
    start = time.monotonic()
    report = NodeReport(Path(device_plugin_dir), Path(pod_resources_socket), timeout)
    report.streamed = stream_plugins
    sockets = _list_sockets(report)
    kubelet = report.device_plugin_dir / KUBELET_SOCKET
    plugins = [s for s in sockets if s.name != KUBELET_SOCKET]
    probes = asyncio.gather(*(bounded(timeout, s, stream=stream_plugins) for s in plugins))
    kstate_task = unix_state(kubelet) if kubelet in sockets else _none()
    report.plugins, _, kstate = await asyncio.gather(
        probes, _read_pod_resources(report), kstate_task
    )
    if kubelet not in sockets:
        if not report.input_errors:
            report.problem(
                "warning", "no-kubelet-socket", f"no {KUBELET_SOCKET}: is the kubelet running?"
            )
    elif kstate is not None:
        state, detail = kstate
        report.kubelet_socket = state if state == "ok" else f"{state}: {detail}"
        if state != "ok":
            report.problem("error", "kubelet-socket", f"{KUBELET_SOCKET}: {detail}")
    _read_checkpoint(report)
    _infer_resources(report)
    _judge(report)
    report.seconds = time.monotonic() - start
    return report


async def _none() -> tuple[str, str] | None:
    return None

"""The end-to-end tier's fixtures (see README.md here): a real cluster per session, a namespace
per test, plugin daemons, and the components' logs attached to every failing test."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from .cluster import (
    DEVICE_PLUGIN_DIR,
    EXTRA_NODES,
    HOW_TO_GET,
    Cluster,
    Kubelet,
    find_binaries,
    namespace,
    tail,
    tail_since,
)
from .dra import GpuDra, release
from .plugins import GenericDaemon, GpuDaemon
from .runtime import HOW_TO_GET_RUNTIME, RUNTIMES, find_runtime, runtime_of

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent

GPU = "nvidia.com/gpu"
#: the project's image as the containerd tests load it (``image_tar``)
IMAGE = "localhost/kubedevice:e2e"
GENERIC_RESOURCE = "example.com/e2e"
# one device per /dev/e2e* node, with an env, a mount and a CDI name, so a container's record
# shows every kind of thing the generic plugin hands out
GENERIC_CONFIG = """\
version: v1
resources:
  - name: example.com/e2e
    groups:
      - name: e2e
        paths:
          - path: /dev/e2e*
            permissions: rw
        envs:
          E2E_DEVICES: "{devices}"
          E2E_PATHS: "{paths}"
        mounts:
          - hostPath: /etc/hostname
            containerPath: /etc/e2e-hostname
            readOnly: true
        annotations:
          example.com/e2e-ids: "{ids}"
"""

_state: dict[str, Any] = {
    "cluster": None,
    "bin": None,
    "checked": False,
    "why": None,
    "runtime_dir": None,
    "runtime_checked": False,
    "runtime_why": None,
}


def _why_not() -> str | None:
    """``None`` when the tier can run here; else the one line saying why not."""
    if not _state["checked"]:
        _state["checked"] = True
        if os.geteuid() != 0:
            _state["why"] = "the end-to-end tier runs a real kubelet and needs root"
        elif not os.environ.get("CI") and not os.path.ismount(DEVICE_PLUGIN_DIR):
            _state["why"] = (
                f"{DEVICE_PLUGIN_DIR} is this machine's own (not a private mount): run the tier "
                "with `make e2e` (scripts/e2e), or set CI on a machine of its own"
            )
        else:
            found = find_binaries(REPO)
            if found is None:
                _state["why"] = HOW_TO_GET
            _state["bin"] = found
    return _state["why"]  # type: ignore[no-any-return]


def _why_not_runtime() -> str | None:
    """``None`` when the real runtime (containerd) can run here too; else why not."""
    why = _why_not()
    if why is not None:
        return why
    if not _state["runtime_checked"]:
        _state["runtime_checked"] = True
        found = find_runtime(REPO)
        if found is None:
            _state["runtime_why"] = HOW_TO_GET_RUNTIME
        _state["runtime_dir"] = found
    return _state["runtime_why"]  # type: ignore[no-any-return]


def item_runtime(item: pytest.Item) -> str:
    """The runtime a test runs on: containerd for those marked ``containerd``, else the
    tier's default (``KUBEDEVICE_E2E_RUNTIME``, fakecri when unset)."""
    if item.get_closest_marker("containerd") is not None:
        return "containerd"
    return runtime_of()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "containerd: runs on the real container runtime (containerd + runc), whatever "
        "KUBEDEVICE_E2E_RUNTIME says",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    ours = [item for item in items if HERE in Path(str(item.path)).parents]
    for item in ours:
        item.add_marker(pytest.mark.e2e)
    # one cluster at a time (one device-plugin dir): the tests of the runtime the session does
    # not start on come last, and the cluster is swapped once
    first = runtime_of()
    items.sort(key=lambda it: it in ours and item_runtime(it) != first)
    if not ours or config.option.collectonly:
        return
    selected = config.getoption("markexpr", "")
    if selected and "not e2e" in selected:
        return
    if first not in RUNTIMES:
        raise pytest.UsageError(
            f"KUBEDEVICE_E2E_RUNTIME={first!r}: use one of {', '.join(RUNTIMES)}"
        )
    if os.environ.get("CI"):
        return
    for item in ours:
        why = _why_not_runtime() if item_runtime(item) == "containerd" else _why_not()
        if why is not None:
            item.add_marker(pytest.mark.skip(reason=why))


def _stop_cluster() -> None:
    c: Cluster | None = _state["cluster"]
    _state["cluster"] = None
    if c is not None:
        try:
            c.stop()
        finally:
            shutil.rmtree(c.workdir, ignore_errors=True)


def cluster_on(runtime: str) -> Cluster:
    """The session's cluster on ``runtime``: the running one, or (the first time, or when the
    previous tests ran on the other runtime) a new one in place of it."""
    c: Cluster | None = _state["cluster"]
    if c is not None and c.runtime == runtime:
        return c
    why = _why_not_runtime() if runtime == "containerd" else _why_not()
    if why is not None:
        pytest.fail(f"CI is set: {why}", pytrace=False)
    _stop_cluster()
    workdir = Path(tempfile.mkdtemp(prefix="kde-", dir="/tmp"))
    try:
        c = Cluster.start(
            _state["bin"], workdir, runtime=runtime, runtime_dir=_state["runtime_dir"]
        )
    except BaseException:
        logs = workdir / "logs"
        for log in sorted(logs.glob("*.log")) if logs.is_dir() else []:
            print(f"---- {log.name}\n{tail(log)}")
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    _state["cluster"] = c
    return c


@pytest.fixture(scope="session", autouse=True)
def _session_cluster() -> Iterator[None]:
    """Stops the session's cluster at the end."""
    try:
        yield
    finally:
        _stop_cluster()


@pytest.fixture(scope="session")
def image_tar(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project's image (``scripts/build-image``, tagged ``IMAGE``) as a tar, built once per
    session for every containerd that loads it (each node's has a content store of its own)."""
    c = cluster_on("containerd")
    assert c.containerd is not None
    if shutil.which("mmdebstrap") is None:
        why = "the image build needs Debian's mmdebstrap: apt-get install mmdebstrap"
        if os.environ.get("CI"):
            pytest.fail(f"CI is set: {why}", pytrace=False)
        pytest.skip(why)
    out = tmp_path_factory.mktemp("image") / "kubedevice-image.tar"
    build = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "build_image.py"), "--out", str(out),
         "--tag", IMAGE],
        capture_output=True, text=True, check=False, timeout=540,
        env={**os.environ, "KUBEDEVICE_MKIMAGE": str(c.containerd.scripts / "mkimage.py")},
    )  # fmt: skip
    if build.returncode != 0:
        pytest.fail(f"scripts/build-image failed:\n{build.stderr[-3000:]}", pytrace=False)
    return out


@pytest.fixture
def cluster(request: pytest.FixtureRequest) -> Cluster:
    """etcd, kube-apiserver, kube-scheduler, kube-controller-manager, a runtime (kd-fakecri, or
    containerd for tests marked ``containerd``) and a kubelet; one per session and runtime."""
    return cluster_on(item_runtime(request.node))


@pytest.fixture
def ns(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace for this test; its pods are deleted (and gone) afterwards."""
    base = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = f"{base}-{uuid.uuid4().hex[:5]}"
    with namespace(cluster, name):
        yield name
        cluster.delete_pods(name)


@pytest.fixture
def second_node(cluster: Cluster) -> Iterator[Kubelet]:
    """A real kubelet (and kd-fakecri) for one more Node, ``EXTRA_NODES[0]``, Ready; it is
    stopped and its Node deleted afterwards (``Cluster.add_node``)."""
    name = EXTRA_NODES[0]
    try:
        yield cluster.add_node(name)
    finally:
        cluster.remove_node(name)


@pytest.fixture
def generic_plugin(cluster: Cluster) -> Iterator[Callable[..., GenericDaemon]]:
    """``generic_plugin(config_yaml)`` -> a started ``kubedevice run`` (stopped after the test).

    Add the fake devices with ``daemon.host`` before or after it starts.
    """
    made: list[GenericDaemon] = []

    def make(
        config: str,
        *,
        start: bool = True,
        name: str = "generic-plugin",
        dev_root: Path | None = None,
    ) -> GenericDaemon:
        d = GenericDaemon(cluster, config, name=name, dev_root=dev_root)
        made.append(d)
        if start:
            d.start()
        return d

    yield make
    for d in made:
        d.close()
    for d in made:
        d.wait_gone()


@pytest.fixture
def gpu_plugin(cluster: Cluster) -> Iterator[Callable[..., GpuDaemon]]:
    """``gpu_plugin(config_yaml="version: v1\\n", machine="dgx-8gpu")`` -> a started GPU daemon."""
    made: list[GpuDaemon] = []

    def make(
        config: str = "version: v1\n",
        *,
        machine: str = "dgx-8gpu",
        start: bool = True,
        name: str = "gpu-plugin",
        resources: tuple[str, ...] = ("nvidia.com/gpu",),
    ) -> GpuDaemon:
        d = GpuDaemon(cluster, config, machine=machine, name=name, resources=resources)
        made.append(d)
        if start:
            d.start()
        return d

    yield make
    for d in made:
        d.close()
    for d in made:
        d.wait_gone()


_LOG_MARKS = pytest.StashKey[dict[Path, int]]()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Mark where every log ends as the test starts: its report shows only what came after."""
    c: Cluster | None = _state["cluster"]
    marks: dict[Path, int] = {}
    for path in c.log_files().values() if c is not None else ():
        with contextlib.suppress(OSError):
            marks[path] = path.stat().st_size
    item.stash[_LOG_MARKS] = marks


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    c: Cluster | None = _state["cluster"]
    if c is None or not report.failed or HERE not in Path(str(item.path)).parents:
        return
    marks = item.stash.get(_LOG_MARKS, {})
    for name, path in sorted(c.log_files().items()):
        text = tail_since(path, marks.get(path, 0))
        if text:  # a log this test wrote nothing to (an earlier test's daemon) is left out
            report.sections.append((f"{name} log (last lines since the test started)", text))


@pytest.fixture
def gpu_dra(cluster: Cluster, ns: str) -> Iterator[Callable[..., GpuDra]]:
    """``gpu_dra(machine="dgx-8gpu", driver=..., config=...)`` -> a started GPU DRA driver."""
    made: list[GpuDra] = []

    def make(machine: str = "dgx-8gpu", **kwargs: Any) -> GpuDra:
        d = GpuDra(cluster, machine, **kwargs)
        made.append(d)
        d.start()
        return d

    yield make
    release(cluster, ns, list(made))
    for d in made:
        d.close()  # its slices stay; the next test's driver replaces them (same pool)

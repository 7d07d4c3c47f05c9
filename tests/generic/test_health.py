"""Health checks: sysfs attribute and command; a failing health source is never Healthy."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from typing import Any

import pytest

from kubedevice.generic import FakeHost
from kubedevice.generic.config import HealthSpec
from kubedevice.generic.discovery import Node, PhysicalDevice
from kubedevice.generic.health import CheckResult, run_check
from kubedevice.plugin.filewatch import CONFIG_MASK, DirWatcher


def _dev(host: FakeHost, name: str = "renderD128") -> PhysicalDevice:
    local = str(host.add_char_device(f"/dev/dri/{name}"))
    node = Node(f"/dev/dri/{name}", local, f"/dev/dri/{name}", "rw")
    return PhysicalDevice(
        id=f"dri-{name}", group=0, name=name, nodes=(node,), numa_node=None, claims=()
    )


def _spec(**kw: Any) -> HealthSpec:
    return HealthSpec.from_data(kw)


async def test_sysfs_attribute(host: FakeHost) -> None:
    spec = _spec(sysfsAttribute={"path": "/sys/class/drm/{name}/device/enable", "expect": "1"})
    dev = _dev(host)
    host.set_attr("/sys/class/drm/renderD128/device/enable", "1")
    assert await run_check(spec, dev, str(host.sys_root)) == CheckResult(True)
    host.set_attr("/sys/class/drm/renderD128/device/enable", "0")
    assert await run_check(spec, dev, str(host.sys_root)) == CheckResult(
        False, "/sys/class/drm/renderD128/device/enable is '0', expected '1'"
    )
    host.remove_attr("/sys/class/drm/renderD128/device/enable")
    assert await run_check(spec, dev, str(host.sys_root)) == CheckResult(
        False, "cannot read /sys/class/drm/renderD128/device/enable: No such file or directory"
    )


async def test_sysfs_attribute_symlink_escape(host: FakeHost) -> None:
    spec = _spec(sysfsAttribute={"path": "/sys/class/drm/{name}/enable", "expect": "1"})
    dev = _dev(host)
    target = host.sys("/sys/class/drm/renderD128/enable")
    target.parent.mkdir(parents=True)
    target.symlink_to("/etc/hostname")
    result = await run_check(spec, dev, str(host.sys_root))
    assert result == CheckResult(
        False, "sysfs attribute /sys/class/drm/renderD128/enable resolves outside sysRoot"
    )


@pytest.mark.parametrize(
    ("argv", "healthy", "reason"),
    [
        (
            [
                sys.executable,
                "-c",
                "import sys; sys.exit(0 if sys.argv[1].endswith('D128') else 1)",
                "{path}",
            ],
            True,
            "",
        ),
        (
            [sys.executable, "-c", "raise SystemExit(3)"],
            False,
            f"command {sys.executable} exited with status 3",
        ),
        (
            ["/nonexistent/check"],
            False,
            "cannot start /nonexistent/check: No such file or directory",
        ),
        (
            [sys.executable, "-c", "import time; time.sleep(30)"],
            False,
            f"command {sys.executable} timed out after 0.2s",
        ),
    ],
    ids=["ok", "exit-status", "cannot-start", "timeout"],
)
async def test_command(host: FakeHost, argv: list[str], healthy: bool, reason: str) -> None:
    spec = _spec(command={"argv": argv, "timeoutSeconds": 0.2})
    assert await run_check(spec, _dev(host), str(host.sys_root)) == CheckResult(healthy, reason)


async def _exited(pid: int) -> None:
    """Wait until process ``pid`` has exited (its pidfd turns readable); no polling."""
    loop = asyncio.get_running_loop()
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return  # already gone and reaped
    gone: asyncio.Future[None] = loop.create_future()
    loop.add_reader(fd, lambda: gone.done() or gone.set_result(None))
    try:
        await gone
    finally:
        loop.remove_reader(fd)
        os.close(fd)


@pytest.mark.parametrize("how", ["timeout", "cancel"])
async def test_command_children_die_with_it(host: FakeHost, how: str) -> None:
    # A check script that leaves a child behind must not leak it at every period.
    pidfile = host.root / "child.pid"
    script = f"sleep 600 & echo $! > {pidfile}.tmp && mv {pidfile}.tmp {pidfile}; wait"
    timeout = 1.5 if how == "timeout" else 60
    spec = _spec(command={"argv": ["sh", "-c", script], "timeoutSeconds": timeout})
    watcher = DirWatcher(CONFIG_MASK)
    watcher.watch_exactly({str(host.root)})
    try:
        async with asyncio.timeout(20):
            task = asyncio.create_task(run_check(spec, _dev(host), str(host.sys_root)))
            while not pidfile.exists():  # written by the script: an inotify event, no polling
                await watcher.changed()
            child = int(pidfile.read_text())
            if how == "cancel":
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
            else:
                assert await task == CheckResult(False, "command sh timed out after 1.5s")
            await _exited(child)
    finally:
        watcher.close()


@pytest.mark.parametrize("code", [0, 3])
async def test_command_background_children_are_killed_after_every_check(
    host: FakeHost, tmp_path: Any, code: int
) -> None:
    """A check that leaves a background child behind (``(sleep 300 &)``) does not leak it."""
    pidfile = tmp_path / "child.pid"
    script = f"(sleep 300 & echo $! > {pidfile}); exit {code}"
    spec = _spec(command={"argv": ["/bin/sh", "-c", script]})
    result = await run_check(spec, _dev(host), str(host.sys_root))
    assert result.healthy is (code == 0)
    child = int(pidfile.read_text())
    try:
        async with asyncio.timeout(10):
            await _exited(child)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, 9)

"""Health checks: sysfs attribute and command; a failing health source is never Healthy."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from kubedevice.generic import FakeHost
from kubedevice.generic.config import HealthSpec
from kubedevice.generic.discovery import Node, PhysicalDevice
from kubedevice.generic.health import CheckResult, run_check


def _dev(host: FakeHost, name: str = "renderD128") -> PhysicalDevice:
    local = str(host.add_char_device(f"/dev/dri/{name}"))
    node = Node(f"/dev/dri/{name}", local, f"/dev/dri/{name}", "rw")
    return PhysicalDevice(
        id=f"dri-{name}", group=0, name=name, nodes=(node,), numa_node=None, claims=frozenset()
    )


def _spec(**kw: Any) -> HealthSpec:
    return HealthSpec.model_validate(kw)


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

"""Per-group health checks: a sysfs attribute with an expected value, or a command.

A check that cannot run (attribute unreadable, command missing or timed out) reports the
device unhealthy with the reason; it is never assumed healthy. A command runs in a process
group of its own, and the whole group is killed when the check ends (exit, timeout or
cancel), so children it left in the background do not pile up. Only a child that leaves
the group (``setsid``, a daemon that starts its own session) escapes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from dataclasses import dataclass

from kubedevice._regular_file import read_regular
from kubedevice.generic.config import HealthSpec
from kubedevice.generic.discovery import PhysicalDevice
from kubedevice.generic.templates import CHECK_VARIABLES, Template

__all__ = ["CheckResult", "run_check"]


@dataclass(frozen=True, slots=True)
class CheckResult:
    """Outcome of one health check of one device.

    Attributes:
        healthy: Whether the device passed.
        reason: Why it failed (empty when healthy).
    """

    healthy: bool
    reason: str = ""


def _values(dev: PhysicalDevice) -> dict[str, str]:
    return {"id": dev.id, "name": dev.name, "path": dev.primary_path}


def _read_attribute(local: str, sys_root: str) -> str | None:
    """The attribute's text, or None when it resolves outside ``sys_root``."""
    real = os.path.realpath(local)
    root = os.path.realpath(sys_root)
    if not real.startswith(root.rstrip("/") + "/"):
        return None
    # a FIFO: an error, never a wait
    return read_regular(real, follow_symlinks=True).decode("utf-8", "replace")


def _kill_group(pid: int) -> None:
    """SIGKILL the check's process group (a shell script's children go with it)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


async def run_check(spec: HealthSpec, dev: PhysicalDevice, sys_root: str) -> CheckResult:
    """Run the group's checks for ``dev``; unhealthy if any fails or cannot run."""
    values = _values(dev)
    if spec.sysfs_attribute is not None:
        rendered = Template.parse(spec.sysfs_attribute.path, CHECK_VARIABLES).render(values)
        local = os.path.join(sys_root, rendered[len("/sys/") :])
        try:
            text = await asyncio.to_thread(_read_attribute, local, sys_root)
        except OSError as exc:
            return CheckResult(False, f"cannot read {rendered}: {exc.strerror or exc}")
        if text is None:
            return CheckResult(False, f"sysfs attribute {rendered} resolves outside sysRoot")
        if text.strip() != spec.sysfs_attribute.expect.strip():
            return CheckResult(
                False,
                f"{rendered} is {text.strip()!r}, expected {spec.sysfs_attribute.expect.strip()!r}",
            )
    if spec.command is not None:
        argv = [Template.parse(a, CHECK_VARIABLES).render(values) for a in spec.command.argv]
        timeout = spec.command.timeout_seconds
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL,
                start_new_session=True,  # its own process group, killed when the check ends
            )
        except OSError as exc:
            return CheckResult(False, f"cannot start {argv[0]}: {exc.strerror or exc}")
        try:
            async with asyncio.timeout(timeout):  # wait_for may swallow a cancel on 3.11
                code = await proc.wait()
        except TimeoutError:
            _kill_group(proc.pid)
            await proc.wait()
            return CheckResult(False, f"command {argv[0]} timed out after {timeout:g}s")
        except asyncio.CancelledError:
            _kill_group(proc.pid)
            await asyncio.shield(proc.wait())
            raise
        finally:
            # Every check, not only a timed-out one: `(sleep 300 &)` must not outlive it.
            _kill_group(proc.pid)
        if code != 0:
            return CheckResult(False, f"command {argv[0]} exited with status {code}")
    return CheckResult(True)

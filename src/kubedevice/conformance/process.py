"""The plugin under test as a child process: start it, watch it, stop it, keep its log.

The command gets the device plugin directory in ``$DP_DEVICE_PLUGIN_DIR`` and in place of
``{dir}`` in its arguments; its stdout and stderr go to one log file. The child runs in its
own session so a stop reaches its children too; we only ever signal what we started, and
whatever is left in its process group after it exits is killed too (no orphans).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Sequence
from pathlib import Path

from kubedevice._api import ENV_DEVICE_PLUGIN_DIR
from kubedevice.errors import ConfigError

__all__ = ["PluginProcess"]


class PluginProcess:
    """One run of the plugin command."""

    def __init__(self, command: Sequence[str], device_plugin_dir: Path, log_path: Path) -> None:
        if not command:
            raise ConfigError("no plugin command given")
        self.argv = [arg.replace("{dir}", str(device_plugin_dir)) for arg in command]
        self.device_plugin_dir = device_plugin_dir
        self.log_path = log_path
        self._proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        """Start the command; :class:`ConfigError` when it cannot be executed at all."""
        env = dict(os.environ)
        env[ENV_DEVICE_PLUGIN_DIR] = str(self.device_plugin_dir)
        env.setdefault("PYTHONUNBUFFERED", "1")
        with self.log_path.open("ab") as log:
            try:
                self._proc = await asyncio.create_subprocess_exec(
                    *self.argv,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=log,
                    stderr=asyncio.subprocess.STDOUT,
                    env=env,
                    start_new_session=True,
                )
            except OSError as exc:
                raise ConfigError(f"cannot start plugin command {self.argv[0]!r}: {exc}") from exc

    @property
    def pid(self) -> int | None:
        """The child's pid once started."""
        return None if self._proc is None else self._proc.pid

    @property
    def returncode(self) -> int | None:
        """Exit status once the child has exited (negative = killed by that signal)."""
        return None if self._proc is None else self._proc.returncode

    @property
    def alive(self) -> bool:
        """True while the child runs."""
        return self._proc is not None and self._proc.returncode is None

    async def wait_exit(self, limit: float) -> int | None:
        """Wait up to ``limit`` s for the child to exit; its status, or None if still up."""
        if self._proc is None:
            return None
        try:
            return await asyncio.wait_for(self._proc.wait(), limit)
        except TimeoutError:
            return None

    def _signal(self, sig: signal.Signals) -> None:
        if self._proc is not None and self._proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._proc.pid, sig)

    async def terminate(self, limit: float) -> int | None:
        """SIGTERM the child and wait up to ``limit`` s; its status, or None if still up."""
        self._signal(signal.SIGTERM)
        return await self.wait_exit(limit)

    def group_members(self) -> list[int]:
        """Pids still in the child's process group (what it started and left behind).

        The group id is the leader's pid, and Linux never hands out a pid that is still
        some group's id, so after the leader is reaped this names only its leftovers.
        """
        if self._proc is None:
            return []
        pgid = self._proc.pid
        out = []
        try:
            entries = os.listdir("/proc")
        except OSError:
            return []
        for name in entries:
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if len(fields) > 2 and fields[0] not in ("Z", "X") and int(fields[2]) == pgid:
                out.append(int(name))
        return sorted(out)

    async def kill_group(self, limit: float = 5.0) -> list[int]:
        """SIGKILL every process left in the child's group; the pids that were there.

        Waits (up to ``limit`` s) until they are gone, on a pidfd each where Linux has
        them (no polling).
        """
        left = self.group_members()
        if not left or self._proc is None:
            return left
        fds = []
        for pid in left:
            with contextlib.suppress(OSError, AttributeError):
                fds.append(os.pidfd_open(pid))
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._proc.pid, signal.SIGKILL)
        loop = asyncio.get_running_loop()
        try:
            waits = []
            for fd in fds:
                done: asyncio.Future[None] = loop.create_future()
                loop.add_reader(fd, _settle, done)
                waits.append(done)
            if waits:
                await asyncio.wait(waits, timeout=limit)
        finally:
            for fd in fds:
                loop.remove_reader(fd)
                os.close(fd)
        return left

    async def kill(self) -> None:
        """SIGKILL the child's whole session (it and its children) and reap it."""
        if self._proc is None:
            return
        if self._proc.returncode is None:
            # The child leads its own session: this reaches it and what it started.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._proc.pid, signal.SIGKILL)
        await self._proc.wait()
        await self.kill_group()  # what it started and left running, once it is reaped


def _settle(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)

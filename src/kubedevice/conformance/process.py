"""The plugin under test as a child process: start it, watch it, stop it, keep its log.

The command gets the device plugin directory in ``$DP_DEVICE_PLUGIN_DIR`` and in place of
``{dir}`` in its arguments; its stdout and stderr go to one log file. The child runs in its
own session so a stop reaches its children too; we only ever signal what we started, and
whatever it left running when it exits is killed too (no orphans): what is still in its
process group or session, and what carries the run's mark in its environment (a child
that called ``setsid`` or double-forked).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import signal
from collections.abc import Mapping, Sequence
from pathlib import Path

from kubedevice._api import ENV_DEVICE_PLUGIN_DIR
from kubedevice.errors import ConfigError

__all__ = ["ENV_RUN_MARK", "PluginProcess"]

log = logging.getLogger(__name__)

#: Set in the plugin's environment to a value unique to the run; every process the plugin
#: starts inherits it, so the kit finds them even after they leave its session.
ENV_RUN_MARK = "KUBEDEVICE_CONFORMANCE_RUN"

#: Scans for leftovers at most (each after killing what the previous one found).
_KILL_ROUNDS = 5


class PluginProcess:
    """One run of the plugin command."""

    def __init__(
        self,
        command: Sequence[str],
        device_plugin_dir: Path | None,
        log_path: Path,
        *,
        templates: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        """``templates`` (default ``{dir}``: the device plugin dir) are replaced in the
        arguments; ``env`` is added to the environment (``$DP_DEVICE_PLUGIN_DIR`` is set
        when there is a device plugin dir)."""
        if not command:
            raise ConfigError("no plugin command given")
        if templates is None:
            templates = {"{dir}": str(device_plugin_dir)}
        self.argv = [_fill(arg, templates) for arg in command]
        self.device_plugin_dir = device_plugin_dir
        self.extra_env = dict(env or {})
        self.log_path = log_path
        self._proc: asyncio.subprocess.Process | None = None
        self.mark = f"{os.getpid()}-{secrets.token_hex(8)}"

    async def start(self) -> None:
        """Start the command; :class:`ConfigError` when it cannot be executed at all."""
        env = {**os.environ, **self.extra_env}
        if self.device_plugin_dir is not None:
            env[ENV_DEVICE_PLUGIN_DIR] = str(self.device_plugin_dir)
        env[ENV_RUN_MARK] = self.mark  # inherited by all it starts: how leftovers are found
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

    def leftovers(self) -> list[int]:
        """Pids of what the child started and is still running (the child itself excluded).

        Found three ways, so neither a new process group nor a new session (``setsid``)
        hides one: the child's process group, the child's session (both ids are the
        child's pid, which Linux never hands out while a group or session still uses it),
        and the run's mark in the environment every descendant inherits.
        """
        if self._proc is None:
            return []
        try:
            entries = os.listdir("/proc")
        except OSError:
            return []
        return sorted(int(name) for name in entries if name.isdigit() and self._ours(name))

    def _ours(self, pid: str) -> bool:
        """True if live process ``pid`` is one :meth:`leftovers` names."""
        assert self._proc is not None
        leader = self._proc.pid
        if int(pid) in (leader, os.getpid()):
            return False
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            return False
        if len(fields) < 4 or fields[0] in ("Z", "X"):
            return False
        mark = f"{ENV_RUN_MARK}={self.mark}".encode() + b"\0"
        return leader in (int(fields[2]), int(fields[3])) or _has_mark(pid, os.getuid(), mark)

    async def kill_group(self, limit: float = 5.0) -> list[str]:
        """SIGKILL every process the child left running; each named ``pid (command)``.

        Each is signalled through a pidfd opened before it is checked again, so a pid
        reused meanwhile is never hit. Scans again after each round (a leftover may have
        forked meanwhile), then waits (up to ``limit`` s) until they are gone, on the
        pidfds (no polling).
        """
        if self._proc is None:
            return []
        named: list[str] = []
        fds: list[int] = []
        killed: set[int] = set()
        for _ in range(_KILL_ROUNDS):
            found = [pid for pid in self.leftovers() if pid not in killed]
            if not found:
                break
            for pid in found:
                try:
                    fd = os.pidfd_open(pid)
                except OSError:
                    continue  # gone already
                # Still ours now that the pidfd pins it? (Its pid may have been reused.)
                if not self._ours(str(pid)):
                    os.close(fd)
                    continue
                command = _command(pid)  # before it is gone
                try:
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
                except OSError:
                    os.close(fd)
                    continue
                fds.append(fd)
                killed.add(pid)
                named.append(f"{pid} ({command})")
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
        if named:
            log.warning("killed what the plugin left running: %s", ", ".join(named))
        return named

    async def stop(self, grace: float) -> None:
        """SIGTERM the child's session, give it ``grace`` s to exit, then :meth:`kill`.

        A plugin that exits on SIGTERM flushes what its stdio still buffered (a C or Perl
        plugin's stdout into a file is block-buffered); a SIGKILL straight away would lose
        those lines from the log.
        """
        if self._proc is None:
            return
        if self._proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._proc.pid, signal.SIGTERM)
            await self.wait_exit(grace)
        await self.kill()

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


def _fill(arg: str, templates: Mapping[str, str]) -> str:
    for name, value in templates.items():
        arg = arg.replace(name, value)
    return arg


def _has_mark(pid: str, uid: int, mark: bytes) -> bool:
    """True if process ``pid`` (ours) carries the run's mark in its environment."""
    try:
        if os.stat(f"/proc/{pid}").st_uid != uid:
            return False  # not ours: we could not have started it
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read()
    except OSError:
        return False
    return env.startswith(mark) or b"\0" + mark in env


def _command(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip() or "?"
    except OSError:
        return "?"


def _settle(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)

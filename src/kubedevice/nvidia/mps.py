"""MPS control daemons, one per GPU, supervised by the driver that hands out the GPU's shares.

Shared by the DRA driver (``dra.mps``: a daemon from a GPU's first prepared share to its
last unprepare) and the device plugin (``sharing.mps``: a daemon per GPU of a shared
resource while the plugin serves it).

A daemon is started as NVIDIA documents it: ``nvidia-cuda-mps-control -d`` with
``CUDA_MPS_PIPE_DIRECTORY`` and ``CUDA_MPS_LOG_DIRECTORY`` (``<root>/<key>/pipe`` and
``.../log``, the key a digest of the GPU UUID, named in ``<root>/<key>/gpu-uuid``) and
``CUDA_VISIBLE_DEVICES=<GPU UUID>``, so it serves that GPU alone; its pid is read from
the ``nvidia-cuda-mps-control.pid`` it writes in its pipe directory. It is
stopped with ``quit`` on its control program's stdin (``echo quit | nvidia-cuda-mps-control``
with the same pipe directory), SIGKILL if it has not gone after ``stop_timeout``.

While a daemon runs, its process is watched (a pidfd on the event loop): one that dies while
holders remain is started again at once and the GPU is reported broken
(:meth:`MpsDaemons.faults`) until every holder of that time has let go, since their
processes lost their MPS server. A new supervisor (the driver restarted) adopts the
daemons it finds running (pid file, a live process whose command line is the control
program's, not a zombie) for the GPUs still held, and stops the others.

For a daemon to outlive the driver's container (an upgrade, a restart of the pod), it is
moved into a cgroup of its own on the host, ``kubedevice-mps/<key>`` in every hierarchy
(:mod:`kubedevice.nvidia.hostcgroup`), when the supervisor is given the host's cgroup
file systems (``hostCgroupRoot``); without them it ends with the container.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Final

from kubedevice.errors import ConfigError, KubeDeviceError
from kubedevice.nvidia import hostcgroup
from kubedevice.nvidia.backend import MpsControlProgram, NvmlBackend
from kubedevice.nvidia.cdi import find_tool
from kubedevice.nvidia.mpsclient import PIPE_ENV, MpsPaths

__all__ = [
    "CGROUP",
    "PID_FILE",
    "RESTART_ADVICE",
    "MpsDaemons",
    "MpsError",
    "control_command",
    "running_daemons",
]

log = logging.getLogger(__name__)

LOG_ENV: Final = "CUDA_MPS_LOG_DIRECTORY"
#: What the control daemon writes in its pipe directory.
PID_FILE: Final = "nvidia-cuda-mps-control.pid"
_TOOL: Final = "nvidia-cuda-mps-control"
#: The cgroup (in every hierarchy of the host) that holds the daemons, one each under it.
CGROUP: Final = "kubedevice-mps"
#: What a fault's message says after the death (``MpsDaemons(advice=...)``): the DRA driver's.
RESTART_ADVICE: Final = (
    "the processes that were its clients lost their MPS server; restart them "
    "(this clears when every share prepared before is unprepared)"
)


class MpsError(KubeDeviceError):
    """An MPS control daemon could not be started or stopped."""


_UUID_FILE: Final = "gpu-uuid"
_BOOT_FILE: Final = "boot-id"  # the boot a daemon was started in (a reboot ends its clients)
_BOOT_ID: Final = Path("/proc/sys/kernel/random/boot_id")


def _current_boot_id() -> str:
    try:
        return _BOOT_ID.read_text().strip()
    except OSError:
        return ""


def _boot_id(paths: MpsPaths) -> str:
    try:
        return (paths.pipe.parent / _BOOT_FILE).read_text().strip()
    except OSError:
        return ""


def _key(uuid: str) -> str:
    return hashlib.sha256(uuid.encode()).hexdigest()[:12]


def control_command(backend: NvmlBackend, driver_root: str) -> list[str]:
    """The MPS control program: the backend's own (the fake); else ``nvidia-cuda-mps-control``
    on this process's ``PATH`` (in a container, the NVIDIA runtime puts it there with the
    ``compute`` driver capability, beside ``libcuda``); else the driver root's, run under
    ``chroot`` when the root is not ``/`` (so it finds the driver's libraries).

    Raises:
        ConfigError: No control program anywhere.
    """
    if isinstance(backend, MpsControlProgram):
        return backend.mps_control_command()
    own = shutil.which(_TOOL)
    if own is not None:
        return [own]
    path = find_tool(driver_root, _TOOL)
    if path is not None:
        if os.path.abspath(driver_root) == "/":
            return [path]
        return ["chroot", driver_root, "/" + os.path.relpath(path, driver_root)]
    raise ConfigError(
        f"MPS: no {_TOOL} on PATH nor under {driver_root} (usr/bin, usr/local/bin, bin); "
        "the driver's MPS control program is needed to run MPS (in a container: "
        "NVIDIA_DRIVER_CAPABILITIES=utility,compute)"
    )


def running_daemons(root: Path) -> list[int]:
    """The pids of the live control daemons under ``root`` (by their pid files), any program."""
    out = []
    for pid_file in sorted(root.glob(f"*/pipe/{PID_FILE}")):
        pid = _read_pid(pid_file.parent)
        if pid is not None and _alive(pid, ""):
            out.append(pid)
    return out


def _alive(pid: int, name: str) -> bool:
    """Whether ``pid`` is a live (not zombie) process whose command line names ``name``."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    state = stat.rsplit(")", 1)[-1].split()[:1]
    return state != ["Z"] and name.encode() in cmdline


def _exists(pid: int) -> bool:
    """Whether ``pid`` is a process, a zombie included (not yet reaped)."""
    return os.path.exists(f"/proc/{pid}")


def _read_pid(pipe: Path) -> int | None:
    try:
        pid = int((pipe / PID_FILE).read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if pid > 0 else None


@dataclass
class _Daemon:
    pid: int
    pidfd: int | None
    started: float  # time.monotonic()


class MpsDaemons:
    """The MPS control daemons of one driver, by GPU UUID.

    Args:
        root: Where each GPU's ``pipe`` and ``log`` directories go (on the host).
        command: The control program (``[".../nvidia-cuda-mps-control"]``).
        on_change: Called (on the loop) when a GPU turns broken or whole again.
        setup: Control commands sent to a GPU's daemon once it runs
            (``set_default_active_thread_percentage 25`` ...), by UUID.
        cgroup_root: The host's cgroup file systems (``/host/sys/fs/cgroup``): each daemon
            is moved into ``kubedevice-mps/<key>`` there, out of this process's cgroup, so it
            outlives this container. ``None``: it stays in this process's cgroup.
        advice: What a fault's message tells the user to do, and when it clears.

    Raises:
        ConfigError: ``cgroup_root`` holds no cgroup hierarchy.
    """

    def __init__(
        self,
        root: Path,
        command: Sequence[str],
        *,
        on_change: Callable[[], None] = lambda: None,
        setup: Callable[[str], Sequence[str]] = lambda _uuid: (),
        start_timeout: float = 10.0,
        stop_timeout: float = 10.0,
        cgroup_root: str | Path | None = None,
        advice: str = RESTART_ADVICE,
    ) -> None:
        self.advice = advice
        self.root = root
        self.cgroup_root = None if cgroup_root is None else Path(cgroup_root)
        if self.cgroup_root is not None:
            try:
                hostcgroup.hierarchies(self.cgroup_root)
            except hostcgroup.HostCgroupError as exc:
                raise ConfigError(f"flags.hostCgroupRoot (--host-cgroup-root): {exc}") from exc
        self.command = list(command)
        self._name = Path(self.command[-1]).name
        self._on_change = on_change
        self._setup = setup
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self._daemons: dict[str, _Daemon] = {}
        self._holders: dict[str, set[str]] = {}
        self._broken: dict[str, tuple[set[str], str]] = {}  # holders then, message
        self._locks: dict[str, asyncio.Lock] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._warned = False
        self.restarts = 0

    # ------------------------------------------------------------------ queries

    def paths(self, uuid: str) -> MpsPaths:
        """The GPU's pipe and log directories (on the host): ``<root>/<key>/pipe`` and
        ``.../log``, the key a short digest of the UUID (Unix socket paths are short)."""
        base = self.root / _key(uuid)
        return MpsPaths(base / "pipe", base / "log")

    def cgroup(self, uuid: str) -> str:
        """The cgroup of the GPU's daemon on the host: ``kubedevice-mps/<key>``."""
        return f"{CGROUP}/{_key(uuid)}"

    def pid(self, uuid: str) -> int | None:
        """The pid of the GPU's daemon, ``None`` when none runs for it."""
        daemon = self._daemons.get(uuid)
        return None if daemon is None else daemon.pid

    def holders(self, uuid: str) -> frozenset[str]:
        """Who holds the GPU's daemon now."""
        return frozenset(self._holders.get(uuid, ()))

    def faults(self) -> dict[str, str]:
        """GPU UUID -> why its clients lost their MPS server (a daemon that died)."""
        return {uuid: message for uuid, (_, message) in self._broken.items()}

    def clear_fault(self, uuid: str, holder: str) -> None:
        """``holder``'s clients of the GPU's daemon that died are gone (it still holds it)."""
        self._heal(uuid, holder)

    # ------------------------------------------------------------------ holding

    def _lock(self, uuid: str) -> asyncio.Lock:
        return self._locks.setdefault(uuid, asyncio.Lock())

    async def hold(self, uuid: str, holder: str) -> MpsPaths:
        """``holder`` needs the GPU's daemon: started when none runs.

        Raises:
            MpsError: The daemon cannot be started (``holder`` does not hold it then).
        """
        async with self._lock(uuid):
            if uuid not in self._daemons:
                await self._start(uuid)
            self._holders.setdefault(uuid, set()).add(holder)
        return self.paths(uuid)

    async def release(self, uuid: str, holder: str) -> None:
        """``holder`` lets go of the GPU's daemon: stopped when nobody holds it."""
        async with self._lock(uuid):
            held = self._holders.get(uuid, set())
            held.discard(holder)
            self._heal(uuid, holder)
            if held:
                return
            self._holders.pop(uuid, None)
            await self._stop(uuid)

    async def adopt(self, holders: Mapping[str, Iterable[str]]) -> None:
        """Take ``holders`` (GPU UUID -> holders) as the truth: adopt the daemons running
        for held GPUs, start those that are not, stop the daemons of GPUs nobody holds.

        Called at start (a restarted driver) and whenever another instance of the driver
        changed who holds what.
        """
        wanted = {uuid: set(h) for uuid, h in holders.items() if h}
        found = []
        for path in self.root.glob(f"*/{_UUID_FILE}"):
            with contextlib.suppress(OSError):
                found.append(path.read_text().strip())
        for uuid in sorted(set(found) | set(wanted) | set(self._daemons)):
            async with self._lock(uuid):
                held = wanted.get(uuid, set())
                self._holders[uuid] = held
                if not held:
                    self._holders.pop(uuid, None)
                    self._broken.pop(uuid, None)
                    await self._stop(uuid)
                    continue
                if uuid in self._daemons and self._is_running(uuid):
                    continue
                pid = _read_pid(self.paths(uuid).pipe)
                if pid is not None and _alive(pid, self._name):
                    self._watch(uuid, pid)
                    await asyncio.to_thread(self._outlive, uuid, pid)
                    log.info("MPS control daemon of %s adopted (pid %d)", uuid, pid)
                    continue
                rebooted = _boot_id(self.paths(uuid)) != _current_boot_id()
                await self._start(uuid)
                if rebooted:  # every client went with the node: nobody lost a server
                    log.info("MPS control daemon of %s started again after a reboot", uuid)
                    continue
                message = f"MPS control daemon of {uuid} was not running; started again"
                self._broken[uuid] = (set(held), f"{message}: {self.advice}")
                self._on_change()

    async def close(self) -> None:
        """Stop watching (the daemons keep running, for the next driver to adopt)."""
        for daemon in self._daemons.values():
            self._unwatch(daemon)
        self._daemons.clear()
        for task in list(self._tasks):
            task.cancel()
        self._tasks.clear()

    async def stop_all(self) -> None:
        """Stop every daemon this supervisor knows (the holders are forgotten)."""
        for uuid in list(self._daemons):
            async with self._lock(uuid):
                self._holders.pop(uuid, None)
                await self._stop(uuid)

    # ------------------------------------------------------------------ internals

    def _heal(self, uuid: str, holder: str) -> None:
        broken = self._broken.get(uuid)
        if broken is None:
            return
        broken[0].discard(holder)
        if not broken[0]:
            del self._broken[uuid]
            log.info("MPS on %s: every client of the daemon that died has gone", uuid)
            self._on_change()

    def _is_running(self, uuid: str) -> bool:
        daemon = self._daemons.get(uuid)
        return daemon is not None and _alive(daemon.pid, self._name)

    def _env(self, uuid: str) -> dict[str, str]:
        paths = self.paths(uuid)
        env = dict(os.environ)
        env.update({PIPE_ENV: str(paths.pipe), LOG_ENV: str(paths.log)})
        env["CUDA_VISIBLE_DEVICES"] = uuid
        return env

    async def _start(self, uuid: str) -> None:
        """Start the GPU's daemon (in a thread) and watch it. Cut off (a deadline, SIGTERM),
        it still waits for the thread, under the GPU's lock, and watches what it started:
        the daemon is known to this supervisor (its last release stops it), never left
        running unknown."""
        started = asyncio.ensure_future(asyncio.to_thread(self._start_blocking, uuid))
        try:
            pid = await asyncio.shield(started)
        except asyncio.CancelledError:
            with contextlib.suppress(MpsError, OSError):
                self._watch(uuid, await started)
            raise
        self._watch(uuid, pid)

    def _start_blocking(self, uuid: str) -> int:
        paths = self.paths(uuid)
        paths.pipe.mkdir(parents=True, exist_ok=True)
        paths.log.mkdir(parents=True, exist_ok=True)
        os.chmod(paths.pipe, 0o755)
        (paths.pipe.parent / _UUID_FILE).write_text(uuid + "\n")
        (paths.pipe.parent / _BOOT_FILE).write_text(_current_boot_id() + "\n")
        old = _read_pid(paths.pipe)
        if old is not None and _alive(old, self._name):  # running already: take it
            self._outlive(uuid, old)
            return old
        for stale in (PID_FILE, "control"):
            with contextlib.suppress(FileNotFoundError):
                (paths.pipe / stale).unlink()
        what = f"cannot start the MPS control daemon of {uuid}"
        # its output to a file, not a pipe: a daemon that kept the pipe open would hold us
        with open(paths.log / "start.log", "w+") as out:
            _run([*self.command, "-d"], self._env(uuid), None, self.start_timeout, what, out)
        deadline = time.monotonic() + self.start_timeout
        while True:
            pid = _read_pid(paths.pipe)
            if pid is not None and _alive(pid, self._name):
                break
            if time.monotonic() > deadline:
                raise MpsError(
                    f"the MPS control daemon of {uuid} wrote no live pid to "
                    f"{paths.pipe / PID_FILE} within {self.start_timeout:g} s"
                )
            time.sleep(0.005)
        self._outlive(uuid, pid)  # before its first client: the server it starts follows
        commands = list(self._setup(uuid))
        if commands:
            self._control(uuid, commands)
        log.info("MPS control daemon of %s started (pid %d)", uuid, pid)
        return pid

    def _outlive(self, uuid: str, pid: int) -> None:
        """Move the daemon into its own cgroup on the host (blocking), where one is given;
        a failure is logged (once), not raised: the daemon works, it only ends with this
        container."""
        if self.cgroup_root is None or hostcgroup.member(pid, self.cgroup(uuid)):
            return
        try:
            hostcgroup.move(self.cgroup_root, self.cgroup(uuid), pid)
        except hostcgroup.HostCgroupError as exc:
            level = logging.DEBUG if self._warned else logging.WARNING
            self._warned = True
            log.log(
                level,
                "MPS control daemon of %s stays in this container's cgroup and "
                "ends with it (an upgrade restarts it, its clients lose it): %s",
                uuid,
                exc,
            )
            return
        log.debug("MPS control daemon of %s (pid %d) moved to cgroup %s",
                  uuid, pid, self.cgroup(uuid))  # fmt: skip

    def _control(self, uuid: str, commands: Sequence[str]) -> str:
        """Send control commands to the GPU's daemon (blocking); their output."""
        env = {**os.environ, PIPE_ENV: str(self.paths(uuid).pipe)}
        text = "".join(c + "\n" for c in commands)
        return _run(self.command, env, text, self.stop_timeout, f"MPS control of {uuid}")

    def _watch(self, uuid: str, pid: int) -> None:
        old = self._daemons.pop(uuid, None)
        if old is not None:
            self._unwatch(old)
        try:
            pidfd: int | None = os.pidfd_open(pid)
        except OSError:
            pidfd = None
        daemon = _Daemon(pid, pidfd, time.monotonic())
        self._daemons[uuid] = daemon
        if pidfd is not None:
            loop = asyncio.get_running_loop()
            loop.add_reader(pidfd, self._died, uuid, daemon)

    def _unwatch(self, daemon: _Daemon) -> None:
        if daemon.pidfd is not None:
            with contextlib.suppress(Exception):
                asyncio.get_running_loop().remove_reader(daemon.pidfd)
            os.close(daemon.pidfd)
            daemon.pidfd = None

    def _died(self, uuid: str, daemon: _Daemon) -> None:
        self._unwatch(daemon)
        if self._daemons.get(uuid) is not daemon:
            return
        del self._daemons[uuid]
        self._spawn(self._restart(uuid, daemon.pid))

    async def _restart(self, uuid: str, pid: int) -> None:
        delay = 0.1
        async with self._lock(uuid):
            held = set(self._holders.get(uuid, ()))
            if not held or uuid in self._daemons:
                return
            self.restarts += 1
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            message = f"MPS control daemon of {uuid} (pid {pid}) died at {stamp}; started again"
            log.warning("%s", message)
            self._broken[uuid] = (held, f"{message}: {self.advice}")
            self._on_change()
            while self._holders.get(uuid):
                try:
                    await self._start(uuid)
                    return
                except MpsError as exc:
                    log.error("%s (again in %.1f s)", exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)

    async def _stop(self, uuid: str) -> None:
        daemon = self._daemons.pop(uuid, None)
        if daemon is not None:
            self._unwatch(daemon)
        pid = None if daemon is None else daemon.pid
        busy = await asyncio.to_thread(self._stop_blocking, uuid, pid)
        if busy is not None:
            self._spawn(self._remove_cgroup(uuid, busy))

    async def _remove_cgroup(self, uuid: str, pid: int) -> None:
        """Remove a stopped daemon's cgroups, busy at its stop, once its process is gone
        from ``/proc`` (reaped by the host's init, its parent after its driver's container
        went; nothing tells us when, so ``/proc`` is looked at every 50 ms, for 30 s at
        most), unless a daemon runs for the GPU again by then."""
        assert self.cgroup_root is not None
        for _ in range(600):
            if not _exists(pid):
                break
            await asyncio.sleep(0.05)
        async with self._lock(uuid):
            if uuid in self._daemons:
                return
            left = await asyncio.to_thread(hostcgroup.remove, self.cgroup_root, self.cgroup(uuid))
        if left:
            log.warning("MPS control daemon of %s: cgroups left: %s", uuid, "; ".join(left))

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _stop_blocking(self, uuid: str, pid: int | None) -> int | None:
        """Stop the GPU's daemon (blocking); its pid when its cgroups are still busy (its
        process not quite gone), else ``None``."""
        paths = self.paths(uuid)
        if pid is None:
            pid = _read_pid(paths.pipe)
        if pid is not None and _alive(pid, self._name):
            try:
                self._control(uuid, ["quit"])
            except MpsError as exc:
                log.warning("%s; killing pid %d", exc, pid)
            deadline = time.monotonic() + self.stop_timeout
            while _alive(pid, self._name):
                if time.monotonic() > deadline:
                    log.warning("MPS control daemon of %s ignored quit; killing it", uuid)
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                    break
                time.sleep(0.005)
            log.info("MPS control daemon of %s stopped (pid %d)", uuid, pid)
        shutil.rmtree(paths.pipe, ignore_errors=True)
        for name in (_UUID_FILE, _BOOT_FILE):
            with contextlib.suppress(FileNotFoundError):
                (paths.pipe.parent / name).unlink()
        if self.cgroup_root is None:
            return None
        left = hostcgroup.remove(self.cgroup_root, self.cgroup(uuid))
        if left:
            log.debug("MPS control daemon of %s: cgroups busy at its stop: %s", uuid, left)
        return pid if left else None


def _run(
    argv: list[str], env: Mapping[str, str], text: str | None, timeout: float, what: str,
    out: IO[str] | None = None,
) -> str:  # fmt: skip
    """Run the control program (blocking) with ``text`` on its stdin (``None``: nothing);
    its output (written to ``out`` instead where given).

    Raises:
        MpsError: It could not run, timed out or failed (``what: <its last line>``).
    """
    pipe = subprocess.PIPE if out is None else out
    try:
        proc = subprocess.run(
            argv, env=env, input=text, stdin=subprocess.DEVNULL if text is None else None,
            stdout=pipe, stderr=pipe, text=True, timeout=timeout, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise MpsError(f"{what}: {exc}") from exc
    if out is not None:
        out.seek(0)
        proc.stdout, proc.stderr = out.read(), ""
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        raise MpsError(f"{what}: {lines[-1] if lines else f'exit status {proc.returncode}'}")
    return proc.stdout

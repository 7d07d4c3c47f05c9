"""``kubedevice demo``: the generic plugin on a simulated /dev tree, against the kubelet emulator.

One command, no cluster and no real devices: builds a fake host under a temp dir, starts the
kubelet emulator in-process and the generic plugin as a real ``kubedevice run`` process,
then narrates registration, node capacity, pod admission, a device unplug and re-plug, a
kubelet restart, what each container would get, and a clean SIGTERM. Every step waits on
an event from the emulator (never a sleep) with a timeout, and is timed.

This module is glue between the two sides (it may import both); it holds no protocol logic.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubedevice.errors import AdmissionError, KubeDeviceError
from kubedevice.generic.fake import FakeHost
from kubedevice.kubelet import Emulator
from kubedevice.kubelet.render import node_text, pods_table, runtime_text
from kubedevice.kubelet.types import RegistrationEvent
from kubedevice.ports import free_port

__all__ = [
    "DemoError",
    "DemoResult",
    "Narrator",
    "check_plugin_exit",
    "device_health",
    "free_port",
    "kill_plugin",
    "logs_to_file",
    "open_workdir",
    "pod_manifest",
    "run_demo",
    "scrape",
    "terminate_plugin",
    "timed",
]

SERIAL = "demo.kubedevice.io/serial"
FUSE = "demo.kubedevice.io/fuse"
STEP_TIMEOUT_S = 10.0

CONFIG = """\
version: v1
devRoot: {dev}
sysRoot: {sys}
resources:
  # Every USB serial adapter is one device; its ID is the node name (ttyUSB0 ...).
  - name: demo.kubedevice.io/serial
    groups:
      - name: usb-serial
        paths:
          - path: /dev/ttyUSB*
            permissions: rw
        envs:
          SERIAL_PORTS: "{{paths}}"
  # /dev/fuse, shared by up to 4 containers (IDs fuse::0 ... fuse::3).
  - name: demo.kubedevice.io/fuse
    groups:
      - name: fuse
        paths:
          - path: /dev/fuse
            permissions: rw
        count: 4
"""


def pod_manifest(
    name: str,
    resource: str,
    count: int,
    *,
    namespace: str = "default",
    container: str = "main",
    image: str = "busybox",
) -> dict[str, Any]:
    """A one-container pod manifest asking for ``count`` of ``resource``."""
    limits = {resource: str(count)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "containers": [{"name": container, "image": image, "resources": {"limits": limits}}]
        },
    }


class DemoError(KubeDeviceError):
    """A demo step did not reach its expected state in time."""


@dataclass
class DemoResult:
    """What the demo measured (seconds), for the summary and for tests."""

    timings: dict[str, float] = field(default_factory=dict)
    admitted: list[str] = field(default_factory=list)
    rejected: dict[str, str] = field(default_factory=dict)
    plugin_exit_code: int | None = None


class Narrator:
    """Prints numbered, timed steps and indented blocks through ``out``."""

    def __init__(self, out: Callable[[str], None]) -> None:
        self._out = out
        self._n = 0
        self._t0 = time.monotonic()

    def step(self, title: str) -> None:
        self._n += 1
        self._out(f"\n== {self._n}. {title}  [t={time.monotonic() - self._t0:.2f}s]")

    def say(self, text: str) -> None:
        self._out(text)

    def block(self, text: str) -> None:
        self._out("\n".join("   " + line if line else "" for line in text.splitlines()))

    def summary(self, result: DemoResult) -> None:
        """The closing step: every measured timing, in milliseconds."""
        self.step("Summary")
        for what, seconds in result.timings.items():
            self.say(f"   {what:<36} {seconds * 1000:8.1f} ms")


@contextlib.contextmanager
def open_workdir(keep: Path | None) -> Iterator[Path]:
    """``keep`` (created if needed), or a temp dir under /tmp removed afterwards."""
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        yield keep
        return
    path = Path(tempfile.mkdtemp(prefix="kd-demo-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def logs_to_file(path: Path) -> Iterator[None]:
    """Send this process's log lines (the in-process emulator's) to ``path`` meanwhile.

    The narration owns the terminal: log lines written to stderr while it prints to stdout
    interleave with it. The loggers' handlers are swapped for one file handler (keeping the
    configured format) and restored afterwards.
    """
    loggers = [logging.getLogger(), logging.getLogger("kubedevice")]
    saved = [(logger, logger.handlers[:]) for logger in loggers]
    formatter = next((h.formatter for _, hs in saved for h in hs if h.formatter), None)
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(
        formatter or logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    )
    targets = [logger for logger, handlers in saved if handlers] or [logging.getLogger()]
    for logger in targets:
        logger.handlers[:] = [handler]
    try:
        yield
    finally:
        for logger, handlers in saved:
            logger.handlers[:] = handlers
        handler.close()


async def timed(what: str, awaitable: Any, result: DemoResult) -> float:
    """Await ``awaitable``, record how long it took as ``result.timings[what]``, return it.

    Raises:
        DemoError: It timed out.
    """
    start = time.monotonic()
    try:
        await awaitable
    except TimeoutError:
        waited = time.monotonic() - start  # the awaitable's own timeout, not always the step's
        raise DemoError(f"timed out after {waited:.0f}s waiting for: {what}") from None
    result.timings[what] = time.monotonic() - start
    return result.timings[what]


async def terminate_plugin(plugin: asyncio.subprocess.Process, result: DemoResult) -> None:
    """SIGTERM the plugin process and record its exit code.

    Raises:
        DemoError: It did not exit within the step timeout.
    """
    plugin.terminate()
    try:
        async with asyncio.timeout(STEP_TIMEOUT_S):
            result.plugin_exit_code = await plugin.wait()
    except TimeoutError:
        raise DemoError(
            f"the plugin did not exit within {STEP_TIMEOUT_S:.0f}s of SIGTERM"
        ) from None


async def kill_plugin(plugin: asyncio.subprocess.Process | None) -> None:
    """Kill the plugin process if it is still running (clean-up after a failed step)."""
    if plugin is not None and plugin.returncode is None:
        plugin.kill()
        await plugin.wait()


def check_plugin_exit(result: DemoResult, log_path: Path) -> None:
    """Raise :class:`DemoError` with the tail of the plugin's log unless it exited 0."""
    if result.plugin_exit_code != 0:
        tail = log_path.read_text(errors="replace")[-2000:]
        raise DemoError(f"plugin exited with {result.plugin_exit_code}; its log:\n{tail}")


def scrape(url: str) -> str:
    """GET ``url`` (a metrics endpoint) and return the body as text (blocking)."""
    with urllib.request.urlopen(url, timeout=5) as resp:
        return str(resp.read().decode())


def _registrations(emu: Emulator, since: float) -> set[str]:
    return {
        e.resource for e in emu.events if isinstance(e, RegistrationEvent) and e.ok and e.t >= since
    }


def device_health(emu: Emulator, resource: str, device: str) -> str | None:
    """The health the node reports for ``device`` of ``resource`` (``None``: not listed)."""
    status = emu.node().resources.get(resource)
    if status is None:
        return None
    return next((d.health for d in status.devices if d.id == device), None)


async def run_demo(
    out: Callable[[str], None] = print, *, workdir: Path | None = None
) -> DemoResult:
    """Run the whole demo, printing each step through ``out``.

    Args:
        out: Where the narration goes (one call per block of text).
        workdir: Keep the fake host and sockets here instead of a removed temp dir.

    Returns:
        The measured timings and the admission outcomes.

    Raises:
        DemoError: A step did not reach its expected state within its timeout.
    """
    result = DemoResult()
    say = Narrator(out)
    with open_workdir(workdir) as root, logs_to_file(root / "emulator.log"):
        host = FakeHost(root / "host")
        dp_dir = root / "kubelet" / "device-plugins"
        dp_dir.mkdir(parents=True, exist_ok=True)
        say.step("Simulated host")
        for i in range(3):
            host.add_char_device(f"/dev/ttyUSB{i}", numa_node=0, subsystem="tty")
        host.add_char_device("/dev/fuse")
        config = root / "config.yaml"
        config.write_text(CONFIG.format(dev=host.dev_root, sys=host.sys_root))
        say.say(f"   fake /dev under {host.dev_root}: ttyUSB0, ttyUSB1, ttyUSB2, fuse")
        say.say(f"   plugin config {config}:")
        say.block(config.read_text())
        kept = "" if workdir is not None else " (kept with --workdir)"
        say.say(f"   log files: {root / 'emulator.log'}, {root / 'plugin.log'}{kept}")

        emu = Emulator(dp_dir, control_socket=False)
        await emu.start()
        plugin: asyncio.subprocess.Process | None = None
        log_path = root / "plugin.log"
        try:
            say.step("Kubelet emulator started")
            say.say(f"   serving Registration on {emu.kubelet_socket}")
            say.step("Generic plugin started: kubedevice run --config config.yaml")
            t_start = time.monotonic()
            with log_path.open("wb") as log_file:
                plugin = await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    "kubedevice",
                    "run",
                    "--config",
                    str(config),
                    "--device-plugin-dir",
                    str(dp_dir),
                    stdout=log_file,
                    stderr=log_file,
                )
            await timed(
                "start to registered",
                emu.wait_until(lambda: _registrations(emu, t_start) >= {SERIAL, FUSE}, 15.0),
                result,
            )
            await timed(
                "registered to capacity",
                emu.wait_until(
                    lambda: (
                        emu.node().allocatable().get(SERIAL) == 3
                        and emu.node().allocatable().get(FUSE) == 4
                    ),
                    STEP_TIMEOUT_S,
                ),
                result,
            )
            say.say(
                f"   both resources registered {result.timings['start to registered']:.2f}s "
                "after the process started"
            )
            say.step("Node capacity (kubectl describe node)")
            say.block(node_text(emu.node().to_dict()))

            say.step("Admitting pods (kubedevice pod apply -f ...)")
            for name, resource, count in (
                ("modem", SERIAL, 1),
                ("flasher", SERIAL, 2),
                ("builder-a", FUSE, 1),
                ("builder-b", FUSE, 1),
                ("greedy", SERIAL, 1),
            ):
                try:
                    await emu.apply_pod(pod_manifest(name, resource, count))
                    result.admitted.append(name)
                    say.say(f"   pod/{name} ({count} x {resource}) admitted")
                except AdmissionError as exc:
                    result.rejected[name] = str(exc)
                    say.say(f"   pod/{name} ({count} x {resource}) REJECTED: {exc}")
            say.block(pods_table([p.to_dict() for p in emu.pods()]))

            modem = emu.pod("modem").container("main").devices[SERIAL][0]
            say.step(f"Unplugging /dev/{modem} (allocated to pod/modem)")
            host.remove(f"/dev/{modem}")
            await timed(
                "unplug to Unhealthy",
                emu.wait_until(
                    lambda: device_health(emu, SERIAL, modem) == "Unhealthy", STEP_TIMEOUT_S
                ),
                result,
            )
            say.say(
                f"   the kubelet saw {modem} turn Unhealthy "
                f"{result.timings['unplug to Unhealthy'] * 1000:.0f} ms after the unplug "
                "(inotify, no polling); capacity kept, allocatable dropped:"
            )
            say.block(node_text(emu.node().to_dict()))

            say.step(f"Plugging /dev/{modem} back in")
            host.add_char_device(f"/dev/{modem}", numa_node=0, subsystem="tty")
            await timed(
                "replug to Healthy",
                emu.wait_until(
                    lambda: device_health(emu, SERIAL, modem) == "Healthy", STEP_TIMEOUT_S
                ),
                result,
            )
            say.say(
                f"   {modem} Healthy again after "
                f"{result.timings['replug to Healthy'] * 1000:.0f} ms"
            )

            say.step("Simulated kubelet restart (sockets wiped, checkpoint re-read)")
            t_restart = time.monotonic()
            await emu.restart()
            await timed(
                "kubelet restart to re-registered",
                emu.wait_until(
                    lambda: _registrations(emu, t_restart) >= {SERIAL, FUSE}, STEP_TIMEOUT_S
                ),
                result,
            )
            await timed(
                "kubelet restart to capacity back",
                emu.wait_until(
                    lambda: emu.node().allocatable() == {SERIAL: 3, FUSE: 4}, STEP_TIMEOUT_S
                ),
                result,
            )
            say.say(
                "   the plugin noticed and registered again after "
                f"{result.timings['kubelet restart to re-registered'] * 1000:.0f} ms; "
                "allocations survived through the checkpoint:"
            )
            say.block(node_text(emu.node().to_dict(), devices=False))

            say.step("What each container would get from the runtime")
            for pod in emu.pods():
                say.block(runtime_text(pod.to_dict(), with_table=False))

            say.step("Stopping the plugin with SIGTERM")
            await terminate_plugin(plugin, result)
            await emu.wait_until(lambda: emu.node().allocatable().get(SERIAL) == 0, STEP_TIMEOUT_S)
            leftovers = sorted(p.name for p in dp_dir.iterdir() if p.name.endswith(".sock"))
            say.say(
                f"   exit code {result.plugin_exit_code}; sockets left in the plugin dir: "
                f"{', '.join(leftovers)} (the kubelet's own); allocatable now 0"
            )
        finally:
            await kill_plugin(plugin)
            await emu.stop()
        check_plugin_exit(result, log_path)

    say.summary(result)
    say.say(f"   admitted: {', '.join(result.admitted)}; rejected: {', '.join(result.rejected)}")
    return result

"""The fake NVML backend: GPUs read from a JSON file, health events injected in or out of process.

The fake backend itself; the package :mod:`kubedevice.nvidia.fake` re-exports its public
face (everything in ``__all__``). Its parts are the package's other modules (machine files,
the synthetic format, load recordings, the control messages).

Three kinds of file are understood (see docs/nvidia-fake.md):

* an NVML recording of a real machine (``machines/h200.json``): what each NVML call
  answered, including the calls that answered NotSupported;
* a load recording (``machines/h200-load.json``): readings taken every 0.5 s while a
  CUDA workload ran. It holds no static facts, so alone it is played on the GPU of
  ``h200.json`` (same model and driver) carrying the identity (UUID, bus id, minor) of the
  machine it was recorded on; ``h200+h200-load`` plays it on the first GPU of ``h200``;
* a synthetic machine (``"format": "kubedevice-fake-nvml/v1"``): GPUs, MIG devices,
  NUMA nodes, PCIe switches, NVLink counts, a script of timed events.

Health events reach a blocked :meth:`FakeNvml.wait_event` three ways, none of them polled:
:meth:`FakeNvml.inject` / :meth:`FakeNvml.set_lost` in process, JSON datagrams on a
control socket (``KUBEDEVICE_FAKE_NVML_CONTROL`` or the file's ``control_socket``; see
:func:`send_control`), and the machine's script (timed from the first :meth:`watch`).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import os
import select
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from kubedevice.errors import ConfigError, NvmlError
from kubedevice.nvidia.backend import (
    DriverInfo,
    EventKind,
    GpuInfo,
    GpuInstance,
    GpuInstanceProfile,
    GpuSample,
    HealthEvent,
    Link,
    MigDeviceInfo,
    MigPlacement,
    ProcessSample,
)
from kubedevice.nvidia.fake.control import (
    CONTROL_ENV,
    _check_sample_values,
    _validate_message,
    bind_control_socket,
    drain_control,
    send_control,
)
from kubedevice.nvidia.fake.load import load_machine
from kubedevice.nvidia.fake.machine import (
    MACHINES_DIR,
    SYNTHETIC_FORMAT,
    FakeGpu,
    FakeMachine,
    ScriptStep,
    machine_names,
    resolve_machine_path,
)
from kubedevice.nvidia.fake.partitions import STATE_ENV, FakePartitions, profiles_for
from kubedevice.plugin.paths import inside

__all__ = [
    "CONTROL_ENV",
    "MACHINES_DIR",
    "SYNTHETIC_FORMAT",
    "FakeGpu",
    "FakeMachine",
    "FakeNvml",
    "ScriptStep",
    "load_machine",
    "machine_names",
    "resolve_machine_path",
    "send_control",
    "write_fake_dev",
    "write_fake_sysfs",
]

log = logging.getLogger(__name__)


class FakeNvml:
    """An :class:`~kubedevice.nvidia.backend.NvmlBackend` playing a :class:`FakeMachine`.

    ``wait_event`` blocks in ``poll()`` on a self-pipe (woken by :meth:`interrupt`,
    :meth:`inject`, :meth:`set_lost`) and the control socket, with the timeout cut short
    only for the next scripted step: it never polls in a loop.
    """

    def __init__(
        self,
        machine: FakeMachine,
        *,
        control_socket: str | Path | None = None,
        clock: Callable[[], float] = time.monotonic,
        state_file: str | Path | None = None,
    ) -> None:
        self.machine = machine
        env = os.environ.get(CONTROL_ENV)
        path = control_socket or env or machine.control_socket
        self.control_path: Path | None = Path(path) if path else None
        self._clock = clock
        self._lock = threading.Lock()
        self._gpus = {g.info.uuid: g for g in machine.gpus}
        self._mig_parent = {m.uuid: g.info.uuid for g in machine.gpus for m in g.mig}
        state = state_file or os.environ.get(STATE_ENV)
        #: The MIG devices made by :meth:`create_mig_device` (kept in ``state`` if given).
        self.partitions = FakePartitions(
            {g.info.uuid: g.info for g in machine.gpus}, Path(state) if state else None
        )
        self._initialised = False
        self._t0 = 0.0
        self._lost: set[str] = set()
        self._overrides: dict[str, dict[str, Any]] = {}
        self._watched: set[str] = set()
        self._events: collections.deque[HealthEvent] = collections.deque()
        self._interrupted = False
        self._script_t0: float | None = None
        self._script_next = 0
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._ctl: socket.socket | None = None
        self._closed = False

    @classmethod
    def from_file(cls, spec: str | Path, **kwargs: Any) -> FakeNvml:
        """Load a machine file (see :func:`load_machine`) and wrap it."""
        return cls(load_machine(spec), **kwargs)

    # ---- NvmlBackend

    def init(self) -> DriverInfo:
        """Start the fake: raise the machine's ``init_error``, if any; bind the control socket."""
        if self.machine.init_error:
            raise NvmlError(self.machine.init_error, f"fake machine {self.machine.name!r}")
        with self._lock:
            if not self._initialised:
                self._initialised = True
                self._t0 = self._clock()
                if self.control_path is not None and self._ctl is None:
                    self._ctl = bind_control_socket(self.control_path)
        return self.machine.driver

    def shutdown(self) -> None:
        """Stop the fake: close and remove the control socket; events are kept."""
        with self._lock:
            self._initialised = False
            self._close_control()

    def gpus(self) -> list[GpuInfo]:
        """The machine's GPUs, in index order."""
        self._enter()
        return sorted((g.info for g in self.machine.gpus), key=lambda i: i.index)

    def mig_devices(self, gpu_uuid: str) -> list[MigDeviceInfo]:
        """The GPU's MIG devices (empty when MIG is off)."""
        gpu = self._gpu(gpu_uuid)
        if not gpu.info.mig_enabled:
            return []
        return [*gpu.mig, *self.partitions.devices(gpu_uuid)]

    # ---- MigPartitioning

    def gpu_instance_profiles(self, gpu_uuid: str) -> list[GpuInstanceProfile]:
        """The GPU's instance profiles (an H100 80GB's or an H200's; none for others)."""
        return list(profiles_for(self._gpu(gpu_uuid).info))

    def gpu_instances(self, gpu_uuid: str) -> list[GpuInstance]:
        """The GPU instances made on the GPU (a machine file's MIG devices are not)."""
        gpu = self._gpu(gpu_uuid)
        return self.partitions.instances(gpu_uuid) if gpu.info.mig_enabled else []

    def create_mig_device(
        self, gpu_uuid: str, profile_id: int, placement: MigPlacement
    ) -> MigDeviceInfo:
        """Create a GPU instance and its compute instance (NVML's placement rules)."""
        gpu = self._gpu(gpu_uuid)
        return self.partitions.create(gpu_uuid, profile_id, placement, len(gpu.mig))

    def destroy_mig_device(self, gpu_uuid: str, gi_id: int) -> None:
        """Destroy a GPU instance made by :meth:`create_mig_device`."""
        self._gpu(gpu_uuid)
        self.partitions.destroy(gpu_uuid, gi_id)

    def _parent_of(self, uuid: str) -> str:
        return self._mig_parent.get(uuid) or self.partitions.parent_of(uuid) or uuid

    def link(self, uuid_a: str, uuid_b: str) -> Link | None:
        """The link between two GPUs; ``None`` for a recording (NVML answered NotSupported)."""
        self._gpu(uuid_a)
        self._gpu(uuid_b)
        if uuid_a == uuid_b:
            raise NvmlError("InvalidArgument", "link() needs two distinct GPUs", uuid_a)
        return self.machine.links.get(frozenset((uuid_a, uuid_b)))

    def sample(self, uuid: str) -> GpuSample:
        """The GPU's readings: the timeline entry now (if any), then set_sample() overrides."""
        if uuid in self._mig_parent:
            parent = self._gpu(self._mig_parent[uuid])
            mig = next(m for m in parent.mig if m.uuid == uuid)
            return GpuSample(memory_total=mig.memory_total)
        made = self.partitions.device(uuid)
        if made is not None:
            self._gpu(made.parent_uuid)
            return GpuSample(memory_total=made.memory_total)
        gpu = self._gpu(uuid)
        current = gpu.sample
        if gpu.timeline:
            step = int((self._clock() - self._t0) / gpu.timeline_period_s)
            current = gpu.timeline[step % len(gpu.timeline)]
        with self._lock:
            override = dict(self._overrides.get(uuid, {}))
        return dataclasses.replace(current, **override) if override else current

    def probe(self, uuid: str) -> None:
        """Raise ``GpuIsLost`` if the GPU (or a MIG device's parent) is lost."""
        self._gpu(self._parent_of(uuid))

    def watch(self, uuids: list[str]) -> None:
        """Register events for these GPUs (a MIG UUID stands for its parent GPU).

        A lost GPU yields a GPU_LOST event at once instead of failing the call.
        """
        self._enter()
        lost_now: list[str] = []
        with self._lock:
            self._watched = set()
            for u in dict.fromkeys(self._parent_of(u) for u in uuids):
                gpu = self._gpus.get(u)
                if gpu is None:
                    raise NvmlError("NotFound", "no such GPU", u)
                if not gpu.events_supported:
                    continue
                if u in self._lost:
                    lost_now.append(u)
                    continue
                self._watched.add(u)
            if self._script_t0 is None and uuids:
                self._script_t0 = time.monotonic()
            for u in lost_now:
                self._events.append(HealthEvent(EventKind.GPU_LOST, u, monotonic=time.monotonic()))
        if lost_now:
            self._wake()

    def wait_event(self, timeout_ms: int) -> HealthEvent | None:
        """Block until an event, :meth:`interrupt`, or the timeout (then ``None``)."""
        self._enter()
        deadline = time.monotonic() + max(timeout_ms, 0) / 1000.0
        poller = select.poll()
        poller.register(self._wake_r, select.POLLIN)
        ctl = self._ctl
        if ctl is not None:
            poller.register(ctl.fileno(), select.POLLIN)
        while True:
            self._run_script()
            with self._lock:
                if self._events:
                    event = self._events.popleft()
                    return dataclasses.replace(event, monotonic=time.monotonic())
                if self._interrupted:
                    self._interrupted = False
                    return None
                next_step = self._next_step_at()
            now = time.monotonic()
            remaining = deadline - now
            if remaining <= 0:
                return None
            wait = remaining if next_step is None else min(remaining, max(next_step - now, 0.0))
            ready = poller.poll(max(int(wait * 1000.0 + 0.999), 0))
            for fd, _ in ready:
                if fd == self._wake_r:
                    with contextlib.suppress(BlockingIOError):
                        os.read(self._wake_r, 4096)
                elif ctl is not None and fd == ctl.fileno():
                    drain_control(ctl, self.apply_control)

    def interrupt(self) -> None:
        """Make the current (or next) :meth:`wait_event` return ``None`` at once."""
        with self._lock:
            self._interrupted = True
        self._wake()

    # ---- in-process control

    def inject(self, event: HealthEvent) -> None:
        """Deliver a health event, as NVML would: dropped unless its GPU is watched."""
        with self._lock:
            parent = self._parent_of(event.uuid)
            if parent not in self._gpus:
                raise NvmlError("NotFound", "no such GPU or MIG device", event.uuid)
            if parent not in self._watched:
                log.debug("fake NVML: event for unwatched GPU dropped", extra={"uuid": event.uuid})
                return
            self._events.append(dataclasses.replace(event, monotonic=time.monotonic()))
        self._wake()

    def set_lost(self, uuid: str, lost: bool) -> None:
        """Make a GPU fall off the bus (calls raise ``GpuIsLost``, a GPU_LOST event) or return."""
        if uuid not in self._gpus:
            raise NvmlError("NotFound", "no such GPU", uuid)
        deliver = False
        with self._lock:
            if lost and uuid not in self._lost:
                self._lost.add(uuid)
                deliver = uuid in self._watched
                if deliver:
                    self._events.append(
                        HealthEvent(EventKind.GPU_LOST, uuid, monotonic=time.monotonic())
                    )
            elif not lost:
                self._lost.discard(uuid)
        if deliver:
            self._wake()

    def set_sample(self, uuid: str, **values: Any) -> None:
        """Override fields of the GPU's readings (GpuSample field names) until changed again."""
        if uuid not in self._gpus:
            raise NvmlError("NotFound", "no such GPU", uuid)
        try:
            _check_sample_values(values)
        except ConfigError as exc:
            raise ConfigError(f"set_sample: {exc}") from None
        if "processes" in values:
            values["processes"] = tuple(
                p if isinstance(p, ProcessSample) else ProcessSample(**p)
                for p in values["processes"]
            )
        with self._lock:
            self._overrides.setdefault(uuid, {}).update(values)

    def set_time_slice(self, uuid: str, level: int) -> None:
        """Set a GPU's time-slice level (0 default, 1 short, 2 medium, 3 long).

        What ``nvidia-smi compute-policy --set-timeslice`` does on a real GPU.

        Raises:
            NvmlError: no such GPU, or the GPU is lost (``GpuIsLost``).
        """
        if level not in (0, 1, 2, 3):
            raise NvmlError("InvalidArgument", f"time-slice level {level} is not 0-3", uuid)
        self._gpu(uuid)
        self.partitions.set_time_slice(uuid, level)

    def mps_control_command(self) -> list[str]:
        """The fake's MPS control daemon stand-in (:mod:`kubedevice.nvidia.fake.mps`)."""
        # the file itself, without site: it imports only the standard library (starts in ms)
        return [sys.executable, "-S", str(Path(__file__).with_name("mps.py"))]

    def time_slice(self, uuid: str) -> int:
        """A GPU's time-slice level (0 until set)."""
        return self.partitions.time_slice(uuid)

    def reboot(self) -> None:
        """Play a reboot of the GPUs: every MIG instance made is gone, every time-slice
        level is Default (kept so in the state file, if there is one)."""
        self.partitions.reboot()

    def apply_control(self, message: Mapping[str, Any]) -> None:
        """Act on one control message (the JSON of :func:`send_control`).

        Raises:
            ConfigError: the message is malformed (op, uuid, xid or values).
        """
        _validate_message(self.machine, message)
        op, uuid = message["op"], str(message["uuid"])
        if op == "xid":
            self.inject(HealthEvent(EventKind.XID, uuid, xid=int(message["xid"])))
        elif op == "ecc":
            self.inject(HealthEvent(EventKind.ECC_DOUBLE_BIT, uuid))
        elif op == "lost":
            self.set_lost(uuid, True)
        elif op == "recover":
            self.set_lost(uuid, False)
        else:
            self.set_sample(uuid, **dict(message["values"]))

    def close(self) -> None:
        """Release everything (the control socket and the wake pipe); the fake is unusable after."""
        with self._lock:
            self._initialised = False
            self._close_control()
            if not self._closed:
                self._closed = True
                os.close(self._wake_r)
                os.close(self._wake_w)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    # ---- internals

    def _enter(self) -> None:
        if not self._initialised:
            raise NvmlError("Uninitialized", "the fake NVML backend is not initialised")
        self._run_script()

    def _gpu(self, uuid: str) -> FakeGpu:
        self._enter()
        gpu = self._gpus.get(uuid)
        if gpu is None:
            raise NvmlError("NotFound", "no such GPU", uuid)
        with self._lock:
            lost = uuid in self._lost
        if lost:
            raise NvmlError("GpuIsLost", "the GPU has fallen off the bus", uuid)
        return gpu

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._wake_w, b"!")

    def _next_step_at(self) -> float | None:
        if self._script_t0 is None or self._script_next >= len(self.machine.script):
            return None
        return self._script_t0 + self.machine.script[self._script_next].at_ms / 1000.0

    def _run_script(self) -> None:
        while True:
            with self._lock:
                at = self._next_step_at()
                if at is None or at > time.monotonic():
                    return
                step = self.machine.script[self._script_next]
                self._script_next += 1
            self.apply_control(step.message)

    def _close_control(self) -> None:
        if self._ctl is not None:
            self._ctl.close()
            self._ctl = None
            if self.control_path is not None:
                with contextlib.suppress(OSError):
                    self.control_path.unlink()


def _machine_of(machine: FakeMachine | FakeNvml) -> FakeMachine:
    return machine.machine if isinstance(machine, FakeNvml) else machine


def write_fake_sysfs(machine: FakeMachine | FakeNvml, root: Path) -> None:
    """Create each GPU's PCI device in a fake sysfs, shaped as the kernel lays it out.

    The device lives at ``<root>/devices/pci<domain>:<NN>/<bus id>/`` (with ``numa_node``,
    ``vendor`` and ``class``), one root complex per ``host_bridge`` name (numbered in order
    of appearance; a GPU without one gets a root of its own), and
    ``<root>/bus/pci/devices/<bus id>`` is a relative symlink to it, so readers of the
    PCIe root (``resource.kubernetes.io/pcieRoot``) and of the NUMA node both work.

    Raises:
        ConfigError: A bus ID would leave ``root`` (``..``, an absolute path).
    """
    roots: dict[str, int] = {}
    for pos, g in enumerate(_machine_of(machine).gpus):
        bus_id = g.info.pci_bus_id
        link = inside(root / "bus" / "pci" / "devices", bus_id, "PCI bus ID")
        key = g.host_bridge if g.host_bridge is not None else f"\0gpu{pos}"
        number = roots.setdefault(key, len(roots))
        domain = bus_id.split(":", 1)[0][-4:]
        rel = Path("devices", f"pci{domain}:{number:02x}", bus_id)
        d = root / rel
        d.mkdir(parents=True, exist_ok=True)
        numa = -1 if g.numa_node is None else g.numa_node
        (d / "numa_node").write_text(f"{numa}\n")
        (d / "vendor").write_text("0x10de\n")
        (d / "class").write_text("0x030200\n")
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.is_symlink():
            link.symlink_to(Path("..", "..", "..", rel))


def write_fake_dev(machine: FakeMachine | FakeNvml, root: Path) -> list[Path]:
    """Create the machine's device nodes under ``root`` as empty regular files; return them.

    ``/dev/nvidia0`` becomes ``<root>/nvidia0``; ``/dev/nvidia-caps/nvidia-cap1``
    becomes ``<root>/nvidia-caps/nvidia-cap1``.

    Raises:
        ConfigError: A node would leave ``root`` (``..`` in it); nothing is written for it.
    """
    made: list[Path] = []
    for node in _machine_of(machine).dev_nodes:
        rel = node.removeprefix("/dev/").lstrip("/")
        if not rel or rel == "nvidia-caps":
            (root / "nvidia-caps").mkdir(parents=True, exist_ok=True)
            continue
        p = inside(root, rel, "device node")
        p.parent.mkdir(parents=True, exist_ok=True)
        p.touch()
        made.append(p)
    return made

"""GPU health: the policy state machine, and the one thread that blocks in the NVML event wait.

:class:`HealthState` is pure logic driven by :class:`~kubedevice.nvidia.backend.HealthEvent`
values, probe results and the clock (tested without threads). :class:`HealthMonitor`
runs it: one thread blocks in ``backend.wait_event()`` (no polling loop) and hands each
event to the event loop with ``call_soon_threadsafe``; timers on the loop schedule the
recovery probes. Policies per event:

* ``ignore``: nothing changes (the XID is still counted in the metrics).
* ``quiet``: Unhealthy; once ``quietPeriod`` has passed with no further event for that GPU
  it is probed, and Healthy again if it answers with no row remapping pending or failed
  (else another quiet period).
* ``reset``: Unhealthy until the GPU has been reset: probed every ``resetCheckInterval``,
  Healthy again once it answers after having stopped answering (fell off the bus and
  came back). A lost GPU always follows this policy.

Only the GPU (or MIG device) concerned changes; an NVML failure never ends the thread.

A GPU that stays bad costs little: it is probed again at most every
:data:`MIN_RECHECK_S` whatever ``quietPeriod`` or ``resetCheckInterval`` say, and the log
gets one line per GPU per state change (Unhealthy, escalated to reset, Healthy again);
further events on an Unhealthy GPU, ignored XIDs after the first of each code and failed
probes after the first are counted and summed up in one line at most every
:data:`SUMMARY_INTERVAL_S` and when the GPU is Healthy again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal, Protocol

from kubedevice.errors import NvmlError
from kubedevice.nvidia.backend import EventKind, HealthEvent, NvmlBackend
from kubedevice.nvidia.config import HealthConfig

__all__ = ["MIN_RECHECK_S", "SUMMARY_INTERVAL_S", "HealthMonitor", "HealthSink", "HealthState"]

log = logging.getLogger(__name__)

#: The shortest time between two recovery probes of one GPU, whatever the config says.
MIN_RECHECK_S = 0.1
#: At most one summary line per GPU this often while events keep coming.
SUMMARY_INTERVAL_S = 60.0


class HealthSink(Protocol):
    """Where health facts go besides the device lists (the per-GPU metrics)."""

    def record_xid(self, uuid: str, xid: int) -> None: ...

    def set_health(self, uuid: str, healthy: bool) -> None: ...


@dataclass(slots=True)
class _Bad:
    policy: Literal["quiet", "reset"]
    reason: str
    next_check: float
    seen_down: bool = False
    kind: str = "unhealthy"  # what the reason is, for a DRA taint: xid, ecc, gpu-lost, ...
    code: str = ""  # which one (the XID number), or empty


class HealthState:
    """Which GPUs and MIG devices are Unhealthy, why, and when to probe them again.

    Args:
        config: The health policies.
        parents: Every known UUID (GPUs and MIG devices) -> its physical GPU's UUID.
    """

    def __init__(self, config: HealthConfig, parents: Mapping[str, str]) -> None:
        self.config = config
        self.parents = dict(parents)
        self._bad: dict[str, _Bad] = {}
        self._quiet = _QuietLog()

    def unhealthy(self) -> dict[str, str]:
        """UUID -> reason, for every UUID marked Unhealthy (a GPU marks its MIG devices too)."""
        out = {uuid: bad.reason for uuid, bad in self._bad.items()}
        for uuid, parent in self.parents.items():
            if uuid not in out and parent in self._bad:
                out[uuid] = self._bad[parent].reason
        return out

    def faults(self) -> dict[str, tuple[str, str, str]]:
        """UUID -> (kind, code, reason) for every UUID marked Unhealthy (as :meth:`unhealthy`).

        Kinds: ``xid`` (code: the XID number), ``ecc`` (double-bit ECC), ``gpu-lost``,
        ``nvml-error``.
        """
        out = {uuid: (bad.kind, bad.code, bad.reason) for uuid, bad in self._bad.items()}
        for uuid, parent in self.parents.items():
            if uuid not in out and parent in self._bad:
                bad = self._bad[parent]
                out[uuid] = (bad.kind, bad.code, bad.reason)
        return out

    def healthy(self, uuid: str) -> bool:
        """Whether a GPU or MIG device is Healthy (its GPU too, for a MIG device)."""
        return uuid not in self._bad and self.parents.get(uuid, uuid) not in self._bad

    def on_event(self, event: HealthEvent, now: float) -> bool:
        """Apply one NVML event; return whether any health changed."""
        uuid = event.uuid
        if uuid not in self.parents:
            if self._quiet.first(uuid, "unknown device"):  # once per device, not per event
                log.warning("health event for an unknown device %s ignored: %s", uuid, event)
            return False
        code = ""
        if event.kind is EventKind.XID:
            if event.xid is None:  # an NVML failure reported for this GPU
                policy, reason, kind = self.config.default_policy, "NVML error", "nvml-error"
            else:
                policy, reason = self.config.policy_for_xid(event.xid), f"XID {event.xid}"
                kind, code = "xid", str(event.xid)
        elif event.kind is EventKind.ECC_DOUBLE_BIT:
            policy = self.config.double_bit_ecc_policy
            reason, kind = "double-bit ECC error", "ecc"
        else:
            policy = "reset"
            reason, kind = "GPU lost (fell off the bus)", "gpu-lost"
        if policy == "ignore":
            if self._quiet.first(uuid, reason):
                log.info("%s on %s ignored by policy", reason, uuid)
            else:
                self._quiet.count(uuid, reason, now)
            return False
        was_healthy = self.healthy(uuid)
        bad = self._bad.get(uuid)
        strongest: Literal["quiet", "reset"] = (
            "reset" if policy == "reset" or (bad is not None and bad.policy == "reset") else "quiet"
        )
        wait = (
            self.config.reset_check_interval if strongest == "reset" else self.config.quiet_period
        )
        if bad is not None and bad.policy == strongest:  # no state change: counted, not logged
            if policy == strongest:
                bad.reason, bad.kind, bad.code = reason, kind, code
            bad.next_check = max(now + wait, bad.next_check)
            bad.seen_down = bad.seen_down or event.kind is EventKind.GPU_LOST
            self._quiet.count(uuid, reason, now)
            return False
        new = bad is None or policy == strongest
        self._bad[uuid] = _Bad(
            policy=strongest,
            reason=reason if new or bad is None else bad.reason,
            next_check=now + wait,
            seen_down=(bad is not None and bad.seen_down) or event.kind is EventKind.GPU_LOST,
            kind=kind if new or bad is None else bad.kind,
            code=code if new or bad is None else bad.code,
        )
        log.warning(
            "%s on %s: Unhealthy until %s",
            reason,
            uuid,
            "the GPU is reset" if strongest == "reset" else "a quiet period passes and it answers",
        )
        return was_healthy

    def _healthy_again(self, uuid: str, how: str) -> None:
        del self._bad[uuid]
        self._quiet.flush(uuid, "while it was Unhealthy")
        log.info("%s %s: Healthy again", uuid, how)

    def due(self, now: float) -> list[str]:
        """UUIDs whose recovery probe is due at ``now``."""
        return [uuid for uuid, bad in self._bad.items() if bad.next_check <= now]

    def next_check(self) -> float | None:
        """When the next probe is due (monotonic seconds), ``None`` if none is pending."""
        return min((b.next_check for b in self._bad.values()), default=None)

    def probe_target(self, uuid: str) -> str:
        """The GPU to probe for ``uuid`` (its physical GPU)."""
        return self.parents.get(uuid, uuid)

    def on_probe(self, uuid: str, ok: bool, now: float) -> bool:
        """Apply a recovery probe's result; return whether ``uuid`` became Healthy."""
        bad = self._bad.get(uuid)
        if bad is None:
            return False
        if bad.policy == "quiet":
            if ok:
                self._healthy_again(uuid, "answers after a quiet period")
                return True
            bad.next_check = now + max(self.config.quiet_period, MIN_RECHECK_S)
            return False
        if not ok:
            bad.seen_down = True
        elif bad.seen_down:
            self._healthy_again(uuid, "answers again after a reset")
            return True
        bad.next_check = now + max(self.config.reset_check_interval, MIN_RECHECK_S)
        return False


class _QuietLog:
    """Counts what is not logged line by line, per GPU, and sums it up now and then."""

    def __init__(self) -> None:
        self._seen: set[tuple[str, str]] = set()
        self._counts: dict[str, dict[str, int]] = {}
        self._last: dict[str, float] = {}

    def first(self, uuid: str, what: str) -> bool:
        """True the first time ``what`` happens to ``uuid`` (then it is logged)."""
        if (uuid, what) in self._seen:
            return False
        if len(self._seen) < 100_000:  # bounded, whatever codes arrive
            self._seen.add((uuid, what))
        return True

    def count(self, uuid: str, what: str, now: float) -> None:
        """Count one unlogged ``what``; log the summary if the last is old enough."""
        counts = self._counts.setdefault(uuid, {})
        key = what if what in counts or len(counts) < 20 else "other events"
        counts[key] = counts.get(key, 0) + 1
        last = self._last.setdefault(uuid, now)
        if now - last >= SUMMARY_INTERVAL_S:
            self.flush(uuid, f"in the last {now - last:.0f} s")
            self._last[uuid] = now

    def flush(self, uuid: str, when: str) -> None:
        """Log what was counted for ``uuid`` (if anything) in one line."""
        counts = self._counts.pop(uuid, None)
        self._last.pop(uuid, None)
        if counts:
            total = sum(counts.values())
            detail = ", ".join(f"{what} x{n}" for what, n in counts.items())
            log.warning("%s: %d more health event(s) %s: %s", uuid, total, when, detail)


class HealthMonitor:
    """Runs a :class:`HealthState` on a backend: the event thread and the recovery probes.

    Create and use it on the event loop that ``on_change`` must run on.

    Args:
        backend: The NVML backend (initialised).
        state: The state machine (its ``parents`` are the UUIDs watched).
        on_change: Called on the loop after any health change.
        sink: Receives XIDs and health per UUID (the GPU metrics), or ``None``.
        wait_timeout_ms: Longest single ``wait_event``. Both backends end a wait on
            ``interrupt()`` (the fake at once, real NVML at the end of its current wait
            slice); :meth:`stop` gives the thread this long plus 1 s before leaving it.
    """

    def __init__(
        self,
        backend: NvmlBackend,
        state: HealthState,
        on_change: Callable[[], None],
        *,
        sink: HealthSink | None = None,
        wait_timeout_ms: int = 1000,
    ) -> None:
        self.backend = backend
        self.state = state
        self._on_change = on_change
        self.sink = sink
        self._timeout_ms = wait_timeout_ms
        self._loop = asyncio.get_running_loop()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._probing: asyncio.Task[None] | None = None
        self._silent: set[str] = set()  # GPUs whose failed probe was logged already

    async def start(self) -> None:
        """Register the GPUs' events and start the event thread."""
        gpus = sorted(set(self.state.parents.values()))
        try:
            await asyncio.to_thread(self.backend.watch, gpus)
        except NvmlError as exc:
            log.error("cannot register NVML health events (%s); health events are off", exc)
            return
        self._thread = threading.Thread(target=self._run, name="nvml-events", daemon=True)
        self._thread.start()

    async def stop(self, grace: float | None = None) -> bool:
        """Stop the thread (``interrupt()`` ends its wait) and the timers.

        Args:
            grace: How long to wait for the thread; ``None``: its whole wait (the wait
                timeout plus 1 s). Real NVML cannot be woken: a thread still blocked in
                ``nvmlEventSetWait`` after ``grace`` is left there (a daemon thread, it
                ends with the process, or at the end of its wait slice).

        Returns:
            Whether the thread has ended (``False``: it is still in the NVML wait, and
            NVML must not be shut down under it).
        """
        self._stop.set()
        with contextlib.suppress(Exception):
            self.backend.interrupt()
        if self._timer is not None:
            self._timer.cancel()
        if self._probing is not None:
            self._probing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._probing
        thread = self._thread
        if thread is None:
            return True
        if thread.is_alive():
            limit = self._timeout_ms / 1000 + 1.0 if grace is None else grace
            await asyncio.to_thread(thread.join, limit)
        if thread.is_alive():
            if grace is None:
                log.warning("the NVML event thread did not stop in time; leaving it")
            else:
                log.debug("the NVML event thread is still in its wait; leaving it")
            return False
        return True

    # ---- the thread ------------------------------------------------------------------

    def _run(self) -> None:
        failures = 0  # consecutive failed waits: back off so a broken GPU cannot spin us
        while not self._stop.is_set():
            try:
                event = self.backend.wait_event(self._timeout_ms)
                failures = 0
            except NvmlError as exc:
                failures += 1
                if exc.uuid is None:
                    log.error("NVML event wait failed: %s; retrying in 1 s", exc)
                    self._stop.wait(1.0)
                    continue
                kind = EventKind.GPU_LOST if exc.code == "GpuIsLost" else EventKind.XID
                event = HealthEvent(kind, exc.uuid, None, time.monotonic())
                if failures == 1:
                    log.error("NVML failed on %s: %s", exc.uuid, exc)
            except Exception:
                log.exception("NVML event wait failed unexpectedly; retrying in 1 s")
                self._stop.wait(1.0)
                continue
            if event is not None and not self._stop.is_set():
                try:
                    self._loop.call_soon_threadsafe(self._handle, event)
                except RuntimeError:  # the loop is closed: we are shutting down
                    return
            if failures:
                self._stop.wait(min(0.01 * 2**failures, 1.0))

    # ---- on the loop -----------------------------------------------------------------

    def _handle(self, event: HealthEvent) -> None:
        if self.sink is not None and event.kind is EventKind.XID and event.xid is not None:
            self.sink.record_xid(self.state.probe_target(event.uuid), event.xid)
        if self.state.on_event(event, time.monotonic()):
            self._changed()
        self._schedule()

    def _changed(self) -> None:
        if self.sink is not None:
            bad = self.state.unhealthy()
            for gpu in set(self.state.parents.values()):
                self.sink.set_health(gpu, gpu not in bad)
        self._on_change()

    def _schedule(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        when = self.state.next_check()
        if when is None or self._stop.is_set():
            return
        loop_now = self._loop.time()
        delay = max(when - time.monotonic(), 0.0)
        self._timer = self._loop.call_at(loop_now + delay, self._recheck)

    def _recheck(self) -> None:
        self._timer = None
        if self._probing is not None and not self._probing.done():
            return
        self._probing = self._loop.create_task(self._probe_due(), name="nvml: recovery probes")

    def _probe(self, gpu: str) -> bool:
        """Whether the GPU answers and needs no reset (blocking; in a worker thread).

        A GPU with row remapping pending or failed (after uncorrectable memory errors)
        answers NVML but is not fit for work until it is reset.
        """
        try:
            self.backend.probe(gpu)
            sample = self.backend.sample(gpu)
        except NvmlError as exc:
            if gpu not in self._silent:
                self._silent.add(gpu)
                log.info("%s does not answer yet: %s (logged once until it does)", gpu, exc)
            return False
        except Exception:
            log.exception("probing %s failed unexpectedly", gpu)
            return False
        if sample.remapped_rows_pending or sample.remapped_rows_failure:
            if gpu not in self._silent:
                self._silent.add(gpu)
                log.info("%s answers but its memory rows need remapping: it needs a reset", gpu)
            return False
        self._silent.discard(gpu)
        return True

    async def _probe_due(self) -> None:
        changed = False
        for uuid in self.state.due(time.monotonic()):
            target = self.state.probe_target(uuid)
            ok = await asyncio.to_thread(self._probe, target)
            changed |= self.state.on_probe(uuid, ok, time.monotonic())
        if changed:
            self._changed()
        self._schedule()

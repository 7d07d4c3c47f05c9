"""One conformance run: the emulator plus the plugin process, driven through every case.

Phases, in order: start-up and registration; per resource the device list, options,
Allocate and GetPreferredAllocation cases; a dropped ListAndWatch stream; a simulated
kubelet restart; SIGTERM. Every wait is on an emulator event or the process exit, with the
contract's limit (capped by ``timeout``) as its deadline: a good plugin is checked in
about a second. Never imports the SDK; the plugin is a black box behind its socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import stat
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from kubedevice._api import HEALTHY, KUBELET_SOCKET, VERSION
from kubedevice.conformance.catalogue import CASES, CASES_BY_ID
from kubedevice.conformance.probe import ProbeClient, rpc_error_text
from kubedevice.conformance.process import PluginProcess
from kubedevice.conformance.report import CaseResult, Outcome, Report
from kubedevice.conformance.validate import (
    allocate_response_problems,
    device_list_problems,
    endpoint_problems,
    preferred_problems,
    resource_name_problems,
)
from kubedevice.kubelet import (
    Emulator,
    KubeletStartedEvent,
    ListAndWatchEvent,
    PluginEndpoint,
    PluginOptions,
    RegistrationEvent,
    RpcEvent,
    StreamEndEvent,
)

__all__ = ["check_plugin", "run_conformance"]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Contract limits (seconds); each wait uses min(limit, timeout).
FIRST_LIST_S = 5.0
REREGISTER_MUST_S = 30.0
REREGISTER_SHOULD_S = 1.0
RECOVERY_S = 10.0
SIGTERM_S = 5.0
RPC_S = 5.0
DIAL_S = 10.0
#: Tolerance when comparing a socket's ctime with the Register arrival time.
CTIME_SLACK_S = 0.005
#: How long after registrations settle the kit waits for another resource to register.
DISCOVERY_WINDOW_S = 0.3


def _fmt(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"


def _opts(o: PluginOptions | None) -> str:
    if o is None:
        return "none"
    return (
        f"pre_start_required={o.pre_start_required}, "
        f"get_preferred_allocation_available={o.get_preferred_allocation_available}"
    )


@dataclass
class _Resource:
    """What the run learned about one registered resource."""

    name: str
    first_reg: RegistrationEvent
    ok_reg: RegistrationEvent | None = None
    devices: list[tuple[str, str]] | None = None
    options: PluginOptions | None = None
    healthy: list[str] = field(default_factory=list)
    unhealthy: list[str] = field(default_factory=list)


class _Run:
    """The state of one run; each ``_phase_*`` method adds case results."""

    def __init__(
        self,
        command: Sequence[str],
        *,
        timeout: float,
        startup_timeout: float,
        log_path: Path,
        root: Path,
    ) -> None:
        self.command = tuple(command)
        self.timeout = timeout
        self.startup_timeout = startup_timeout
        self.root = root
        self.dir = root / "dp"
        self.dir.mkdir(mode=0o750)
        self.log_path = log_path
        self.emu = Emulator(
            self.dir,
            control_socket=False,
            pod_resources_socket=root / "pr" / "kubelet.sock",
            dial_timeout_s=self._cap(DIAL_S),
        )
        self.proc = PluginProcess(command, self.dir, log_path)
        self.results: list[CaseResult] = []
        self.resources: dict[str, _Resource] = {}
        #: monotonic time each registered endpoint's socket was created (from its ctime).
        self.created: dict[str, float | None] = {}
        self._mono_offset = time.time() - time.monotonic()

    # ------------------------------------------------------------------ helpers

    def _cap(self, limit: float) -> float:
        return min(limit, self.timeout)

    def add(
        self,
        case_id: str,
        outcome: Outcome,
        evidence: str,
        resource: str | None = None,
        started: float | None = None,
    ) -> None:
        duration = 0.0 if started is None else time.monotonic() - started
        self.results.append(CaseResult(CASES_BY_ID[case_id], outcome, evidence, resource, duration))

    def skip_rest(self, resource: str, case_ids: Sequence[str], why: str) -> None:
        for case_id in case_ids:
            self.add(case_id, Outcome.SKIP, why, resource)

    async def wait(self, predicate: Callable[[], object], limit: float) -> bool:
        """Wait for ``predicate()`` on emulator events; also wakes when the plugin exits.

        Returns the predicate's final truth (False on timeout or exit without it).
        """
        if predicate() or limit <= 0:
            return bool(predicate())
        waiter = asyncio.ensure_future(self.emu.wait_until(lambda: bool(predicate()), limit))
        exited = asyncio.ensure_future(self.proc.wait_exit(limit))
        try:
            await asyncio.wait({waiter, exited}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for fut in (waiter, exited):
                fut.cancel()
                with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                    await fut
        return bool(predicate())

    async def bounded(self, aw: Awaitable[T], limit: float) -> T:
        return await asyncio.wait_for(aw, limit)

    def regs(
        self, resource: str | None = None, since: float | None = None
    ) -> list[RegistrationEvent]:
        """Registration events (optionally of one resource, since a time), in order."""
        found = [
            r
            for r in self.emu.events.of_type(RegistrationEvent, since)
            if resource is None or r.resource == resource
        ]
        for reg in found:
            if reg.endpoint not in self.created:
                self.created[reg.endpoint] = self._created_at(reg.endpoint)
        return found

    def _created_at(self, endpoint: str) -> float | None:
        """When the endpoint's socket was created, on the monotonic clock (None: absent).

        Taken from the inode's change time (a coarse clock that can only read early),
        moments after the Register event is recorded, so a socket that appeared after
        Register arrived is caught without racing the plugin.
        """
        try:
            ctime = (self.dir / endpoint).lstat().st_ctime_ns / 1e9
        except (OSError, ValueError):
            return None
        return ctime - self._mono_offset

    def endpoint(self, resource: str) -> PluginEndpoint:
        return self.emu.endpoint(resource)

    def exit_text(self) -> str:
        return f"plugin process exited with code {self.proc.returncode}"

    # ------------------------------------------------------------------ the run

    async def run(self) -> None:
        await self.emu.start()
        try:
            await self.proc.start()
            try:
                await self._phases()
            finally:
                await self.proc.kill()
        finally:
            await self.emu.stop()

    async def _phases(self) -> None:
        if not await self._phase_registration():
            return
        for res in self.resources.values():
            await self._phase_resource(res)
        await self._phase_stream_kill()
        await self._phase_restart()
        await self._phase_sigterm()

    # ------------------------------------------------------------------ registration

    async def _phase_registration(self) -> bool:
        started = time.monotonic()
        await self.wait(lambda: bool(self.regs()), self.startup_timeout)
        if not self.regs():
            why = (
                f"{self.exit_text()} before registering"
                if not self.proc.alive
                else f"no Register call within {_fmt(self.startup_timeout)}"
            )
            self.add("serves-before-register", Outcome.SKIP, "no Register call to judge")
            self.add("registration-valid", Outcome.FAIL, why, started=started)
            for case in CASES[2:]:
                self.add(case.id, Outcome.SKIP, "no resource registered")
            return False
        # Discovery: keep collecting resources until no new one registers for a short window.
        while True:
            known = frozenset(r.resource for r in self.regs())

            def new(known: frozenset[str] = known) -> bool:
                return bool({r.resource for r in self.regs()} - known)

            def settled(known: frozenset[str] = known) -> bool:
                return new() or all(self._settled(name) for name in known)

            await self.wait(settled, self._cap(FIRST_LIST_S))
            if not new():
                await self.wait(new, DISCOVERY_WINDOW_S)
            if not new():
                break
        for reg in self.regs():
            if reg.resource not in self.resources:
                self.resources[reg.resource] = _Resource(reg.resource, reg)
        for res in self.resources.values():
            res.ok_reg = next((r for r in self.regs(res.name) if r.ok), None)
        return True

    def _settled(self, resource: str) -> bool:
        """Settled: registered with a first list, or its latest registration was refused."""
        regs = self.regs(resource)
        ok = next((r for r in regs if r.ok), None)
        if ok is None:
            return bool(regs) and not regs[-1].ok
        return any(e.resource == resource for e in self.emu.events.of_type(ListAndWatchEvent, ok.t))

    # ------------------------------------------------------------------ per resource

    async def _phase_resource(self, res: _Resource) -> None:
        name = res.name
        self._case_serves_first(res)
        self._case_registration_valid(res)
        rest = [
            "first-list-within-5s",
            "device-list-valid",
            "options-honest",
            "allocate-healthy",
            "allocate-unknown-refused",
            "allocate-unhealthy-refused",
            "preferred-allocation",
        ]
        if res.ok_reg is None:
            self.skip_rest(name, rest, "the resource never registered successfully")
            return
        if not await self._case_first_list(res):
            self.skip_rest(name, rest[1:], "no ListAndWatch message to work from")
            return
        await self._case_device_list(res)
        if res.devices is None:
            self.skip_rest(name, rest[2:], "the device list could not be read")
            return
        await self._case_options(res)
        await self._case_allocate_healthy(res)
        await self._case_allocate_refused(res, unknown=True)
        await self._case_allocate_refused(res, unknown=False)
        await self._case_preferred(res)

    def _case_serves_first(self, res: _Resource) -> None:
        reg = res.first_reg
        created = self.created.get(reg.endpoint)
        if created is None:
            self.add(
                "serves-before-register",
                Outcome.FAIL,
                f"Register named endpoint {reg.endpoint!r}, but no such socket existed "
                f"({reg.error or 'not in the device plugin dir'})",
                res.name,
            )
        elif created > reg.t + CTIME_SLACK_S:
            self.add(
                "serves-before-register",
                Outcome.FAIL,
                f"Register arrived {_fmt(created - reg.t)} before socket {reg.endpoint!r} "
                "was created",
                res.name,
            )
        elif reg.error is not None and reg.error.startswith("failed to dial"):
            self.add(
                "serves-before-register",
                Outcome.FAIL,
                f"socket {reg.endpoint!r} existed but did not answer: {reg.error}",
                res.name,
            )
        else:
            self.add(
                "serves-before-register",
                Outcome.PASS,
                f"socket {reg.endpoint!r} existed {_fmt(reg.t - created)} before Register "
                "arrived" + (" and answered the dial" if reg.dialed else ""),
                res.name,
            )

    def _case_registration_valid(self, res: _Resource) -> None:
        problems: list[str] = []
        for reg in self.regs(res.name):
            if reg.version != VERSION:
                problems.append(f"version {reg.version!r} (must be {VERSION!r})")
            if "/" in reg.endpoint or not reg.endpoint:
                problems += endpoint_problems(reg.endpoint, self.dir)
            problems += resource_name_problems(reg.resource)
            if problems:
                break
        if not problems and res.ok_reg is None:
            problems.append(f"the kubelet refused it: {res.first_reg.error}")
        if not problems and res.ok_reg is not None:
            # The socket must be there now, as a socket, unless the plugin already moved on.
            cur = self._current_endpoint_name(res.name) or res.ok_reg.endpoint
            problems += endpoint_problems(cur, self.dir)
        if problems:
            self.add("registration-valid", Outcome.FAIL, f"Register: {problems[0]}", res.name)
            return
        assert res.ok_reg is not None
        self.add(
            "registration-valid",
            Outcome.PASS,
            f"version {VERSION}, endpoint {res.ok_reg.endpoint!r}, name {res.name!r} accepted",
            res.name,
        )

    def _current_endpoint_name(self, resource: str) -> str | None:
        try:
            return self.endpoint(resource).socket_path.name
        except Exception:
            return None

    async def _case_first_list(self, res: _Resource) -> bool:
        assert res.ok_reg is not None
        t_reg = res.ok_reg.t
        limit = self._cap(FIRST_LIST_S)

        def first() -> ListAndWatchEvent | None:
            return next(
                (
                    e
                    for e in self.emu.events.of_type(ListAndWatchEvent, t_reg)
                    if e.resource == res.name
                ),
                None,
            )

        remaining = max(0.0, t_reg + limit - time.monotonic())
        await self.wait(lambda: first() is not None, remaining)
        msg = first()
        if msg is None or msg.t - t_reg > limit:
            what = f"{self.exit_text()}; " if not self.proc.alive else ""
            self.add(
                "first-list-within-5s",
                Outcome.FAIL,
                f"{what}no ListAndWatch message within {_fmt(limit)} of registration",
                res.name,
            )
            return False
        self.add(
            "first-list-within-5s",
            Outcome.PASS,
            f"first message {_fmt(msg.t - t_reg)} after registration: "
            f"{msg.devices} devices, {msg.healthy} healthy",
            res.name,
        )
        return True

    async def _case_device_list(self, res: _Resource) -> None:
        started = time.monotonic()
        sock = self.endpoint(res.name).socket_path
        try:
            async with ProbeClient(sock, rpc_timeout=self._cap(RPC_S)) as probe:
                devices = await probe.first_list(self._cap(FIRST_LIST_S))
        except (Exception, TimeoutError) as exc:
            self.add(
                "device-list-valid",
                Outcome.FAIL,
                f"a new ListAndWatch stream gave no first message: {rpc_error_text(exc)}",
                res.name,
                started,
            )
            return
        res.devices = devices
        res.healthy = [i for i, h in devices if h == HEALTHY]
        res.unhealthy = [i for i, h in devices if h != HEALTHY]
        problems = device_list_problems(devices)
        if problems:
            more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
            self.add("device-list-valid", Outcome.FAIL, problems[0] + more, res.name, started)
        else:
            self.add(
                "device-list-valid",
                Outcome.PASS,
                f"{len(devices)} unique IDs; {len(res.healthy)} Healthy, "
                f"{len(res.unhealthy)} Unhealthy",
                res.name,
                started,
            )

    async def _case_options(self, res: _Resource) -> None:
        started = time.monotonic()
        assert res.ok_reg is not None
        reg = res.ok_reg
        opts = reg.options
        res.options = opts
        if opts is None:
            self.add("options-honest", Outcome.FAIL, "no GetDevicePluginOptions answer", res.name)
            return
        if reg.request_options != opts:
            self.add(
                "options-honest",
                Outcome.FAIL,
                f"RegisterRequest.options ({_opts(reg.request_options)}) differ from "
                f"GetDevicePluginOptions ({_opts(opts)})",
                res.name,
                started,
            )
            return
        ep = self.endpoint(res.name)
        checked: list[str] = []
        ids = res.healthy[:1] or [i for i, _ in (res.devices or [])[:1]]
        try:
            if opts.get_preferred_allocation_available:
                avail = res.healthy or ids
                await self.bounded(
                    ep.get_preferred_allocation(avail, [], min(1, len(avail))), self._cap(RPC_S)
                )
                checked.append("GetPreferredAllocation")
            if opts.pre_start_required:
                await self.bounded(ep.pre_start(ids), self._cap(RPC_S))
                checked.append("PreStartContainer")
        except Exception as exc:
            rpc = getattr(exc, "rpc", "an advertised RPC")
            self.add(
                "options-honest",
                Outcome.FAIL,
                f"{rpc} is advertised but failed: {getattr(exc, 'code', '')} "
                f"{getattr(exc, 'details', rpc_error_text(exc))}".rstrip(),
                res.name,
                started,
            )
            return
        answered = " and ".join(checked) + " answered" if checked else "no optional RPC advertised"
        self.add("options-honest", Outcome.PASS, f"{_opts(opts)}; {answered}", res.name, started)

    async def _allocate(self, res: _Resource, ids: list[str]) -> object:
        return await self.bounded(self.endpoint(res.name).allocate(ids), self._cap(RPC_S))

    async def _case_allocate_healthy(self, res: _Resource) -> None:
        started = time.monotonic()
        if not res.healthy:
            self.add("allocate-healthy", Outcome.SKIP, "no Healthy device advertised", res.name)
            return
        requests = [res.healthy[:1]]
        if len(res.healthy) > 1:
            requests.append(res.healthy[:2])
        for ids in requests:
            try:
                resp = await self.bounded(self.endpoint(res.name).allocate(ids), self._cap(RPC_S))
            except Exception as exc:
                self.add(
                    "allocate-healthy",
                    Outcome.FAIL,
                    f"Allocate({ids}) failed: {_rpc_text(exc)}",
                    res.name,
                    started,
                )
                return
            problems = allocate_response_problems(resp)
            if problems:
                self.add(
                    "allocate-healthy",
                    Outcome.FAIL,
                    f"Allocate({ids}): {problems[0]}",
                    res.name,
                    started,
                )
                return
        self.add(
            "allocate-healthy",
            Outcome.PASS,
            f"{len(requests)} Allocate calls ({', '.join(str(len(r)) for r in requests)} "
            "devices) each answered one well-formed container response",
            res.name,
            started,
        )

    async def _case_allocate_refused(self, res: _Resource, *, unknown: bool) -> None:
        started = time.monotonic()
        case_id = "allocate-unknown-refused" if unknown else "allocate-unhealthy-refused"
        known = {i for i, _ in res.devices or []}
        if unknown:
            dev = "kd-conformance-unknown-" + uuid.uuid4().hex[:8]
            while dev in known:
                dev += "x"
        elif res.unhealthy:
            dev = res.unhealthy[0]
        else:
            self.add(case_id, Outcome.SKIP, "no unhealthy device advertised", res.name)
            return
        what = "an ID never advertised" if unknown else "an unhealthy device"
        try:
            await self.bounded(self.endpoint(res.name).allocate([dev]), self._cap(RPC_S))
        except Exception as exc:
            self.add(
                case_id,
                Outcome.PASS,
                f"Allocate([{dev!r}]) refused: {_rpc_text(exc)}",
                res.name,
                started,
            )
            return
        self.add(
            case_id, Outcome.FAIL, f"Allocate([{dev!r}]) of {what} succeeded", res.name, started
        )

    async def _case_preferred(self, res: _Resource) -> None:
        started = time.monotonic()
        opts = res.options
        if opts is None or not opts.get_preferred_allocation_available:
            self.add(
                "preferred-allocation",
                Outcome.SKIP,
                "GetPreferredAllocation not advertised",
                res.name,
            )
            return
        avail = res.healthy
        if not avail:
            self.add("preferred-allocation", Outcome.SKIP, "no Healthy device advertised", res.name)
            return
        asks: list[tuple[list[str], list[str], int]] = [
            (list(avail), [], 1),
            (list(avail), [], len(avail)),
        ]
        if len(avail) >= 2:
            asks.append((list(avail), [avail[-1]], 2))
        ep = self.endpoint(res.name)
        for available, must, size in asks:
            try:
                answer = await self.bounded(
                    ep.get_preferred_allocation(available, must, size), self._cap(RPC_S)
                )
            except Exception as exc:
                self.add(
                    "preferred-allocation",
                    Outcome.FAIL,
                    f"GetPreferredAllocation(size={size}, must_include={must}) failed: "
                    f"{_rpc_text(exc)}",
                    res.name,
                    started,
                )
                return
            problems = preferred_problems(available, must, size, list(answer))
            if problems:
                self.add(
                    "preferred-allocation",
                    Outcome.FAIL,
                    f"size={size}, must_include={must}: {problems[0]}",
                    res.name,
                    started,
                )
                return
        self.add(
            "preferred-allocation",
            Outcome.PASS,
            f"{len(asks)} requests: answers kept must-include IDs, had allocation_size IDs, "
            "only offered ones",
            res.name,
            started,
        )

    # ------------------------------------------------------------------ stream kill

    def _registered_after(self, resource: str, t: float) -> RegistrationEvent | None:
        return next((r for r in self.regs(resource, t) if r.ok), None)

    def _allocatable_back(self, res: _Resource, t: float) -> bool:
        if self._registered_after(res.name, t) is None:
            return False
        status = self.emu.node().resources.get(res.name)
        return (
            status is not None and status.connected and status.allocatable == len(set(res.healthy))
        )

    def _stale_end_raced(self, resource: str, t_kill: float, old_sock: Path) -> bool:
        """True if the killed stream's end arrived after a re-registration and dropped it.

        The emulator processes the end of a stream it cancelled asynchronously; a plugin
        that re-registers within milliseconds can be disconnected again by that stale end
        (released kubelets key clients by resource name, kubernetes#121994).
        """
        reg = self._registered_after(resource, t_kill)
        if reg is None:
            return False
        return any(
            e.resource == resource and e.socket == str(old_sock) and e.disconnected
            for e in self.emu.events.of_type(StreamEndEvent, reg.t)
        )

    async def _phase_stream_kill(self) -> None:
        for res in self.resources.values():
            ids = ("survives-stream-kill", "recovers-after-stream-kill")
            if res.ok_reg is None or res.devices is None:
                self.skip_rest(res.name, ids, "the resource never served a device list")
                continue
            if not self.proc.alive:
                self.skip_rest(res.name, ids, f"{self.exit_text()} earlier")
                continue
            started = time.monotonic()
            old_sock = self.endpoint(res.name).socket_path
            t_kill = time.monotonic()
            self.endpoint(res.name).kill_stream()
            limit = self._cap(RECOVERY_S)

            def back(res: _Resource = res, t_kill: float = t_kill) -> bool:
                return self._allocatable_back(res, t_kill)

            def raced(res: _Resource = res, t_kill: float = t_kill) -> bool:
                return self._stale_end_raced(res.name, t_kill, old_sock)

            recovered = await self.wait(lambda: back() or raced(), limit)
            await self._judge_survival(res, old_sock, started)
            reg = self._registered_after(res.name, t_kill)
            if recovered and reg is not None:
                note = (
                    f"allocatable back to {len(set(res.healthy))}"
                    if back()
                    else "the killed stream's late end then dropped the new registration "
                    "(emulated kubernetes#121994 race, not the plugin's doing)"
                )
                self.add(
                    "recovers-after-stream-kill",
                    Outcome.PASS,
                    f"re-registered {_fmt(reg.t - t_kill)} after the stream was dropped; {note}",
                    res.name,
                    started,
                )
            else:
                status = self.emu.node().resources.get(res.name)
                alloc = status.allocatable if status is not None else 0
                what = (
                    f"{self.exit_text()}"
                    if not self.proc.alive
                    else (
                        "re-registered but allocatable stayed at "
                        f"{alloc} (want {len(set(res.healthy))})"
                        if reg is not None
                        else f"no re-registration within {_fmt(limit)}; allocatable stays 0"
                    )
                )
                self.add("recovers-after-stream-kill", Outcome.FAIL, what, res.name, started)

    async def _judge_survival(self, res: _Resource, old_sock: Path, started: float) -> None:
        if not self.proc.alive:
            self.add(
                "survives-stream-kill",
                Outcome.FAIL,
                f"{self.exit_text()} after its ListAndWatch stream was dropped",
                res.name,
                started,
            )
            return
        sock = old_sock
        if self._registered_after(res.name, started) is not None:
            sock = self.endpoint(res.name).socket_path
        try:
            async with ProbeClient(sock, rpc_timeout=self._cap(RPC_S)) as probe:
                await probe.options()
        except Exception as exc:
            self.add(
                "survives-stream-kill",
                Outcome.FAIL,
                f"process alive but {sock.name} no longer answers: {rpc_error_text(exc)}",
                res.name,
                started,
            )
            return
        self.add(
            "survives-stream-kill",
            Outcome.PASS,
            f"process alive; {sock.name} still answers GetDevicePluginOptions",
            res.name,
            started,
        )

    # ------------------------------------------------------------------ kubelet restart

    async def _phase_restart(self) -> None:
        ids = ("reregister-within-30s", "reregister-within-1s")
        live = [r for r in self.resources.values() if r.ok_reg is not None]
        for res in self.resources.values():
            if res.ok_reg is None:
                self.skip_rest(res.name, ids, "the resource never registered successfully")
        if not live:
            return
        if not self.proc.alive:
            for res in live:
                self.skip_rest(res.name, ids, f"{self.exit_text()} earlier")
            return
        started = time.monotonic()
        await self.emu.restart()
        served = [e for e in self.emu.events.of_type(KubeletStartedEvent, started) if e.restart]
        t_ready = served[-1].t if served else time.monotonic()
        limit = self._cap(REREGISTER_MUST_S)
        await self.wait(
            lambda: all(self._registered_after(r.name, t_ready) for r in live),
            max(0.0, t_ready + limit - time.monotonic()),
        )
        for res in live:
            reg = self._registered_after(res.name, t_ready)
            if reg is None:
                why = (
                    f"{self.exit_text()} after the kubelet restart"
                    if not self.proc.alive
                    else f"no successful Register within {_fmt(limit)} of the kubelet restart"
                )
                self.add("reregister-within-30s", Outcome.FAIL, why, res.name, started)
                self.add("reregister-within-1s", Outcome.FAIL, why, res.name, started)
                continue
            delay = reg.t - t_ready
            ok30 = delay <= REREGISTER_MUST_S
            self.add(
                "reregister-within-30s",
                Outcome.PASS if ok30 else Outcome.FAIL,
                f"registered again {_fmt(delay)} after kubelet.sock came back",
                res.name,
                started,
            )
            ok1 = delay <= REREGISTER_SHOULD_S
            self.add(
                "reregister-within-1s",
                Outcome.PASS if ok1 else Outcome.FAIL,
                f"registered again {_fmt(delay)} after kubelet.sock came back"
                + ("" if ok1 else " (> 1 s)"),
                res.name,
                started,
            )

    # ------------------------------------------------------------------ SIGTERM

    def _plugin_sockets(self) -> set[str]:
        out = set()
        with contextlib.suppress(OSError):
            for entry in os.scandir(self.dir):
                if entry.name != KUBELET_SOCKET and stat.S_ISSOCK(
                    entry.stat(follow_symlinks=False).st_mode
                ):
                    out.add(entry.name)
        return out

    async def _phase_sigterm(self) -> None:
        if not self.proc.alive:
            self.add("sigterm-clean-exit", Outcome.SKIP, f"{self.exit_text()} earlier")
            return
        started = time.monotonic()
        sockets = self._plugin_sockets()
        limit = self._cap(SIGTERM_S)
        code = await self.proc.terminate(limit)
        took = time.monotonic() - started
        if code is None:
            await self.proc.kill()
            self.add(
                "sigterm-clean-exit",
                Outcome.FAIL,
                f"still running {_fmt(limit)} after SIGTERM (killed)",
                started=started,
            )
            return
        left = sorted(s for s in sockets if (self.dir / s).exists())
        if code != 0:
            self.add(
                "sigterm-clean-exit",
                Outcome.FAIL,
                f"exit code {code} after SIGTERM",
                started=started,
            )
        elif left:
            self.add(
                "sigterm-clean-exit",
                Outcome.FAIL,
                f"exited 0 after {_fmt(took)} but left socket(s) {', '.join(left)}",
                started=started,
            )
        else:
            self.add(
                "sigterm-clean-exit",
                Outcome.PASS,
                f"exited 0 after {_fmt(took)}; removed {', '.join(sorted(sockets)) or 'no socket'}",
                started=started,
            )

    # ------------------------------------------------------------------ self-check

    def unadvertised_calls(self) -> list[str]:
        """RPCs the run issued that a resource did not advertise (must stay empty)."""
        bad = []
        for e in self.emu.events.of_type(RpcEvent):
            res = self.resources.get(e.resource)
            opts = res.options if res is not None else None
            if opts is None:
                continue
            if e.rpc == "GetPreferredAllocation" and not opts.get_preferred_allocation_available:
                bad.append(f"{e.rpc} on {e.resource}")
            if e.rpc == "PreStartContainer" and not opts.pre_start_required:
                bad.append(f"{e.rpc} on {e.resource}")
        return bad


def _rpc_text(exc: BaseException) -> str:
    code = getattr(exc, "code", None)
    details = getattr(exc, "details", None)
    if isinstance(code, str):
        return f"{code}: {details}" if details else code
    return rpc_error_text(exc)


async def run_conformance(
    command: Sequence[str],
    *,
    timeout: float = 30.0,  # noqa: ASYNC109 - a budget for many waits, not one deadline
    startup_timeout: float | None = None,
    log_path: str | Path | None = None,
) -> Report:
    """Run every conformance case against ``command``; the async form of :func:`check_plugin`."""
    started = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="kd-conf-", dir="/tmp"))
    if log_path is None:
        fd, name = tempfile.mkstemp(prefix="kd-conformance-", suffix=".log", dir="/tmp")
        os.close(fd)
        log_file = Path(name)
    else:
        log_file = Path(log_path)
        log_file.write_bytes(b"")
    try:
        run = _Run(
            command,
            timeout=timeout,
            startup_timeout=min(timeout, 30.0) if startup_timeout is None else startup_timeout,
            log_path=log_file,
            root=root,
        )
        await run.run()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    bad = run.unadvertised_calls()
    if bad:  # a kit bug, never a plugin's fault: say so loudly
        log.error("conformance kit called unadvertised RPCs: %s", ", ".join(bad))
    order = {c.id: i for i, c in enumerate(CASES)}
    resources = tuple(run.resources)
    rank = {name: i for i, name in enumerate(resources)}
    results = sorted(
        run.results,
        key=lambda r: (order[r.case.id], rank.get(r.resource or "", len(rank))),
    )
    return Report(
        command=tuple(command),
        results=tuple(results),
        resources=resources,
        log_path=log_file,
        duration_s=time.monotonic() - started,
    )


def check_plugin(
    command: Sequence[str],
    *,
    timeout: float = 30.0,
    startup_timeout: float | None = None,
    log_path: str | Path | None = None,
) -> Report:
    """Start the emulator and ``command`` (the plugin), run every case, and return the report.

    Args:
        command: the plugin's argv; ``{dir}`` in it is replaced by the device plugin
            directory, which is also in ``$DP_DEVICE_PLUGIN_DIR``.
        timeout: upper bound in seconds on every wait (the contract's 30 s / 5 s limits are
            used when smaller); lower it to fail faster.
        startup_timeout: how long to wait for the first Register (default: ``timeout``,
            at most 30 s).
        log_path: where the plugin's stdout/stderr go (default: a new file in /tmp).

    Raises:
        ConfigError: the command is empty or cannot be executed.
    """
    return asyncio.run(
        run_conformance(
            command, timeout=timeout, startup_timeout=startup_timeout, log_path=log_path
        )
    )

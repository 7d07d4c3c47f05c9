"""The shared state of one conformance run and the helpers every case uses.

``RunContext`` owns the emulator, the plugin process and the results; it waits on emulator
events (never polls), bounds every RPC, and remembers when each registered endpoint's
socket was created. The cases themselves live in ``resource_cases`` and
``lifecycle_cases``; ``runner`` drives them.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from kubedevice.conformance.catalogue import CASES_BY_ID
from kubedevice.conformance.probe import rpc_error_text
from kubedevice.conformance.process import PluginProcess
from kubedevice.conformance.report import CaseResult, Outcome
from kubedevice.errors import EmulatorError
from kubedevice.kubelet import (
    Emulator,
    PluginEndpoint,
    PluginOptions,
    RegistrationEvent,
    RpcEvent,
)

__all__ = ["ResourceState", "RunContext", "fmt", "fmt_options", "rpc_text"]

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


def fmt(seconds: float) -> str:
    """``12 ms`` below a second, ``1.62 s`` above."""
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"


def fmt_options(o: PluginOptions | None) -> str:
    """DevicePluginOptions as evidence text."""
    if o is None:
        return "none"
    return (
        f"pre_start_required={o.pre_start_required}, "
        f"get_preferred_allocation_available={o.get_preferred_allocation_available}"
    )


def rpc_text(exc: BaseException) -> str:
    """``CODE: details`` of an emulator ``PluginRpcError`` or a raw gRPC error."""
    code = getattr(exc, "code", None)
    details = getattr(exc, "details", None)
    if isinstance(code, str):
        return f"{code}: {details}" if details else code
    return rpc_error_text(exc)


@dataclass
class ResourceState:
    """What the run learned about one registered resource."""

    name: str
    first_reg: RegistrationEvent
    ok_reg: RegistrationEvent | None = None
    devices: list[tuple[str, str]] | None = None
    options: PluginOptions | None = None
    healthy: list[str] = field(default_factory=list)
    unhealthy: list[str] = field(default_factory=list)


#: A plugin log line that reports a problem (any language's usual words for one, and an
#: answer the plugin's framework had to repair, as the kubedevice SDK logs it).
_LOGGED_ERROR = re.compile(
    r"(?i)\b(error|exception|traceback|panic|fatal|critical|fail(ed|ure|s)?|invalid|"
    r"repaired)\b"
)


class RunContext:
    """The state of one run: emulator, plugin process, what was learned, the results."""

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
            dial_timeout_s=self.cap(DIAL_S),
        )
        self.proc = PluginProcess(command, self.dir, log_path)
        self.results: list[CaseResult] = []
        self.resources: dict[str, ResourceState] = {}
        #: monotonic time each registered endpoint's socket was created (from its ctime).
        self.created: dict[str, float | None] = {}
        self._mono_offset = time.time() - time.monotonic()

    def log_offset(self) -> int:
        """How much the plugin has logged so far (bytes); see :meth:`logged_errors`."""
        try:
            return self.log_path.stat().st_size
        except OSError:
            return 0

    def logged_errors(self, since: int) -> list[str]:
        """Lines the plugin logged after ``since`` that report an error or a failure."""
        try:
            with self.log_path.open("rb") as f:
                f.seek(since)
                text = f.read(1 << 20).decode("utf-8", "replace")
        except OSError:
            return []
        return [x.strip() for x in text.splitlines() if _LOGGED_ERROR.search(x)]

    def cap(self, limit: float) -> float:
        """The contract's ``limit`` capped by the run's ``timeout``."""
        return min(limit, self.timeout)

    def add(
        self,
        case_id: str,
        outcome: Outcome,
        evidence: str,
        resource: str | None = None,
        started: float | None = None,
    ) -> None:
        """Record one case's outcome (``started``: monotonic time the case began)."""
        duration = 0.0 if started is None else time.monotonic() - started
        self.results.append(CaseResult(CASES_BY_ID[case_id], outcome, evidence, resource, duration))

    def skip_rest(self, resource: str, case_ids: Sequence[str], why: str) -> None:
        """Skip every case in ``case_ids`` for ``resource`` with the same reason."""
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
        """Await ``aw`` for at most ``limit`` s (the kubelet sets no deadline; we must)."""
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
        """The emulator's current endpoint for ``resource`` (EmulatorError if none)."""
        return self.emu.endpoint(resource)

    def exit_text(self) -> str:
        """Evidence text for a plugin process that is gone."""
        return f"plugin process exited with code {self.proc.returncode}"

    def registered_after(self, resource: str, t: float) -> RegistrationEvent | None:
        """The first successful registration of ``resource`` that arrived at or after ``t``."""
        return next((r for r in self.regs(resource, t) if r.ok), None)

    def current_endpoint_name(self, resource: str) -> str | None:
        """Socket file name of the current endpoint of ``resource``, if it has one."""
        try:
            return self.endpoint(resource).socket_path.name
        except EmulatorError:
            return None

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

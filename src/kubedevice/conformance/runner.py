"""One conformance run: the emulator plus the plugin process, driven through every case.

Phases, in order: start-up and registration (with discovery of every resource the plugin
registers); per resource the cases of :mod:`~kubedevice.conformance.resource_cases`; then
the lifecycle cases (dropped stream, kubelet restart, SIGTERM). Every wait is on an
emulator event or the process exit, with the contract's limit (capped by ``timeout``) as
its deadline: a good plugin is checked in about a second. Never imports the SDK; the
plugin is a black box behind its socket.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from kubedevice.conformance.catalogue import CASES
from kubedevice.conformance.context import (
    DISCOVERY_WINDOW_S,
    FIRST_LIST_S,
    ResourceState,
    RunContext,
    fmt,
)
from kubedevice.conformance.lifecycle_cases import check_restart, check_sigterm, check_stream_kill
from kubedevice.conformance.report import Outcome, Report
from kubedevice.conformance.resource_cases import check_resource
from kubedevice.kubelet import ListAndWatchEvent

__all__ = ["check_plugin", "run_conformance"]

#: How long a plugin still running when the run ends gets to exit on SIGTERM (and flush
#: its output) before it is killed.
STOP_GRACE_S = 2.0

log = logging.getLogger(__name__)


class _Run(RunContext):
    """A run: start everything, go through the phases, stop everything."""

    async def run(self) -> None:
        await self.emu.start()
        try:
            await self.proc.start()
            try:
                await self._phases()
            finally:
                await self.proc.stop(self.cap(STOP_GRACE_S))
        finally:
            await self.emu.stop()

    async def _phases(self) -> None:
        if not await self._phase_registration():
            return
        for res in self.resources.values():
            await check_resource(self, res)
        await check_stream_kill(self)
        await check_restart(self)
        await check_sigterm(self)

    async def _phase_registration(self) -> bool:
        started = time.monotonic()
        await self.wait(lambda: bool(self.regs()), self.startup_timeout)
        if not self.regs():
            why = (
                f"{self.exit_text()} before registering"
                if not self.proc.alive
                else f"no Register call within {fmt(self.startup_timeout)} (does the plugin "
                f"use $DP_DEVICE_PLUGIN_DIR or {{dir}} for kubelet.sock?)"
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

            await self.wait(settled, self.cap(FIRST_LIST_S))
            if not new():
                await self.wait(new, DISCOVERY_WINDOW_S)
            if not new():
                break
        for reg in self.regs():
            if reg.resource not in self.resources:
                self.resources[reg.resource] = ResourceState(reg.resource, reg)
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
    resources = tuple(sorted(run.resources))
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

    Runs its own event loop; from async code use :func:`run_conformance` instead.
    """
    return asyncio.run(
        run_conformance(
            command, timeout=timeout, startup_timeout=startup_timeout, log_path=log_path
        )
    )

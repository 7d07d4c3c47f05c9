"""One DRA conformance run: the API server, the driver, every case in order, the report.

Phases: the API server (``--k8s-bin``: the kit's own; else ``--kubeconfig``), the Node,
the driver started in its kubelet dir; registration; slices; prepare and unprepare; a
quiet period; the slices wiped and deleted; cut-off calls; health; registrations again;
restarts, a reboot and a second instance (not in ``--quick``); SIGTERM; the cost figures.
A case whose phase was not reached is skipped with the reason. Everything the run made
is removed again: the driver and what it started, the API objects, the directories.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import tempfile
import time
from pathlib import Path

from kubedevice.conformance.dra.apiserver import LocalApiServer
from kubedevice.conformance.dra.catalogue import DRA_CASES
from kubedevice.conformance.dra.context import DraContext, DraOptions
from kubedevice.conformance.dra.deadline_cases import (
    check_deadlines,
    check_overlap,
    check_within,
)
from kubedevice.conformance.dra.health_cases import check_health
from kubedevice.conformance.dra.kube import ApiError, KubeClient
from kubedevice.conformance.dra.prepare_cases import check_prepare
from kubedevice.conformance.dra.registration_cases import check_registration, check_reregistration
from kubedevice.conformance.dra.restart_cases import check_restarts
from kubedevice.conformance.dra.slice_cases import check_published, check_quiet, check_slices_back
from kubedevice.conformance.dra.stop_cases import check_sigterm, report_cost
from kubedevice.conformance.dra.unprepare_cases import check_unprepare
from kubedevice.conformance.report import Report
from kubedevice.errors import ConfigError
from kubedevice.kubeconfig import resolve_kubeconfig

__all__ = ["check_driver", "run_dra_conformance"]

log = logging.getLogger(__name__)

#: How long a driver still running at the end gets to exit on SIGTERM before SIGKILL.
STOP_GRACE_S = 5.0


async def _phases(ctx: DraContext) -> None:
    await asyncio.to_thread(ctx.fixtures.setup_node)
    await ctx.slices.start()
    ctx.watcher.start()
    started = await ctx.start()
    if not await check_registration(ctx, started):
        return
    assert ctx.learned.registration is not None
    await asyncio.to_thread(ctx.fixtures.setup_class, ctx.learned.driver)
    first = None
    if await check_published(ctx, started, ctx.learned.registration.t):
        first = await check_prepare(ctx)
        first = await check_unprepare(ctx, first)
        await check_quiet(ctx)
        await check_slices_back(ctx)
        await check_deadlines(ctx)
    await check_health(ctx)
    await check_reregistration(ctx)
    if ctx.opts.quick:
        ctx.skip(["restart-reregisters", "restart-same-answer", "restart-unprepare",
                  "reboot-specs-back", "upgrade-side-by-side", "health-reconnect",
                  "deadline-overlap"],
                 "--quick")  # fmt: skip
    elif ctx.usable():
        await check_restarts(ctx, first)
        if ctx.usable():
            await check_overlap(ctx)
    await check_sigterm(ctx)


async def run_dra_conformance(opts: DraOptions) -> Report:
    """Run every DRA case against ``opts.command``; the async form of :func:`check_driver`."""
    started = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="kdd-", dir="/tmp"))
    opts.log_path.write_bytes(b"")
    api: LocalApiServer | None = None
    ctx: DraContext | None = None
    try:
        if opts.k8s_bin is not None:
            api = LocalApiServer(opts.k8s_bin, root / "api")
            await asyncio.to_thread(api.start)
            kit_config, driver_config = api.kit_kubeconfig, api.driver_kubeconfig
        else:
            found = resolve_kubeconfig(opts.kubeconfig)
            if found is None:
                raise ConfigError("the DRA kit needs --kubeconfig or --k8s-bin")
            kit_config = driver_config = found
        kube = KubeClient(kit_config)
        ctx = DraContext(opts, root, kube, driver_config)
        ctx.audit_log = api.audit_log if api is not None else None
        try:
            await _phases(ctx)
        except ApiError as exc:
            raise ConfigError(f"the kit's own API call failed: {exc}") from exc
        finally:
            await _teardown(ctx)
        check_within(ctx)
        report_cost(ctx)
        ctx.skip([c.id for c in DRA_CASES], "not reached (an earlier phase failed)")
    finally:
        if api is not None:
            await asyncio.to_thread(api.stop)
        shutil.rmtree(root, ignore_errors=True)
    order = {c.id: i for i, c in enumerate(DRA_CASES)}
    results = sorted(ctx.results, key=lambda r: order[r.case.id])
    return Report(
        command=opts.command,
        results=tuple(results),
        resources=(ctx.learned.driver,) if ctx.learned.driver else (),
        log_path=opts.log_path,
        duration_s=time.monotonic() - started,
    )


async def _teardown(ctx: DraContext) -> None:
    await ctx.proc.stop(STOP_GRACE_S)
    await ctx.watcher.stop()
    await ctx.slices.stop()
    await ctx.stop_all()
    with contextlib.suppress(Exception):
        await asyncio.to_thread(ctx.fixtures.cleanup)
    ctx.kube.close()


def check_driver(opts: DraOptions) -> Report:
    """Start the driver (``opts.command``), play the kubelet, run every case; the report.

    Raises:
        ConfigError: the command cannot be started, or the API server cannot be reached
            or started.

    Runs its own event loop; from async code use :func:`run_dra_conformance`.
    """
    return asyncio.run(run_dra_conformance(opts))

"""Deadline cases: a call cut off by the kubelet's deadline and retried leaves one result.

The kit cannot slow a driver down, so it cuts calls off at points spread over the driver's
own answer time (measured from the run's earlier calls): some land before the driver
reads the claim, some while it writes the spec, some after. After each cut the kit calls
again with the kubelet's deadline, as the kubelet does when it retries the pod; what is
in the CDI dir afterwards must be exactly one prepared result, and nothing after the
unprepare.
"""

from __future__ import annotations

import contextlib
import statistics
import time

from kubedevice.conformance.dra import claims as c
from kubedevice.conformance.dra.context import DraContext, fmt
from kubedevice.conformance.dra.fixtures import Request
from kubedevice.conformance.dra.kubelet import CLAIM_CALL_S
from kubedevice.conformance.dra.restart_cases import restart
from kubedevice.conformance.dra.slices import PublishedDevice
from kubedevice.conformance.report import Outcome

__all__ = ["check_deadlines", "check_overlap", "check_within"]

#: Where calls are cut off, as fractions of the driver's median answer time.
_CUTS = (0.1, 0.3, 0.5, 0.7, 0.9)
#: The shortest cut, in seconds (a shorter deadline never leaves the client).
_MIN_CUT_S = 0.002


def _median_s(ctx: DraContext, rpc: str) -> float:
    times = [x.seconds for x in ctx.calls.calls if x.rpc == rpc and x.claims == 1 and not x.error]
    return statistics.median(times) if times else 0.05


async def check_deadlines(ctx: DraContext) -> None:
    """Cut-off prepares and unprepares, each retried."""
    d = ctx.fixtures.take(ctx.devices(), 1)
    if not d:
        ctx.skip(["deadline-prepare-retry", "deadline-unprepare-retry"], ctx.why_no_device())
        return
    cuts = _CUTS[::2] if ctx.opts.quick else _CUTS
    prep_s, unprep_s = _median_s(ctx, "prepare"), _median_s(ctx, "unprepare")
    started = time.monotonic()
    prep_problems: list[str] = []
    unprep_problems: list[str] = []
    for cut in cuts:
        claim = await c.make(ctx, [Request("req-0", d[0])])
        before = ctx.cdi.ids()
        limit = max(prep_s * cut, _MIN_CUT_S)
        with contextlib.suppress(Exception):  # cut off on purpose: any outcome is fine
            await ctx.client().prepare([claim.ref], version=ctx.learned.version, limit=limit)
        answer = c.answer_of(await c.prepare(ctx, [claim]), claim)
        problem = c.answer_problem(claim, answer)
        if not problem and not isinstance(answer, str):
            extra = ctx.cdi.ids() - before - c.cdi_ids([answer])
            missing = c.cdi_ids([answer]) - ctx.cdi.ids()
            if extra or missing:
                problem = f"CDI devices beyond the answer {sorted(extra)[:2]}, missing " \
                          f"{sorted(missing)[:2]}"  # fmt: skip
        if problem:
            prep_problems.append(f"cut at {fmt(limit)}: {problem}")
        limit = max(unprep_s * cut, _MIN_CUT_S)
        with contextlib.suppress(Exception):  # cut off on purpose
            await ctx.client().unprepare([claim.ref], version=ctx.learned.version, limit=limit)
        errors = await c.unprepare(ctx, [claim])
        left = ctx.cdi.ids() - before
        if isinstance(errors, str) or errors.get(claim.uid) or left:
            unprep_problems.append(f"cut at {fmt(limit)}: {errors} left {sorted(left)[:2]}")
        await c.delete(ctx, claim)
    ctx.fixtures.used.discard((d[0].pool, d[0].name))
    ctx.check("deadline-prepare-retry", "; ".join(prep_problems[:2]),
              f"{len(cuts)} cut-off prepares (median call {fmt(prep_s)}), each retried: one "
              "result", started)  # fmt: skip
    ctx.check("deadline-unprepare-retry", "; ".join(unprep_problems[:2]),
              f"{len(cuts)} cut-off unprepares, each retried: nothing left", started)  # fmt: skip


def check_within(ctx: DraContext) -> None:
    """Every claim call made with the kubelet's deadline was answered within it."""
    full = [x for x in ctx.calls.calls if x.limit >= CLAIM_CALL_S]
    if not full:
        ctx.add("deadline-within", Outcome.SKIP, "no call was made")
        return
    late = [f"{x.rpc} of {x.claims}: {x.error or fmt(x.seconds)}" for x in full
            if x.seconds >= x.limit or "DEADLINE" in x.error]  # fmt: skip
    slowest = max(x.seconds for x in full)
    ctx.check("deadline-within", f"{len(late)} calls ran into the deadline: {late[:2]}"
              if late else "", f"{len(full)} calls, slowest {fmt(slowest)}")  # fmt: skip


async def check_overlap(ctx: DraContext) -> None:
    """With the driver slowed by its own knob (``--slow-env``): cut a prepare off halfway and
    retry at once, while the driver still works on the first; one result, nothing left."""
    if not ctx.opts.slow_env:
        ctx.skip(["deadline-overlap"], "no --slow-env given (the driver's way to slow a prepare)")
        return
    d = ctx.fixtures.take(ctx.devices(), 2)
    if len(d) < 2:
        ctx.skip(["deadline-overlap"], ctx.why_no_device())
        return
    started = time.monotonic()
    problem = await restart(ctx, env=dict(ctx.opts.slow_env))
    if not problem:
        problem = await _overlap(ctx, d)
    ctx.check("deadline-overlap", problem, "a cut-off prepare and its retry at once: one result",
              started)  # fmt: skip
    ctx.fixtures.used.difference_update((x.pool, x.name) for x in d)
    await restart(ctx, env={})  # the driver as the run started it


async def _overlap(ctx: DraContext, d: list[PublishedDevice]) -> str:
    timed = await c.make(ctx, [Request("req-0", d[0])])
    t = time.monotonic()
    answer = c.answer_of(await c.prepare(ctx, [timed]), timed)
    slow_s = time.monotonic() - t
    await c.unprepare(ctx, [timed])
    if isinstance(answer, str) or answer.error:
        return f"a slowed prepare failed: {answer}"
    claim = await c.make(ctx, [Request("req-0", d[1])])
    before = ctx.cdi.ids()
    with contextlib.suppress(Exception):  # cut off halfway on purpose
        await ctx.client().prepare([claim.ref], version=ctx.learned.version, limit=slow_s / 2)
    answer = c.answer_of(await c.prepare(ctx, [claim]), claim)
    problem = c.answer_problem(claim, answer)
    if not problem and not isinstance(answer, str):
        extra = ctx.cdi.ids() - before - c.cdi_ids([answer])
        problem = f"CDI devices beyond the answer: {sorted(extra)[:2]}" if extra else ""
    errors = await c.unprepare(ctx, [claim])
    left = ctx.cdi.ids() - before
    if not problem and (isinstance(errors, str) or errors.get(claim.uid) or left):
        problem = f"after the unprepare ({errors}): left {sorted(left)[:2]}"
    return (
        f"prepare slowed to {fmt(slow_s)}, cut at {fmt(slow_s / 2)}: {problem}" if problem else ""
    )

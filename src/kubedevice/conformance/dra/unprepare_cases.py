"""Unprepare cases: specs removed, idempotent, unknown and deleted claims; prepared again."""

from __future__ import annotations

import time
import uuid

from kubedevice.conformance.dra import claims as c
from kubedevice.conformance.dra.claims import KitClaim
from kubedevice.conformance.dra.context import DraContext
from kubedevice.conformance.dra.fixtures import Request
from kubedevice.conformance.dra.kubelet import Answer

__all__ = ["check_unprepare", "unprepare_problem"]

CASES = ("unprepare-removes", "unprepare-idempotent", "unprepare-unknown",
         "unprepare-deleted-claim", "prepare-again")  # fmt: skip


def unprepare_problem(ctx: DraContext, errors: dict[str, str] | str, claim: KitClaim,
                      answer: Answer | None) -> str:  # fmt: skip
    """What is wrong after unpreparing ``claim`` (prepared with ``answer``)."""
    if isinstance(errors, str):
        return errors
    if errors.get(claim.uid):
        return f"per-claim error: {errors[claim.uid]}"
    if claim.uid not in errors:
        return f"no answer for claim {claim.uid}"
    left = sorted(c.own_ids(ctx, claim, answer) & ctx.cdi.ids()) if answer else []
    return f"CDI devices still there: {left[:3]}" if left else ""


async def check_unprepare(ctx: DraContext, first: KitClaim | None) -> KitClaim | None:
    """The unprepare cases on ``first``; it ends prepared again (returned), or None."""
    if first is None or not ctx.learned.kept:
        ctx.skip(CASES, "no claim was prepared")
        return None
    answer = ctx.learned.kept[0][1]
    started = time.monotonic()
    errors = await c.unprepare(ctx, [first])
    ctx.check("unprepare-removes", unprepare_problem(ctx, errors, first, answer),
              f"{len(c.own_ids(ctx, first, answer))} CDI devices removed", started)  # fmt: skip
    started = time.monotonic()
    errors = await c.unprepare(ctx, [first])
    ctx.check("unprepare-idempotent", unprepare_problem(ctx, errors, first, None),
              "no error the second time", started)  # fmt: skip
    unknown = KitClaim((ctx.fixtures.namespace, "never-prepared", str(uuid.uuid4())), ())
    started = time.monotonic()
    errors = await c.unprepare(ctx, [unknown])
    ctx.check("unprepare-unknown", unprepare_problem(ctx, errors, unknown, None),
              "no error", started)  # fmt: skip
    await _deleted(ctx)
    started = time.monotonic()
    again = c.answer_of(await c.prepare(ctx, [first]), first)
    problem = c.answer_problem(first, again)
    ctx.check("prepare-again", problem, "prepared again", started)
    if problem or isinstance(again, str):
        ctx.learned.kept.clear()
        return None
    ctx.learned.kept[0] = (first.ref, again)
    return first


async def _deleted(ctx: DraContext) -> None:
    d = ctx.fixtures.take(ctx.devices(), 1)
    if not d:
        ctx.skip(["unprepare-deleted-claim"], ctx.why_no_device())
        return
    started = time.monotonic()
    claim = await c.make(ctx, [Request("req-0", d[0])])
    answer = c.answer_of(await c.prepare(ctx, [claim]), claim)
    if isinstance(answer, str) or answer.error:
        ctx.skip(["unprepare-deleted-claim"], f"could not prepare: {answer}")
        return
    gone = await c.delete(ctx, claim)
    if gone:
        ctx.skip(["unprepare-deleted-claim"], f"could not delete the claim: {gone}")
        return
    errors = await c.unprepare(ctx, [claim])
    ctx.check("unprepare-deleted-claim", unprepare_problem(ctx, errors, claim, answer),
              "unprepared, specs removed", started)  # fmt: skip
    ctx.fixtures.used.discard((d[0].pool, d[0].name))

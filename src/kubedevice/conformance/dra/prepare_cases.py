"""Prepare cases: answers, CDI specs, idempotence, versions, batches, per-claim errors,
shared devices and configs. Each claim's devices go back to the pool when it is done."""

from __future__ import annotations

import time
import uuid

from kubedevice.conformance.dra import claims as c
from kubedevice.conformance.dra.claims import KitClaim
from kubedevice.conformance.dra.context import DraContext
from kubedevice.conformance.dra.fixtures import Request
from kubedevice.conformance.dra.kube import ApiError
from kubedevice.conformance.dra.kubelet import V1BETA1, Answer
from kubedevice.conformance.report import Outcome

__all__ = ["FOREIGN_DRIVER", "check_prepare"]

FOREIGN_DRIVER = "other.conformance.kubedevice.io"


async def _done(ctx: DraContext, *claims: KitClaim) -> None:
    """Unprepare ``claims`` and give their devices back (errors are other cases' business)."""
    await c.unprepare(ctx, claims)
    for claim in claims:
        ctx.fixtures.used.difference_update((r.device.pool, r.device.name) for r in claim.requests)


async def check_prepare(ctx: DraContext) -> KitClaim | None:
    """Every prepare case; the first claim stays prepared (the unprepare cases use it)."""
    devices = ctx.devices()
    first = await _basic(ctx, devices)
    await _subrequest(ctx, devices)
    await _multi(ctx, devices)
    if first is not None:
        await _shared(ctx, devices, first)
    await _errors(ctx, devices, first)
    await _configs(ctx, devices)
    await _batch(ctx, devices, first)
    return first


async def _basic(ctx: DraContext, devices: list) -> KitClaim | None:  # type: ignore[type-arg]
    started = time.monotonic()
    d = ctx.fixtures.take(devices, 1)
    claim = await c.make(ctx, [Request("req-0", d[0])])
    answers = await c.prepare(ctx, [claim])
    answer = c.answer_of(answers, claim)
    problem = c.answer_problem(claim, answer, names=False)
    ctx.check("prepare-basic", problem, f"{d[0].pool}/{d[0].name} prepared", started)
    if problem or isinstance(answer, str):
        ctx.skip(["prepare-request-names", "prepare-cdi-resolves", "prepare-cdi-valid",
                  "prepare-idempotent", "prepare-v1beta1"], "prepare-basic failed")  # fmt: skip
        return None
    ctx.check("prepare-request-names", c.answer_problem(claim, answer), "under 'req-0'")
    unresolved, invalid = c.cdi_problems(ctx, [answer])
    n = len(c.cdi_ids([answer]))
    ctx.check("prepare-cdi-resolves", unresolved, f"{n} CDI IDs resolve")
    ctx.check("prepare-cdi-valid", invalid, "valid specs")
    again = c.answer_of(await c.prepare(ctx, [claim]), claim)
    ctx.check("prepare-idempotent", _same(answer, again), "the same answer")
    if V1BETA1 in ctx.learned.versions:
        beta = c.answer_of(await c.prepare(ctx, [claim], version=V1BETA1), claim)
        ctx.check("prepare-v1beta1", _same(answer, beta), "v1beta1 answers the same")
    else:
        ctx.skip(["prepare-v1beta1"], "v1beta1 not offered")
    ctx.learned.kept.append((claim.ref, answer))
    return claim


def _same(first: Answer, again: Answer | str) -> str:
    if isinstance(again, str):
        return again
    if again.key() != first.key():
        return f"first {first.devices or first.error}, then {again.devices or again.error}"
    return ""


async def _one(ctx: DraContext, case: str, requests: list[Request], good: str) -> None:
    """Prepare one claim, judge the answer and its CDI IDs, unprepare it."""
    started = time.monotonic()
    claim = await c.make(ctx, requests)
    answer = c.answer_of(await c.prepare(ctx, [claim]), claim)
    problem = c.answer_problem(claim, answer)
    if not problem and not isinstance(answer, str):
        problem = " ".join(c.cdi_problems(ctx, [answer])).strip()
    ctx.check(case, problem, good, started)
    await _done(ctx, claim)


async def _subrequest(ctx: DraContext, devices: list) -> None:  # type: ignore[type-arg]
    d = ctx.fixtures.take(devices, 1)
    if not d:
        ctx.skip(["prepare-subrequest"], ctx.why_no_device())
        return
    await _one(ctx, "prepare-subrequest", [Request("req-0", d[0], sub="second")],
               "allocated req-0/second, answered under req-0")  # fmt: skip


async def _multi(ctx: DraContext, devices: list) -> None:  # type: ignore[type-arg]
    d = ctx.fixtures.take(devices, 2)
    if len(d) < 2:
        ctx.fixtures.used.difference_update((x.pool, x.name) for x in d)
        ctx.skip(["prepare-multi-request"], "fewer than 3 devices published")
        return
    await _one(ctx, "prepare-multi-request", [Request("a", d[0]), Request("b", d[1])],
               "a and b each under its own name")  # fmt: skip


async def _shared(ctx: DraContext, devices: list, first: KitClaim) -> None:  # type: ignore[type-arg]
    device = first.requests[0].device
    started = time.monotonic()
    other = await c.make(ctx, [Request("req-0", device)])
    answer = c.answer_of(await c.prepare(ctx, [other]), other)
    if isinstance(answer, str):
        problem = f"refused with an RPC error, not a per-claim error: {answer}"
    elif not answer.error:
        problem = f"{device.name}, prepared for {first.ref[1]}, prepared for {other.ref[1]} too"
        await c.unprepare(ctx, [other])
    else:
        problem = ""
    ctx.check("prepare-double-allocation", problem,
              f"refused: {getattr(answer, 'error', '')[:80]}", started)  # fmt: skip
    started = time.monotonic()
    try:
        admin = await c.make(ctx, [Request("req-0", device, admin=True)])
    except ApiError as exc:
        ctx.add("prepare-admin-access", Outcome.SKIP, f"the API server refused it: {exc}")
        return
    answer = c.answer_of(await c.prepare(ctx, [admin]), admin)
    ctx.check("prepare-admin-access", c.answer_problem(admin, answer),
              "admin-access claim prepared beside the first", started)  # fmt: skip
    await c.unprepare(ctx, [admin])


async def _errors(ctx: DraContext, devices: list, first: KitClaim | None) -> None:  # type: ignore[type-arg]
    d = ctx.fixtures.take(devices, 1)
    ns = ctx.fixtures.namespace
    started = time.monotonic()
    missing = (ns, f"missing-{ctx.fixtures.run_id}", str(uuid.uuid4()))
    good = await c.make(ctx, [Request("req-0", d[0])]) if d else None
    call = [missing, *([good.ref] if good else [])]
    answers = await c.prepare(ctx, call)
    problem = _error_problem(answers, missing[2])
    if not problem and good is not None:
        problem = c.answer_problem(good, c.answer_of(answers, good))
        problem = f"the other claim of the call: {problem}" if problem else ""
    ctx.check("prepare-missing-claim", problem,
              "per-claim error; the other claim prepared" if good else "per-claim error",
              started)  # fmt: skip
    if good is not None:
        await _done(ctx, good)
    if first is not None:
        wrong = (first.ref[0], first.ref[1], str(uuid.uuid4()))
        started = time.monotonic()
        ctx.check("prepare-uid-mismatch", _error_problem(await c.prepare(ctx, [wrong]), wrong[2]),
                  "per-claim error", started)  # fmt: skip
    else:
        ctx.skip(["prepare-uid-mismatch"], "no prepared claim to name")
    started = time.monotonic()
    bare = await c.make(ctx, [], allocate=False)
    ctx.check("prepare-unallocated", _error_problem(await c.prepare(ctx, [bare]), bare.uid),
              "per-claim error", started)  # fmt: skip


def _error_problem(answers: dict[str, Answer] | str, uid: str) -> str:
    if isinstance(answers, str):
        return f"{answers} (the whole call failed; want a per-claim error)"
    if uid not in answers:
        return f"no answer for claim {uid}"
    if not answers[uid].error:
        return f"no error; answered {answers[uid].devices}"
    return ""


async def _configs(ctx: DraContext, devices: list) -> None:  # type: ignore[type-arg]
    d = ctx.fixtures.take(devices, 1)
    if not d:
        ctx.skip(["prepare-foreign-config", "prepare-own-config"], ctx.why_no_device())
        return
    foreign = Request("req-0", d[0], config=((FOREIGN_DRIVER, {"unknown": {"x": 1}}),))
    await _one(ctx, "prepare-foreign-config", [foreign], f"a config for {FOREIGN_DRIVER} ignored")
    if ctx.opts.claim_config is None:
        ctx.skip(["prepare-own-config"], "no --claim-config given")
        return
    d = ctx.fixtures.take(devices, 1)
    own = Request("req-0", d[0], config=((ctx.learned.driver, ctx.opts.claim_config),))
    await _one(ctx, "prepare-own-config", [own], "prepared with the claim's config")


async def _batch(ctx: DraContext, devices: list, first: KitClaim | None) -> None:  # type: ignore[type-arg]
    free = ctx.fixtures.take(devices, 8)
    if not free:
        ctx.skip(["prepare-batch"], ctx.why_no_device())
        return
    started = time.monotonic()
    batch = [await c.make(ctx, [Request("req-0", d)]) for d in free]
    answers = await c.prepare(ctx, batch)
    problems = [p for k in batch if (p := c.answer_problem(k, c.answer_of(answers, k)))]
    ctx.check("prepare-batch", "; ".join(sorted(set(problems))[:3]),
              f"{len(batch)} claims in one call", started)  # fmt: skip
    await _done(ctx, *batch)

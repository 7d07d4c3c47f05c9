"""Restart cases: SIGKILL and start again, a reboot (the CDI dir wiped), and a second
instance beside the first (a rolling update with maxSurge)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from kubedevice.conformance.dra import claims as c
from kubedevice.conformance.dra.claims import KitClaim
from kubedevice.conformance.dra.context import SIGTERM_S, START_S, DraContext, Instance, fmt
from kubedevice.conformance.dra.fixtures import Request
from kubedevice.conformance.dra.health_cases import check_reconnect
from kubedevice.conformance.dra.kubelet import Answer, DraClient, Registration, rpc_text
from kubedevice.conformance.dra.unprepare_cases import unprepare_problem
from kubedevice.conformance.report import Outcome

__all__ = ["check_restarts", "restart"]


async def restart(ctx: DraContext, *, wipe: bool = False, env: dict[str, str] | None = None) -> str:
    """SIGKILL the driver (and what it started), optionally wipe the CDI dir, start it again
    (with ``env`` added, when given; with the run's own environment again for ``{}``) and
    wait for its registration; "" or what went wrong."""
    await ctx.proc.kill()
    if wipe:
        ctx.cdi.wipe()
    if env is not None:
        ctx.instance = ctx.new_instance(ctx.instance.pod_uid, env)
    t = time.monotonic()
    await ctx.start()
    got = await ctx.wait(lambda: bool(ctx.watcher.ok(t)) or not ctx.proc.alive, ctx.cap(START_S))
    if not got or not ctx.proc.alive:
        return (f"driver exited with code {ctx.proc.returncode}" if not ctx.proc.alive
                else f"not registered within {fmt(ctx.cap(START_S))}")  # fmt: skip
    _adopt(ctx, ctx.watcher.ok(t)[-1])
    return ""


def _adopt(ctx: DraContext, reg: Registration) -> None:
    assert reg.info is not None
    ctx.learned.registration = reg
    ctx.learned.endpoint = Path(reg.info.endpoint)


def _same_problem(ctx: DraContext, kept: list[tuple[KitClaim, Answer]],
                  answers: dict[str, Answer] | str) -> str:  # fmt: skip
    problems = []
    for claim, before in kept:
        now = c.answer_of(answers, claim)
        if isinstance(now, str):
            problems.append(now)
        elif now.key() != before.key():
            problems.append(
                f"{claim.ref[1]}: before {before.devices}, now {now.devices or now.error}"
            )
    return "; ".join(problems[:2])


async def check_restarts(ctx: DraContext, first: KitClaim | None) -> None:
    """Kill and start again; then the reboot; then the second instance."""
    kept = [(first, ctx.learned.kept[0][1])] if first is not None and ctx.learned.kept else []
    other = await _prepare_other(ctx)
    started = time.monotonic()
    problem = await restart(ctx)
    ctx.check("restart-reregisters", problem, f"registered again in "
              f"{fmt(time.monotonic() - started)}", started)  # fmt: skip
    if problem:
        ctx.skip(["restart-same-answer", "restart-unprepare", "reboot-specs-back",
                  "upgrade-side-by-side", "health-reconnect"], "the restart failed")  # fmt: skip
        return
    if kept:
        answers = await c.prepare(ctx, [k for k, _ in kept])
        ctx.check("restart-same-answer", _same_problem(ctx, kept, answers), "the same answer")
    else:
        ctx.skip(["restart-same-answer"], "no claim was prepared")
    if other is not None:
        claim, answer = other
        errors = await c.unprepare(ctx, [claim])
        ctx.check("restart-unprepare", unprepare_problem(ctx, errors, claim, answer),
                  "unprepared after the restart, specs removed")  # fmt: skip
        ctx.fixtures.used.difference_update((r.device.pool, r.device.name) for r in claim.requests)
    else:
        ctx.skip(
            ["restart-unprepare"], f"no second claim could be prepared ({ctx.why_no_device()})"
        )
    await check_reconnect(ctx)
    await _reboot(ctx, kept)
    await _side_by_side(ctx, kept)


async def _prepare_other(ctx: DraContext) -> tuple[KitClaim, Answer] | None:
    d = ctx.fixtures.take(ctx.devices(), 1)
    if not d:
        return None
    claim = await c.make(ctx, [Request("req-0", d[0])])
    answer = c.answer_of(await c.prepare(ctx, [claim]), claim)
    if isinstance(answer, str) or answer.error:
        return None
    return claim, answer


async def _reboot(ctx: DraContext, kept: list[tuple[KitClaim, Answer]]) -> None:
    if not kept:
        ctx.skip(["reboot-specs-back"], "no claim was prepared")
        return
    started = time.monotonic()
    problem = await restart(ctx, wipe=True)
    if not problem:
        answers = await c.prepare(ctx, [k for k, _ in kept])
        problem = _same_problem(ctx, kept, answers)
        if not problem and not isinstance(answers, str):
            problem = c.cdi_problems(ctx, list(answers.values()))[0]
    n = len(c.cdi_ids([a for _, a in kept]))
    ctx.check("reboot-specs-back", problem, f"{n} CDI devices back after the wipe", started)


async def _side_by_side(ctx: DraContext, kept: list[tuple[KitClaim, Answer]]) -> None:
    if not any("{pod_uid}" in arg for arg in ctx.opts.command):
        ctx.skip(["upgrade-side-by-side"], "the command does not name {pod_uid}")
        return
    if not kept or ctx.opts.quick:
        ctx.skip(["upgrade-side-by-side"], "quick run" if kept else "no claim was prepared")
        return
    old = ctx.instance
    new = ctx.new_instance()
    started = time.monotonic()
    await ctx.start(new)
    old_socket = ctx.learned.registration.socket if ctx.learned.registration else None

    def second() -> list[Registration]:
        return [r for r in ctx.watcher.ok(started) if r.socket != old_socket]

    if not await ctx.wait(lambda: bool(second()) or not new.proc.alive, ctx.cap(START_S)):
        ctx.add("upgrade-side-by-side", Outcome.FAIL,
                f"the second instance did not register within {fmt(ctx.cap(START_S))}"
                f" ({'running' if new.proc.alive else f'exit {new.proc.returncode}'})")  # fmt: skip
        await new.proc.kill()
        return
    reg = second()[-1]
    assert reg.info is not None
    client = DraClient(Path(reg.info.endpoint), ctx.calls)
    failures: list[str] = []
    stopping = asyncio.ensure_future(old.proc.terminate(SIGTERM_S))
    calls = 0
    while True:
        done = stopping.done()
        try:
            answers = await client.prepare([k.ref for k, _ in kept], version=ctx.learned.version)
            problem = _same_problem(ctx, kept, answers)
        except Exception as exc:
            problem = rpc_text(exc)
        calls += 1
        if problem:
            failures.append(problem)
        if done or calls > 2000:
            break
    await stopping
    await old.proc.kill()
    _switch(ctx, new, reg)
    ctx.check("upgrade-side-by-side", f"{len(failures)} of {calls} calls failed: {failures[0]}"
              if failures else "", f"{calls} calls while the first stopped, none failed",
              started)  # fmt: skip


def _switch(ctx: DraContext, new: Instance, reg: Registration) -> None:
    ctx.instance = new
    _adopt(ctx, reg)

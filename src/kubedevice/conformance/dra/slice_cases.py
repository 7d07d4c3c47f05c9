"""Slice cases: published in time, well formed, only the driver's own, quiet, and back after
the kubelet's start-up wipe or a deletion by someone else."""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
from collections.abc import Callable
from typing import Any

from kubedevice.conformance.dra.apiserver import DRIVER_USER
from kubedevice.conformance.dra.context import BACK_S, FAST_S, START_S, DraContext, fmt
from kubedevice.conformance.dra.kube import RESOURCE, ApiError
from kubedevice.conformance.report import Outcome

__all__ = ["audit_offset", "check_published", "check_quiet", "check_slices_back", "cpu_seconds"]

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
#: Verbs of the driver that a quiet period should not show (watch and get are fine).
_LOUD = {"list", "create", "update", "patch", "delete", "deletecollection"}


async def check_published(ctx: DraContext, started: float, registered: float) -> bool:
    """Slices within the bound; then their form. True when there are devices to allocate."""
    driver = ctx.learned.driver
    got = await ctx.wait(lambda: ctx.pool_complete() or not ctx.proc.alive, ctx.cap(START_S))
    got = got and ctx.pool_complete()
    now = time.monotonic()
    if not got:
        why = (
            f"driver exited with code {ctx.proc.returncode}"
            if not ctx.proc.alive
            else f"no complete pool of {driver} on {ctx.node} within {fmt(ctx.cap(START_S))}"
        )
        if ctx.slices.error:
            why += f" (the kit's watch failed: {ctx.slices.error})"
        ctx.add("slices-published", Outcome.FAIL, why, started)
        return False
    first = min((c.t for c in ctx.slices.changes if c.driver == driver and c.node == ctx.node),
                default=now)  # fmt: skip
    ctx.learned.first_slice_s = first - started
    n = ctx.device_count()
    ctx.add("slices-published", Outcome.PASS,
            f"{n} devices in {len(ctx.slices.of(driver, ctx.node))} slices after "
            f"{fmt(first - started)}", started)  # fmt: skip
    late = first - registered
    ctx.check("slices-published-fast", f"{fmt(late)} after registration" if late > FAST_S else "",
              f"{fmt(max(late, 0))} after registration")  # fmt: skip
    _check_form(ctx)
    return bool(ctx.devices())


def _check_form(ctx: DraContext) -> None:
    driver, node = ctx.learned.driver, ctx.node
    mine = ctx.slices.of(driver, node)
    bad = [s["metadata"]["name"] for s in mine if not (s["spec"].get("pool") or {}).get("name")]
    ctx.check("slices-node", f"slices without a pool name: {bad}" if bad else "",
              f"{len(mine)} slices name {driver}, {node} and a pool")  # fmt: skip
    stray = sorted({f"{c.driver}@{c.node}" for c in ctx.slices.changes
                    if (c.driver == driver) != (c.node == node) and c.type == "ADDED"
                    and (c.node == node or c.driver == driver)})  # fmt: skip
    ctx.check("slices-own-only", f"slices for another node or name: {stray}" if stray else "",
              "only its own node and name")  # fmt: skip
    pools: dict[str, list[dict[str, Any]]] = {}
    for s in mine:
        pools.setdefault(s["spec"]["pool"].get("name", ""), []).append(s)
    problems = []
    for pool, slices in pools.items():
        gens = {int(s["spec"]["pool"].get("generation", 0)) for s in slices}
        counts = {int(s["spec"]["pool"].get("resourceSliceCount", 0)) for s in slices}
        if len(gens) != 1 or counts != {len(slices)}:
            problems.append(f"pool {pool}: generations {sorted(gens)}, resourceSliceCount "
                            f"{sorted(counts)} for {len(slices)} slices")  # fmt: skip
    ctx.check("slices-pool-consistent", "; ".join(problems),
              f"{len(pools)} pool(s), each one generation, counts right")  # fmt: skip
    problems = []
    for pool, slices in pools.items():
        names = [d.get("name", "") for s in slices for d in s["spec"].get("devices") or []]
        dup = sorted({n for n in names if names.count(n) > 1})
        bad = [n for n in names if not (len(n) <= 63 and _DNS_LABEL.match(n))]
        if dup or bad:
            problems.append(f"pool {pool}: repeated {dup}, invalid {bad}")
    ctx.check("slices-devices-valid", "; ".join(problems), "unique, valid device names")


def audit_offset(ctx: DraContext) -> int:
    """How long the audit log is now (0 without one)."""
    try:
        return ctx.audit_log.stat().st_size if ctx.audit_log else 0
    except OSError:
        return 0


def _audited(ctx: DraContext, since: int) -> list[str]:
    """The driver's loud requests in the audit log after ``since`` (verb resource)."""
    assert ctx.audit_log is not None
    with ctx.audit_log.open("rb") as f:
        f.seek(since)
        lines = f.read().decode("utf-8", "replace").splitlines()
    out = []
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if (event.get("user") or {}).get("username") != DRIVER_USER:
            continue
        verb = event.get("verb", "")
        if verb in _LOUD and event.get("stage") == "ResponseComplete":
            out.append(f"{verb} {(event.get('objectRef') or {}).get('resource', '')}")
    return out


def cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU of process ``pid`` so far."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


async def check_quiet(ctx: DraContext) -> None:
    """Nothing to do for the driver: it should only watch."""
    window = 3.0 if ctx.opts.quick else 10.0
    driver = ctx.learned.driver
    t0 = time.monotonic()
    offset = audit_offset(ctx)
    cpu0 = cpu_seconds(ctx.proc.pid)
    await ctx.wait(lambda: not ctx.proc.alive, window)
    cpu1 = cpu_seconds(ctx.proc.pid)
    if cpu0 is not None and cpu1 is not None:
        ctx.learned.idle_cpu = f"{(cpu1 - cpu0) / window * 100:.1f}% of a core over {window:.0f} s"
    writes = [f"{c.type} {c.name}" for c in ctx.slices.changes
              if c.t >= t0 and c.driver == driver]  # fmt: skip
    loud = _audited(ctx, offset) if ctx.audit_log is not None else []
    # a write that changes nothing leaves no watch event; the audit log still shows it
    writes += [x for x in loud if x.endswith(" resourceslices") and not x.startswith("list")]
    ctx.check("slices-quiet-writes",
              f"{len(writes)} slice writes in a quiet {window:.0f} s: {writes[:3]}"
              if writes else "", f"no slice write in {window:.0f} s", t0)  # fmt: skip
    if ctx.audit_log is None:
        ctx.skip(["slices-quiet-list"], "needs the kit's own API server (--k8s-bin)")
        return
    lists = [x for x in loud if x.startswith("list")]
    ctx.check("slices-quiet-list",
              f"{len(lists)} LISTs in a quiet {window:.0f} s: {sorted(set(lists))}"
              if lists else "", f"no LIST in {window:.0f} s", t0)  # fmt: skip


def _deleted(ctx: DraContext, since: float, *, driver: str = "", name: str = "") -> bool:
    """A slice (of ``driver``, or named ``name``) was deleted at or after ``since``."""
    return any(
        c.type == "DELETED" and c.t >= since and (c.driver == driver or c.name == name)
        for c in ctx.slices.changes
    )


async def _back(
    ctx: DraContext, want: int, started: float, gone: Callable[[], bool]
) -> float | str:
    """Seconds from ``started`` until the deletion (``gone``) was seen and then ``want``
    devices in complete pools again; else why not. Both waits are on the kit's watch
    events, bounded together by the case's limit."""
    limit = ctx.cap(BACK_S)
    if not await ctx.wait(gone, limit):  # by its event: the driver may publish again at once
        why = f" (the kit's watch failed: {ctx.slices.error})" if ctx.slices.error else ""
        return f"the kit saw no deletion within {fmt(limit)}{why}"
    left = limit - (time.monotonic() - started)
    if await ctx.wait(lambda: ctx.pool_complete() and ctx.device_count() == want, left):
        return time.monotonic() - started
    return f"not back to {want} devices within {fmt(limit)}"


async def check_slices_back(ctx: DraContext) -> None:
    """The kubelet's start-up wipe, then one slice deleted by someone else."""
    driver, node = ctx.learned.driver, ctx.node
    want = ctx.device_count()
    started = time.monotonic()
    try:
        await asyncio.to_thread(ctx.kube.call, "DELETE", f"{RESOURCE}/resourceslices",
                                fieldSelector=f"spec.nodeName={node}")  # fmt: skip
    except ApiError as exc:
        ctx.add("slices-after-wipe", Outcome.SKIP, f"the kit could not delete: {exc}")
        ctx.skip(["slices-after-delete", "slices-back-fast"], "the wipe failed")
        return
    wipe = await _back(ctx, want, started, lambda: _deleted(ctx, started, driver=driver))
    ctx.check("slices-after-wipe", wipe if isinstance(wipe, str) else "",
              f"{want} devices back in {fmt(wipe if isinstance(wipe, float) else 0)}",
              started)  # fmt: skip
    mine = sorted(ctx.slices.of(driver, node), key=lambda s: s["metadata"]["name"])
    if not mine:
        ctx.skip(["slices-after-delete", "slices-back-fast"], "no slice to delete")
        return
    name = mine[0]["metadata"]["name"]
    started = time.monotonic()
    await asyncio.to_thread(ctx.kube.delete, f"{RESOURCE}/resourceslices/{name}")
    one = await _back(ctx, want, started, lambda: _deleted(ctx, started, name=name))
    ctx.check("slices-after-delete", one if isinstance(one, str) else "",
              f"back in {fmt(one if isinstance(one, float) else 0)}", started)  # fmt: skip
    slow = [f"{what} {fmt(t)}" for what, t in (("wipe", wipe), ("delete", one))
            if isinstance(t, float) and t > FAST_S]  # fmt: skip
    if isinstance(wipe, str) or isinstance(one, str):
        ctx.add("slices-back-fast", Outcome.FAIL, "not back at all")
    else:
        ctx.check("slices-back-fast", f"slow: {', '.join(slow)}" if slow else "",
                  f"wipe {fmt(wipe)}, delete {fmt(one)}")  # fmt: skip

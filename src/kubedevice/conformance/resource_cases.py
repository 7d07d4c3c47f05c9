"""Per-resource cases: registration, first list, options, Allocate, preferred allocation.

Each case adds exactly one result for its resource. The emulator's view of the devices
(duplicates collapsed, as the kubelet does) drives the RPCs; the raw list is read last
over a second ListAndWatch stream, so a plugin that cannot serve two streams is only judged
on that after everything else was observed.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable, Callable

from kubedevice._api import HEALTHY, VERSION
from kubedevice.conformance.context import (
    CTIME_SLACK_S,
    FIRST_LIST_S,
    RPC_S,
    ResourceState,
    RunContext,
    fmt,
    fmt_options,
    rpc_text,
)
from kubedevice.conformance.probe import ProbeClient, rpc_error_text
from kubedevice.conformance.report import Outcome
from kubedevice.conformance.validate import (
    allocate_response_problems,
    device_list_problems,
    endpoint_problems,
    preferred_problems,
    resource_name_problems,
)
from kubedevice.errors import EmulatorError, PluginRpcError
from kubedevice.kubelet import ListAndWatchEvent

__all__ = ["check_resource"]


async def check_resource(ctx: RunContext, res: ResourceState) -> None:
    name = res.name
    _case_serves_first(ctx, res)
    _case_registration_valid(ctx, res)
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
        ctx.skip_rest(name, rest, "the resource never registered successfully")
        return
    if not await _case_first_list(ctx, res):
        ctx.skip_rest(name, rest[1:], "no ListAndWatch message to work from")
        return
    status = ctx.emu.node().resources.get(name)
    if status is None:
        ctx.skip_rest(name, rest[1:], "the emulator lost the resource")
        return
    # The kubelet's view (duplicates collapsed) drives the RPC cases; the raw list is
    # read last over a second stream, so a plugin that cannot serve two streams is
    # only judged on that after everything else was observed.
    res.devices = [(d.id, d.health) for d in status.devices]
    res.healthy = [d.id for d in status.devices if d.health == HEALTHY]
    res.unhealthy = [d.id for d in status.devices if d.health != HEALTHY]
    cases: list[tuple[str, Callable[[], Awaitable[None]]]] = [
        ("options-honest", lambda: _case_options(ctx, res)),
        ("allocate-healthy", lambda: _case_allocate_healthy(ctx, res)),
        ("allocate-unknown-refused", lambda: _case_allocate_refused(ctx, res, unknown=True)),
        (
            "allocate-unhealthy-refused",
            lambda: _case_allocate_refused(ctx, res, unknown=False),
        ),
        ("preferred-allocation", lambda: _case_preferred(ctx, res)),
        ("device-list-valid", lambda: _case_device_list(ctx, res)),
    ]
    for case_id, case in cases:
        try:
            await case()
        except EmulatorError as exc:  # the resource went away under the case
            ctx.add(case_id, Outcome.FAIL, f"resource no longer connected: {exc}", name)


def _case_serves_first(ctx: RunContext, res: ResourceState) -> None:
    reg = res.first_reg
    created = ctx.created.get(reg.endpoint)
    if created is None:
        ctx.add(
            "serves-before-register",
            Outcome.FAIL,
            f"Register named endpoint {reg.endpoint!r}, but no such socket existed "
            f"({reg.error or 'not in the device plugin dir'})",
            res.name,
        )
    elif created > reg.t + CTIME_SLACK_S:
        ctx.add(
            "serves-before-register",
            Outcome.FAIL,
            f"Register arrived {fmt(created - reg.t)} before socket {reg.endpoint!r} was created",
            res.name,
        )
    elif reg.error is not None and reg.error.startswith("failed to dial"):
        ctx.add(
            "serves-before-register",
            Outcome.FAIL,
            f"socket {reg.endpoint!r} existed but did not answer: {reg.error}",
            res.name,
        )
    else:
        ctx.add(
            "serves-before-register",
            Outcome.PASS,
            f"socket {reg.endpoint!r} existed {fmt(reg.t - created)} before Register "
            "arrived" + (" and answered the dial" if reg.dialed else ""),
            res.name,
        )


def _case_registration_valid(ctx: RunContext, res: ResourceState) -> None:
    problems: list[str] = []
    for reg in ctx.regs(res.name):
        if reg.version != VERSION:
            problems.append(f"version {reg.version!r} (must be {VERSION!r})")
        if "/" in reg.endpoint or not reg.endpoint:
            problems += endpoint_problems(reg.endpoint, ctx.dir)
        problems += resource_name_problems(reg.resource)
        if problems:
            break
    if not problems and res.ok_reg is None:
        problems.append(f"the kubelet refused it: {res.first_reg.error}")
    if not problems and res.ok_reg is not None:
        # The socket must be there now, as a socket, unless the plugin already moved on.
        cur = ctx.current_endpoint_name(res.name) or res.ok_reg.endpoint
        problems += endpoint_problems(cur, ctx.dir)
    if problems:
        ctx.add("registration-valid", Outcome.FAIL, f"Register: {problems[0]}", res.name)
        return
    assert res.ok_reg is not None
    ctx.add(
        "registration-valid",
        Outcome.PASS,
        f"version {VERSION}, endpoint {res.ok_reg.endpoint!r}, name {res.name!r} accepted",
        res.name,
    )


async def _case_first_list(ctx: RunContext, res: ResourceState) -> bool:
    assert res.ok_reg is not None
    t_reg = res.ok_reg.t
    limit = ctx.cap(FIRST_LIST_S)

    def first() -> ListAndWatchEvent | None:
        return next(
            (e for e in ctx.emu.events.of_type(ListAndWatchEvent, t_reg) if e.resource == res.name),
            None,
        )

    remaining = max(0.0, t_reg + limit - time.monotonic())
    await ctx.wait(lambda: first() is not None, remaining)
    msg = first()
    if msg is None or msg.t - t_reg > limit:
        what = f"{ctx.exit_text()}; " if not ctx.proc.alive else ""
        ctx.add(
            "first-list-within-5s",
            Outcome.FAIL,
            f"{what}no ListAndWatch message within {fmt(limit)} of registration",
            res.name,
        )
        return False
    ctx.add(
        "first-list-within-5s",
        Outcome.PASS,
        f"first message {fmt(msg.t - t_reg)} after registration: "
        f"{msg.devices} devices, {msg.healthy} healthy",
        res.name,
    )
    return True


async def _case_device_list(ctx: RunContext, res: ResourceState) -> None:
    started = time.monotonic()
    sock = ctx.endpoint(res.name).socket_path
    try:
        async with ProbeClient(sock, rpc_timeout=ctx.cap(RPC_S)) as probe:
            devices = await probe.first_list(ctx.cap(FIRST_LIST_S))
    except (Exception, TimeoutError) as exc:
        ctx.add(
            "device-list-valid",
            Outcome.FAIL,
            f"a new ListAndWatch stream gave no first message: {rpc_error_text(exc)}",
            res.name,
            started,
        )
        return
    problems = device_list_problems(devices)
    if problems:
        more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
        ctx.add("device-list-valid", Outcome.FAIL, problems[0] + more, res.name, started)
    else:
        healthy = sum(1 for _, h in devices if h == HEALTHY)
        ctx.add(
            "device-list-valid",
            Outcome.PASS,
            f"{len(devices)} unique IDs; {healthy} Healthy, {len(devices) - healthy} Unhealthy",
            res.name,
            started,
        )


async def _case_options(ctx: RunContext, res: ResourceState) -> None:
    started = time.monotonic()
    assert res.ok_reg is not None
    reg = res.ok_reg
    opts = reg.options
    res.options = opts
    if opts is None:
        ctx.add("options-honest", Outcome.FAIL, "no GetDevicePluginOptions answer", res.name)
        return
    if reg.request_options != opts:
        ctx.add(
            "options-honest",
            Outcome.FAIL,
            f"RegisterRequest.options ({fmt_options(reg.request_options)}) differ from "
            f"GetDevicePluginOptions ({fmt_options(opts)})",
            res.name,
            started,
        )
        return
    ep = ctx.endpoint(res.name)
    checked: list[str] = []
    ids = res.healthy[:1] or [i for i, _ in (res.devices or [])[:1]]
    try:
        if opts.get_preferred_allocation_available:
            avail = res.healthy or ids
            await ctx.bounded(
                ep.get_preferred_allocation(avail, [], min(1, len(avail))), ctx.cap(RPC_S)
            )
            checked.append("GetPreferredAllocation")
        if opts.pre_start_required:
            await ctx.bounded(ep.pre_start(ids), ctx.cap(RPC_S))
            checked.append("PreStartContainer")
    except Exception as exc:
        rpc = getattr(exc, "rpc", "an advertised RPC")
        ctx.add(
            "options-honest",
            Outcome.FAIL,
            f"{rpc} is advertised but failed: {getattr(exc, 'code', '')} "
            f"{getattr(exc, 'details', rpc_error_text(exc))}".rstrip(),
            res.name,
            started,
        )
        return
    answered = " and ".join(checked) + " answered" if checked else "no optional RPC advertised"
    ctx.add("options-honest", Outcome.PASS, f"{fmt_options(opts)}; {answered}", res.name, started)


async def _case_allocate_healthy(ctx: RunContext, res: ResourceState) -> None:
    started = time.monotonic()
    if not res.healthy:
        ctx.add("allocate-healthy", Outcome.SKIP, "no Healthy device advertised", res.name)
        return
    requests = [res.healthy[:1]]
    if len(res.healthy) > 1:
        requests.append(res.healthy[:2])
    for ids in requests:
        try:
            resp = await ctx.bounded(ctx.endpoint(res.name).allocate(ids), ctx.cap(RPC_S))
        except Exception as exc:
            ctx.add(
                "allocate-healthy",
                Outcome.FAIL,
                f"Allocate({ids}) failed: {rpc_text(exc)}",
                res.name,
                started,
            )
            return
        problems = allocate_response_problems(resp)
        if problems:
            ctx.add(
                "allocate-healthy",
                Outcome.FAIL,
                f"Allocate({ids}): {problems[0]}",
                res.name,
                started,
            )
            return
    ctx.add(
        "allocate-healthy",
        Outcome.PASS,
        f"{len(requests)} Allocate calls ({', '.join(str(len(r)) for r in requests)} "
        "devices) each answered one well-formed container response",
        res.name,
        started,
    )


async def _case_allocate_refused(ctx: RunContext, res: ResourceState, *, unknown: bool) -> None:
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
        ctx.add(case_id, Outcome.SKIP, "no unhealthy device advertised", res.name)
        return
    what = "an ID never advertised" if unknown else "an unhealthy device"
    try:
        await ctx.bounded(ctx.endpoint(res.name).allocate([dev]), ctx.cap(RPC_S))
    except PluginRpcError as exc:
        ctx.add(
            case_id,
            Outcome.PASS,
            f"Allocate([{dev!r}]) refused: {rpc_text(exc)}",
            res.name,
            started,
        )
        return
    except Exception as exc:
        ctx.add(
            case_id,
            Outcome.FAIL,
            f"Allocate([{dev!r}]) got no answer from the plugin: {rpc_text(exc)}",
            res.name,
            started,
        )
        return
    ctx.add(case_id, Outcome.FAIL, f"Allocate([{dev!r}]) of {what} succeeded", res.name, started)


async def _case_preferred(ctx: RunContext, res: ResourceState) -> None:
    started = time.monotonic()
    opts = res.options
    if opts is None or not opts.get_preferred_allocation_available:
        ctx.add(
            "preferred-allocation",
            Outcome.SKIP,
            "GetPreferredAllocation not advertised",
            res.name,
        )
        return
    avail = res.healthy
    if not avail:
        ctx.add("preferred-allocation", Outcome.SKIP, "no Healthy device advertised", res.name)
        return
    asks: list[tuple[list[str], list[str], int]] = [
        (list(avail), [], 1),
        (list(avail), [], len(avail)),
    ]
    if len(avail) >= 2:
        asks.append((list(avail), [avail[-1]], 2))
    ep = ctx.endpoint(res.name)
    logged = ctx.log_offset()
    for available, must, size in asks:
        try:
            answer = await ctx.bounded(
                ep.get_preferred_allocation(available, must, size), ctx.cap(RPC_S)
            )
        except Exception as exc:
            ctx.add(
                "preferred-allocation",
                Outcome.FAIL,
                f"GetPreferredAllocation(size={size}, must_include={must}) failed: {rpc_text(exc)}",
                res.name,
                started,
            )
            return
        problems = preferred_problems(available, must, size, list(answer))
        if problems:
            ctx.add(
                "preferred-allocation",
                Outcome.FAIL,
                f"size={size}, must_include={must}: {problems[0]}",
                res.name,
                started,
            )
            return
    # A plugin whose hook failed, or answered wrongly, may still answer validly from a
    # fallback or a repair (the SDK does both): the line it logged meanwhile is the only
    # trace that the answer is not the one its author wrote.
    errors = ctx.logged_errors(logged)
    if errors:
        ctx.add(
            "preferred-allocation",
            Outcome.FAIL,
            "the answers were valid, but the plugin logged an error while answering "
            f"(its hook failed or its answer was repaired): {errors[0][:200]}",
            res.name,
            started,
        )
        return
    ctx.add(
        "preferred-allocation",
        Outcome.PASS,
        f"{len(asks)} requests: answers kept must-include IDs, had allocation_size IDs, "
        "only offered ones",
        res.name,
        started,
    )

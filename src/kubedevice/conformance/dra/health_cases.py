"""Health cases, where the driver offers DRAResourceHealth: a stream per connection, every
published device reported, a new stream after a restart."""

from __future__ import annotations

import time

from grpc import aio

from kubedevice.conformance.dra.context import FAST_S, DraContext, fmt
from kubedevice.conformance.dra.kubelet import HEALTH_SERVICE, HealthStream, rpc_text
from kubedevice.conformance.report import Outcome

__all__ = ["check_health", "check_reconnect"]

_NOT_OFFERED = f"{HEALTH_SERVICE} not in supported_versions"


async def _first(
    ctx: DraContext, stream: HealthStream, limit: float
) -> dict[tuple[str, str], str] | str:
    try:
        return await stream.next(limit)
    except TimeoutError:
        return f"no message within {fmt(limit)}"
    except (aio.AioRpcError, EOFError, OSError) as exc:
        return rpc_text(exc)


async def check_health(ctx: DraContext) -> None:
    """The stream, the devices it names, two streams at once."""
    ids = ["health-stream", "health-all-devices", "health-per-connection"]
    if not ctx.learned.health:
        ctx.skip(ids, _NOT_OFFERED)
        return
    assert ctx.learned.endpoint is not None
    started = time.monotonic()
    one = HealthStream(ctx.learned.endpoint)
    two: HealthStream | None = None
    try:
        first = await _first(ctx, one, ctx.cap(FAST_S))  # how soon: what the case judges
        if isinstance(first, str):
            ctx.add("health-stream", Outcome.FAIL, first, started)
            ctx.skip(ids, "no health message")
            return
        ctx.check("health-stream", "", f"{len(first)} devices in {fmt(time.monotonic() - started)}",
                  started)  # fmt: skip
        published = {(d.pool, d.name) for d in ctx.devices()}
        missing = sorted(published - set(first))
        ctx.check("health-all-devices", f"not reported: {missing[:3]} ({len(missing)} in all)"
                  if missing else "", f"all {len(published)} published devices")  # fmt: skip
        started = time.monotonic()
        two = HealthStream(ctx.learned.endpoint)
        # served at all is what counts here; the kubelet waits on a stream without a bound
        second = await _first(ctx, two, ctx.opts.timeout)
        ctx.check("health-per-connection", second if isinstance(second, str) else "",
                  "a second stream served beside the first", started)  # fmt: skip
    finally:
        await one.close()
        if two is not None:
            await two.close()


async def check_reconnect(ctx: DraContext) -> None:
    """After a restart of the driver, a new stream is served."""
    if not ctx.learned.health:
        ctx.skip(["health-reconnect"], _NOT_OFFERED)
        return
    assert ctx.learned.endpoint is not None
    started = time.monotonic()
    stream = HealthStream(ctx.learned.endpoint)
    try:
        first = await _first(ctx, stream, ctx.opts.timeout)
    finally:
        await stream.close()
    ctx.check("health-reconnect", first if isinstance(first, str) else "",
              f"a new stream after the restart, {len(first)} devices", started)  # fmt: skip

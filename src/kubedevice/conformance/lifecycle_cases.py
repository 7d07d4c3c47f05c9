"""Lifecycle cases: a dropped ListAndWatch stream, a kubelet restart, SIGTERM.

These run after the per-resource cases, in that order, because each can end the plugin:
a plugin that dies when its stream is dropped is not asked to re-register or to stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
import time
from pathlib import Path

from kubedevice._api import KUBELET_SOCKET
from kubedevice.conformance.context import (
    RECOVERY_S,
    REREGISTER_MUST_S,
    REREGISTER_SHOULD_S,
    RPC_S,
    SIGTERM_S,
    ResourceState,
    RunContext,
    fmt,
)
from kubedevice.conformance.probe import ProbeClient, rpc_error_text
from kubedevice.conformance.report import Outcome
from kubedevice.errors import EmulatorError
from kubedevice.kubelet import KubeletStartedEvent, ListAndWatchEvent, StreamEndEvent

__all__ = ["check_restart", "check_sigterm", "check_stream_kill"]


def _allocatable_back(ctx: RunContext, res: ResourceState, t: float) -> bool:
    """Registered again after ``t``, streaming, and allocatable = healthy in the last list."""
    reg = ctx.registered_after(res.name, t)
    if reg is None:
        return False
    lists = [e for e in ctx.emu.events.of_type(ListAndWatchEvent, reg.t) if e.resource == res.name]
    status = ctx.emu.node().resources.get(res.name)
    return (
        bool(lists)
        and status is not None
        and status.connected
        and status.allocatable == lists[-1].healthy
    )


def _allocatable(ctx: RunContext, resource: str) -> int:
    status = ctx.emu.node().resources.get(resource)
    return status.allocatable if status is not None else 0


def _stale_end_raced(ctx: RunContext, resource: str, t_kill: float, old_sock: Path) -> bool:
    """True if the killed stream's end arrived after a re-registration and dropped it.

    The emulator processes the end of a stream it cancelled asynchronously; a plugin
    that re-registers within milliseconds can be disconnected again by that stale end
    (released kubelets key clients by resource name, kubernetes#121994).
    """
    reg = ctx.registered_after(resource, t_kill)
    if reg is None:
        return False
    return any(
        e.resource == resource and e.socket == str(old_sock) and e.disconnected
        for e in ctx.emu.events.of_type(StreamEndEvent, reg.t)
    )


async def check_stream_kill(ctx: RunContext) -> None:
    """Drop every resource's stream at once, then judge each (one shared deadline)."""
    await asyncio.gather(*(_stream_kill(ctx, res) for res in ctx.resources.values()))


async def _stream_kill(ctx: RunContext, res: ResourceState) -> None:
    ids = ("survives-stream-kill", "recovers-after-stream-kill")
    if res.ok_reg is None or res.devices is None:
        ctx.skip_rest(res.name, ids, "the resource never served a device list")
        return
    if not ctx.proc.alive:
        ctx.skip_rest(res.name, ids, f"{ctx.exit_text()} earlier")
        return
    started = time.monotonic()
    try:
        ep = ctx.endpoint(res.name)
    except EmulatorError as exc:
        ctx.skip_rest(res.name, ids, f"resource not connected before the kill: {exc}")
        return
    old_sock = ep.socket_path
    t_kill = time.monotonic()
    ep.kill_stream()
    limit = ctx.cap(RECOVERY_S)

    def back() -> bool:
        return _allocatable_back(ctx, res, t_kill)

    def raced() -> bool:
        return _stale_end_raced(ctx, res.name, t_kill, old_sock)

    recovered = await ctx.wait(lambda: back() or raced(), limit)
    await _judge_survival(ctx, res, old_sock, started)
    reg = ctx.registered_after(res.name, t_kill)
    if recovered and reg is not None:
        note = (
            f"allocatable back to {_allocatable(ctx, res.name)}"
            if back()
            else "the killed stream's late end then dropped the new registration "
            "(emulated kubernetes#121994 race, not the plugin's doing)"
        )
        ctx.add(
            "recovers-after-stream-kill",
            Outcome.PASS,
            f"re-registered {fmt(reg.t - t_kill)} after the stream was dropped; {note}",
            res.name,
            started,
        )
        return
    alloc = _allocatable(ctx, res.name)
    if not ctx.proc.alive:
        what = ctx.exit_text()
    elif reg is not None:
        what = f"re-registered but no device list restored allocatable (it is {alloc})"
    else:
        what = f"no re-registration within {fmt(limit)}; allocatable stays {alloc}"
    ctx.add("recovers-after-stream-kill", Outcome.FAIL, what, res.name, started)


async def _judge_survival(
    ctx: RunContext, res: ResourceState, old_sock: Path, started: float
) -> None:
    if not ctx.proc.alive:
        ctx.add(
            "survives-stream-kill",
            Outcome.FAIL,
            f"{ctx.exit_text()} after its ListAndWatch stream was dropped",
            res.name,
            started,
        )
        return
    sock = old_sock
    if ctx.registered_after(res.name, started) is not None:
        with contextlib.suppress(EmulatorError):
            sock = ctx.endpoint(res.name).socket_path
    try:
        async with ProbeClient(sock, rpc_timeout=ctx.cap(RPC_S)) as probe:
            await probe.options()
    except Exception as exc:
        ctx.add(
            "survives-stream-kill",
            Outcome.FAIL,
            f"process alive but {sock.name} no longer answers: {rpc_error_text(exc)}",
            res.name,
            started,
        )
        return
    ctx.add(
        "survives-stream-kill",
        Outcome.PASS,
        f"process alive; {sock.name} still answers GetDevicePluginOptions",
        res.name,
        started,
    )


async def check_restart(ctx: RunContext) -> None:
    ids = ("reregister-within-30s", "reregister-within-1s")
    live = [r for r in ctx.resources.values() if r.ok_reg is not None]
    for res in ctx.resources.values():
        if res.ok_reg is None:
            ctx.skip_rest(res.name, ids, "the resource never registered successfully")
    if not live:
        return
    if not ctx.proc.alive:
        for res in live:
            ctx.skip_rest(res.name, ids, f"{ctx.exit_text()} earlier")
        return
    started = time.monotonic()
    await ctx.emu.restart()
    served = [e for e in ctx.emu.events.of_type(KubeletStartedEvent, started) if e.restart]
    t_ready = served[-1].t if served else time.monotonic()
    limit = ctx.cap(REREGISTER_MUST_S)
    await ctx.wait(
        lambda: all(ctx.registered_after(r.name, t_ready) for r in live),
        max(0.0, t_ready + limit - time.monotonic()),
    )
    for res in live:
        reg = ctx.registered_after(res.name, t_ready)
        if reg is None:
            why = (
                f"{ctx.exit_text()} after the kubelet restart"
                if not ctx.proc.alive
                else f"no successful Register within {fmt(limit)} of the kubelet restart"
            )
            ctx.add("reregister-within-30s", Outcome.FAIL, why, res.name, started)
            ctx.add("reregister-within-1s", Outcome.FAIL, why, res.name, started)
            continue
        delay = reg.t - t_ready
        ok30 = delay <= REREGISTER_MUST_S
        ctx.add(
            "reregister-within-30s",
            Outcome.PASS if ok30 else Outcome.FAIL,
            f"registered again {fmt(delay)} after kubelet.sock came back",
            res.name,
            started,
        )
        ok1 = delay <= REREGISTER_SHOULD_S
        ctx.add(
            "reregister-within-1s",
            Outcome.PASS if ok1 else Outcome.FAIL,
            f"registered again {fmt(delay)} after kubelet.sock came back"
            + ("" if ok1 else " (> 1 s)"),
            res.name,
            started,
        )


def _plugin_sockets(ctx: RunContext) -> set[str]:
    out = set()
    with contextlib.suppress(OSError):
        for entry in os.scandir(ctx.dir):
            if entry.name != KUBELET_SOCKET and stat.S_ISSOCK(
                entry.stat(follow_symlinks=False).st_mode
            ):
                out.add(entry.name)
    return out


async def check_sigterm(ctx: RunContext) -> None:
    if not ctx.proc.alive:
        ctx.add("sigterm-clean-exit", Outcome.SKIP, f"{ctx.exit_text()} earlier")
        return
    started = time.monotonic()
    sockets = _plugin_sockets(ctx)
    limit = ctx.cap(SIGTERM_S)
    code = await ctx.proc.terminate(limit)
    took = time.monotonic() - started
    if code is None:
        await ctx.proc.kill()
        ctx.add(
            "sigterm-clean-exit",
            Outcome.FAIL,
            f"still running {fmt(limit)} after SIGTERM (killed)",
            started=started,
        )
        return
    orphans = await ctx.proc.kill_group()
    left = sorted(s for s in sockets if (ctx.dir / s).exists())
    if orphans:
        ctx.add(
            "sigterm-clean-exit",
            Outcome.FAIL,
            f"exited {code} after {fmt(took)} but left {len(orphans)} process(es) it "
            f"started running (pid {', '.join(orphans)}); killed them",
            started=started,
        )
    elif code != 0:
        ctx.add(
            "sigterm-clean-exit",
            Outcome.FAIL,
            f"exit code {code} after SIGTERM",
            started=started,
        )
    elif left:
        ctx.add(
            "sigterm-clean-exit",
            Outcome.FAIL,
            f"exited 0 after {fmt(took)} but left socket(s) {', '.join(left)}",
            started=started,
        )
    else:
        ctx.add(
            "sigterm-clean-exit",
            Outcome.PASS,
            f"exited 0 after {fmt(took)}; "
            + (f"removed {', '.join(sorted(sockets))}" if sockets else "it had no socket left"),
            started=started,
        )

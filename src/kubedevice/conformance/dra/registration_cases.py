"""Registration cases: the socket in plugins_registry/, GetInfo's answer, the services.

Also the two registrations a running driver sees again: a refused one, and a kubelet that
restarted and scans plugins_registry/ once more.
"""

from __future__ import annotations

import re
import stat
import time
from pathlib import Path

from grpc import aio

from kubedevice.conformance.dra.context import START_S, DraContext, fmt
from kubedevice.conformance.dra.kubelet import (
    V1,
    V1BETA1,
    notify,
    register,
    rpc_text,
)
from kubedevice.conformance.report import Outcome

__all__ = ["check_registration", "check_reregistration"]

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
REG_CASES = (
    "reg-socket", "reg-type", "reg-name", "reg-endpoint", "reg-endpoint-place", "reg-versions",
    "reg-versions-v1", "reg-services-answer", "reg-notify",
)  # fmt: skip


def _is_socket(path_text: str) -> bool:
    try:
        return stat.S_ISSOCK(Path(path_text).lstat().st_mode)
    except (OSError, ValueError):
        return False


async def check_registration(ctx: DraContext, started: float) -> bool:
    """Wait for the first registration and judge it; True when the driver can be called."""
    w = ctx.watcher
    await ctx.wait(lambda: any(r.info is not None for r in w.registrations) or not ctx.proc.alive,
                   ctx.cap(START_S))  # fmt: skip
    seen = [r for r in w.registrations if r.info is not None] or w.registrations
    if not seen:
        why = (
            f"driver exited with code {ctx.proc.returncode} before a socket appeared"
            if not ctx.proc.alive
            else f"no socket in {ctx.registry} within {fmt(ctx.cap(START_S))} (does the "
            "command name {registry_dir} or {kubelet_dir}?)"
        )
        ctx.add("reg-socket", Outcome.FAIL, why, started)
        ctx.skip(REG_CASES, "no registration socket")
        return False
    reg = seen[0]
    ctx.learned.registration = reg
    ctx.add("reg-socket", Outcome.PASS,
            f"{reg.socket.name} after {fmt(reg.t - started)}", started)  # fmt: skip
    info = reg.info
    if info is None:
        ctx.add("reg-type", Outcome.FAIL, reg.error)
        ctx.skip(REG_CASES, "GetInfo did not answer")
        return False
    ctx.check("reg-type", "" if info.type == "DRAPlugin" else f"type {info.type!r}",
              "DRAPlugin")  # fmt: skip
    name = info.name
    problem = ""
    if not (name and len(name) <= 63 and _DNS_SUBDOMAIN.match(name)):
        problem = f"driver name {name!r} is not a DNS subdomain of at most 63 characters"
    elif ctx.opts.driver_name and name != ctx.opts.driver_name:
        problem = f"driver name {name!r}, --expect-driver says {ctx.opts.driver_name!r}"
    ctx.check("reg-name", problem, name)
    ctx.learned.driver = name
    endpoint = info.endpoint
    if not endpoint.startswith("/"):
        ctx.add("reg-endpoint", Outcome.FAIL, f"endpoint {endpoint!r} is not an absolute path")
    elif not _is_socket(endpoint):
        ctx.add("reg-endpoint", Outcome.FAIL, f"endpoint {endpoint} is not a socket")
    else:
        ctx.learned.endpoint = Path(endpoint)
        ctx.add("reg-endpoint", Outcome.PASS, endpoint)
    inside = endpoint.startswith(str(ctx.plugins) + "/")
    ctx.check("reg-endpoint-place", "" if inside else f"{endpoint} is not under {ctx.plugins}",
              f"under {ctx.plugins}")  # fmt: skip
    versions = tuple(info.supported_versions)
    ctx.learned.versions = versions
    dra = [v for v in (V1, V1BETA1) if v in versions]
    ctx.check("reg-versions", "" if dra else f"no DRA service in {list(versions)}",
              ", ".join(versions))  # fmt: skip
    ctx.check("reg-versions-v1", "" if len(dra) == 2 else f"only {dra or list(versions)}",
              "v1 and v1beta1")  # fmt: skip
    ctx.check("reg-notify", "" if reg.notified else reg.error or "not notified",
              "NotifyRegistrationStatus answered")  # fmt: skip
    if ctx.learned.endpoint is None or not dra:
        ctx.skip(["reg-services-answer"], "no endpoint or service to call")
        return False
    failed = []
    for version in dra:
        try:
            await ctx.client().prepare([], version=version)  # the kubelet's 45 s
        except (aio.AioRpcError, OSError) as exc:
            failed.append(f"{version}: {rpc_text(exc)}")
    ctx.check("reg-services-answer", "; ".join(failed), f"{', '.join(dra)} answered")
    return not failed


async def check_reregistration(ctx: DraContext) -> None:
    """A refused registration, then a kubelet restart (the watcher scans again)."""
    reg = ctx.learned.registration
    if reg is None or not ctx.usable():
        ctx.skip(["reg-refused-survives", "reg-kubelet-restart"], "the driver is not registered")
        return
    started = time.monotonic()
    answered = "answered"
    try:
        await notify(reg.socket, False, "kubedevice conformance: refused on purpose")
    except (aio.AioRpcError, OSError) as exc:  # the kubelet only logs an error answer
        answered = f"answered {rpc_text(exc)[:60]}"
    await ctx.wait(lambda: not ctx.proc.alive, 1.0)
    if not ctx.proc.alive:
        problem = f"driver exited with code {ctx.proc.returncode} after a refusal"
    else:
        again = await register(reg.socket)
        problem = "" if again.ok else f"registering again: {again.error}"
    ctx.check("reg-refused-survives", problem,
              f"refusal {answered}; stayed up, registered again", started)  # fmt: skip
    if not ctx.proc.alive:
        ctx.skip(["reg-kubelet-restart"], "the driver exited")
        return
    started = time.monotonic()
    ctx.watcher.rescan()
    got = await ctx.wait(lambda: bool(ctx.watcher.ok(started)), ctx.cap(START_S))
    problem = "" if got else f"no successful registration within {fmt(ctx.cap(START_S))}"
    if got:
        try:
            await ctx.client().prepare([], version=ctx.learned.version)
        except (aio.AioRpcError, OSError) as exc:
            problem = f"after re-registration the DRA socket failed: {rpc_text(exc)}"
    ctx.check("reg-kubelet-restart", problem,
              f"registered again in {fmt(time.monotonic() - started)}", started)  # fmt: skip

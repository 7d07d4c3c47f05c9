"""The last cases: SIGTERM (sockets removed, exit in time) and the cost figures, reported."""

from __future__ import annotations

import os
import statistics
import time

from kubedevice.conformance.dra.context import FAST_S, SIGTERM_S, DraContext, fmt
from kubedevice.conformance.report import Outcome

__all__ = ["check_sigterm", "report_cost", "rss_mib"]

#: SIGTERM comes at least this long after the instance started.
SETTLE_S = 2.0


def rss_mib(pids: list[int]) -> float | None:
    """Resident memory of ``pids`` together, MiB (None when none could be read)."""
    total = 0
    read = False
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
                        read = True
        except (OSError, ValueError, IndexError):
            continue
    return total / 1024 if read else None


async def check_sigterm(ctx: DraContext) -> None:
    """SIGTERM: exit status and time, and the sockets gone."""
    ids = ["sigterm-sockets", "sigterm-exit", "sigterm-exit-fast", "cost-sigterm-exit"]
    if not ctx.proc.alive:
        ctx.skip(ids, f"driver already exited with code {ctx.proc.returncode}")
        return
    # as in a rolling update, not in the instance's first moments (a driver still starting, as
    # the upstream helper waits a second for its informer, may exit otherwise)
    settle = ctx.instance.started + SETTLE_S - time.monotonic()
    if settle > 0:
        await ctx.wait(lambda: not ctx.proc.alive, settle)
    pid = ctx.proc.pid
    ctx.learned.rss = rss_mib([p for p in [pid, *ctx.proc.leftovers()] if p is not None])
    reg = ctx.learned.registration
    sockets = [p for p in (reg.socket if reg else None, ctx.learned.endpoint) if p is not None]
    started = time.monotonic()
    code = await ctx.proc.terminate(ctx.cap(SIGTERM_S))
    took = time.monotonic() - started
    if code is None:
        ctx.add("sigterm-exit", Outcome.FAIL, f"still running {fmt(took)} after SIGTERM", started)
        ctx.add("sigterm-exit-fast", Outcome.FAIL, "did not exit")
        ctx.add("cost-sigterm-exit", Outcome.SKIP, "did not exit")
        await ctx.proc.kill()
    else:
        ctx.add("sigterm-exit", Outcome.PASS, f"exit {code} in {fmt(took)}", started)
        ctx.check("sigterm-exit-fast", "" if code == 0 and took <= FAST_S else
                  f"exit {code} in {fmt(took)}", f"exit 0 in {fmt(took)}")  # fmt: skip
        ctx.add("cost-sigterm-exit", Outcome.PASS, fmt(took))
    left = [str(p) for p in sockets if _exists(str(p))]
    ctx.check("sigterm-sockets", f"left behind: {left}" if left else "",
              f"{len(sockets)} sockets removed")  # fmt: skip


def _exists(path: str) -> bool:
    return os.path.lexists(path)


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def report_cost(ctx: DraContext) -> None:
    """The cost figures (INFO: reported, never judged)."""
    rss = ctx.learned.rss
    ctx.add("cost-rss", *((Outcome.PASS, f"{rss:.0f} MiB") if rss is not None
                          else (Outcome.SKIP, "not measured")))  # fmt: skip
    cpu = ctx.learned.idle_cpu
    ctx.add("cost-idle-cpu", *((Outcome.PASS, cpu) if cpu else (Outcome.SKIP, "not measured")))
    times = [x.seconds for x in ctx.calls.calls
             if x.rpc == "prepare" and x.claims == 1 and not x.error and x.limit >= 45]  # fmt: skip
    if times:
        ctx.add("cost-prepare-latency", Outcome.PASS,
                f"p50 {fmt(statistics.median(times))}, p99 {fmt(_pct(times, 0.99))} "
                f"({len(times)} calls)")  # fmt: skip
    else:
        ctx.add("cost-prepare-latency", Outcome.SKIP, "no one-claim prepare")
    first = ctx.learned.first_slice_s
    ctx.add("cost-start-to-slices", *((Outcome.PASS, fmt(first)) if first is not None
                                      else (Outcome.SKIP, "no slice")))  # fmt: skip

"""A DRA driver run as a real process whose prepare hook never returns (``--stuck sync``: a
plain ``def`` waiting in its thread; ``--stuck async``: an ``async def`` waiting on the loop).
It writes ``<state>/entered`` when the hook starts."""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import kubedevice.dra as dra
from dra.fakes import DRIVER, gpus


class StuckDriver(dra.Driver):
    driver_name = DRIVER

    def __init__(self, state: Path) -> None:
        self.state = state
        state.mkdir(parents=True, exist_ok=True)

    async def devices(self) -> AsyncIterator[Sequence[dra.Device]]:
        yield gpus(2)
        await asyncio.Event().wait()


class SyncStuck(StuckDriver):
    def prepare(self, claim: dra.Claim) -> Sequence[dra.PreparedDevice]:  # type: ignore[override]
        (self.state / "entered").write_text("sync\n")
        threading.Event().wait()
        return []


class AsyncStuck(StuckDriver):
    async def prepare(self, claim: dra.Claim) -> Sequence[dra.PreparedDevice]:
        (self.state / "entered").write_text("async\n")
        await asyncio.Event().wait()
        return []


def main() -> int:
    parser = dra.argument_parser()
    parser.add_argument("--state", type=Path, required=True)
    parser.add_argument("--stuck", choices=("sync", "async"), required=True)
    args = parser.parse_args()
    driver = SyncStuck(args.state) if args.stuck == "sync" else AsyncStuck(args.state)
    return dra.main(driver, args=args)


if __name__ == "__main__":
    sys.exit(main())

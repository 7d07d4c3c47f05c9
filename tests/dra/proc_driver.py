"""A DRA driver run as a real process by the tests (``python -m dra.proc_driver --state DIR``,
from ``tests/``: run as a script, its directory would shadow the standard library).

Its prepare hook leaves a side effect, ``<state>/effects/<claim UID>``, and then waits
(inotify) until ``<state>/go`` exists, so a test can kill the process in the middle of it;
its unprepare hook removes the effect and appends ``unprepare <claim UID>`` to
``<state>/journal``. The devices are the fake GPUs of :mod:`dra.fakes`.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from asyncinotify import Inotify, Mask

import kubedevice.dra as dra
from dra.fakes import DRIVER, gpus


class EffectDriver(dra.Driver):
    driver_name = DRIVER

    def __init__(self, state: Path) -> None:
        self.state = state
        (state / "effects").mkdir(parents=True, exist_ok=True)

    async def devices(self) -> AsyncIterator[Sequence[dra.Device]]:
        yield gpus(2)
        await asyncio.Event().wait()

    async def prepare(self, claim: dra.Claim) -> Sequence[dra.PreparedDevice]:
        (self.state / "effects" / claim.ref.uid).write_text("prepared\n")
        go = self.state / "go"
        with Inotify() as inotify:
            inotify.add_watch(self.state, Mask.CREATE | Mask.MOVED_TO)
            while not go.exists():  # armed before each look: no race
                await inotify.get()
        return await super().prepare(claim)

    async def unprepare(self, claim: dra.PreparedClaim) -> None:
        (self.state / "effects" / claim.ref.uid).unlink(missing_ok=True)
        with (self.state / "journal").open("a") as journal:
            journal.write(f"unprepare {claim.ref.uid}\n")


def main() -> int:
    parser = dra.argument_parser()
    parser.add_argument("--state", type=Path, required=True)
    args = parser.parse_args()
    return dra.main(EffectDriver(args.state), args=args)


if __name__ == "__main__":
    sys.exit(main())

"""A DRA driver whose prepare hook is a slow plain ``def`` (it runs in a thread), run as a
process by the end-to-end tests: ``python -m e2e.slow_dra --state DIR [dra.main's flags]``.

The prepare hook journals ``enter``/``leave`` lines (``<state>/journal``: kind, pid, claim
UID, monotonic time), sleeps ``$SLOW_DRA_HOOK_S`` seconds (4) in between, then makes what it
"prepared": ``<state>/made/<claim UID>.<pid>``, named in the device's ``data``. The
unprepare hook removes the file its ``data`` names (an interrupted prepare, with no data,
removes nothing: what such a hook made afterwards stays, a leak the tests look for).
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import kubedevice.dra as dra

DRIVER = "slow.kubedevice.io"
_journal = threading.Lock()


class SlowDriver(dra.Driver):
    driver_name = DRIVER

    def __init__(self, state: Path, hook_s: float) -> None:
        self.state = state
        self.hook_s = hook_s
        (state / "made").mkdir(parents=True, exist_ok=True)

    def _note(self, what: str, uid: str) -> None:
        with _journal, (self.state / "journal").open("a") as journal:
            journal.write(f"{what} {os.getpid()} {uid} {time.monotonic():.6f}\n")

    async def devices(self) -> AsyncIterator[Sequence[dra.Device]]:
        yield [
            dra.Device(
                name=f"slow-{i}",
                attributes={"index": i},
                edits=dra.ContainerEdits(env={"SLOW": str(i)}),
            )
            for i in range(2)
        ]
        await asyncio.Event().wait()

    def prepare(self, claim: dra.Claim) -> Sequence[dra.PreparedDevice]:  # type: ignore[override]
        uid = claim.ref.uid
        self._note("enter-prepare", uid)
        time.sleep(self.hook_s)  # the slow part: a MIG device made, a GPU reset
        made = self.state / "made" / f"{uid}.{os.getpid()}"
        made.write_text("made\n")
        self._note("leave-prepare", uid)
        return [
            dra.PreparedDevice(d, d.device.edits if d.device else None, {"made": made.name})
            for d in claim.devices
        ]

    def unprepare(self, claim: dra.PreparedClaim) -> None:  # type: ignore[override]
        self._note("enter-unprepare", claim.ref.uid)
        for data in claim.data:
            name = data.get("made")
            if isinstance(name, str):
                (self.state / "made" / name).unlink(missing_ok=True)
        self._note("leave-unprepare", claim.ref.uid)


def main() -> int:
    parser = dra.argument_parser()
    parser.add_argument("--state", type=Path, required=True)
    args = parser.parse_args()
    hook_s = float(os.environ.get("SLOW_DRA_HOOK_S", "4"))
    return dra.main(SlowDriver(args.state, hook_s), args=args)


if __name__ == "__main__":
    sys.exit(main())

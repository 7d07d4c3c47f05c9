"""An SDK plugin whose preferred_allocation hook answers wrongly (the SDK repairs it).

``--answer unoffered``: only IDs the kubelet did not offer; ``--answer drop-must``: the
offered IDs in order, leaving out the must-include ones.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import kubedevice


class Repaired(kubedevice.DevicePlugin):
    resource_name = "example.com/repaired"

    def __init__(self, answer: str) -> None:
        self.answer = answer

    async def devices(self) -> AsyncIterator[Sequence[kubedevice.Device]]:
        yield [kubedevice.Device(id=f"r{i}") for i in range(3)]

    def preferred_allocation(
        self,
        available: Sequence[kubedevice.Device],
        must_include: Sequence[kubedevice.Device],
        size: int,
    ) -> Sequence[str]:
        if self.answer == "unoffered":
            return [f"nowhere-{i}" for i in range(size)]
        must = {d.id for d in must_include}
        return [d.id for d in available if d.id not in must][:size]


if __name__ == "__main__":
    parser = kubedevice.argument_parser("A plugin whose preferred answers need repair.")
    parser.add_argument("--answer", choices=("unoffered", "drop-must"), required=True)
    args = parser.parse_args()
    raise SystemExit(kubedevice.main(Repaired(args.answer), args=args))

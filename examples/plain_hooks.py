"""Plain-function hooks, devices pushed with update(), Health and Mount."""

import logging
from collections.abc import Sequence

import kubedevice

log = logging.getLogger("sensor")


class Sensors(kubedevice.DevicePlugin):
    resource_name = "example.com/sensor"

    def __init__(self, count: int, broken: int) -> None:
        # No devices() here: the list is pushed. update() works before the plugin is served
        # (this list is its first) and afterwards, from the event loop the server runs on.
        self.update(
            kubedevice.Device(
                id=f"sensor-{i}",
                health=kubedevice.Health.UNHEALTHY if i >= count - broken else "Healthy",
                mounts=[kubedevice.Mount("/etc/sensor", "/etc", read_only=True)],
            )
            for i in range(count)
        )

    def allocate(self, devices: Sequence[kubedevice.Device]) -> kubedevice.AllocateResult:
        """A plain def runs in a worker thread: blocking calls are fine here."""
        merged = kubedevice.ContainerAllocation.merge(devices)
        return kubedevice.ContainerAllocation(
            envs={"SENSORS": ",".join(d.id for d in devices)}, mounts=merged.mounts
        )

    def preferred_allocation(
        self,
        available: Sequence[kubedevice.Device],
        must_include: Sequence[kubedevice.Device],
        size: int,
    ) -> list[str]:
        """Highest-numbered sensors first (must-include ones always)."""
        must = [d.id for d in must_include]
        rest = [d.id for d in reversed(available) if d.id not in must]
        return must + rest[: max(size - len(must), 0)]

    def pre_start(self, devices: Sequence[kubedevice.Device]) -> None:
        log.info("calibrating %s", ", ".join(d.id for d in devices))


if __name__ == "__main__":
    parser = kubedevice.argument_parser("A sensor device plugin.")
    parser.add_argument("--count", type=int, default=4, help="how many sensors to offer")
    parser.add_argument("--broken", type=int, default=1, help="how many of them are Unhealthy")
    args = parser.parse_args()
    raise SystemExit(kubedevice.main(Sensors(args.count, args.broken), args=args))

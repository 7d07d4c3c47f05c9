"""Every SDK hook with its signature, an option of its own, and the plugin's own log lines."""

import logging
from collections.abc import AsyncIterator, Sequence

import kubedevice

log = logging.getLogger("gadget")  # kubedevice.main() shows every logger, not only its own


class Gadget(kubedevice.DevicePlugin):
    resource_name = "example.com/gadget"

    def __init__(self, count: int) -> None:
        self.count = count

    async def devices(self) -> AsyncIterator[Sequence[kubedevice.Device]]:
        """Required: yield the full device list now, and again whenever it changes."""
        log.info("offering %d gadgets", self.count)
        yield [
            kubedevice.Device(
                id=f"gadget-{i}",
                numa_nodes=(i % 2,),
                envs={"GADGET": str(i), "GADGET_DRIVER": "v2"},
                annotations={"example.com/gadgets": f"gadget-{i}"},
                device_specs=[kubedevice.DeviceSpec(f"/dev/gadget{i}", "/dev/null")],
            )
            for i in range(self.count)
        ]

    async def allocate(self, devices: Sequence[kubedevice.Device]) -> kubedevice.AllocateResult:
        """Optional: what one container gets. kubedevice.DEFAULT merges the devices' own."""
        merged = kubedevice.ContainerAllocation.merge(devices)
        return kubedevice.ContainerAllocation(
            envs={**merged.envs, "GADGET_COUNT": str(len(devices))},
            device_specs=merged.device_specs,
            annotations=merged.annotations,
        )

    async def preferred_allocation(
        self,
        available: Sequence[kubedevice.Device],
        must_include: Sequence[kubedevice.Device],
        size: int,
    ) -> Sequence[str]:
        """Optional (advertised when overridden): pick ``size`` IDs, NUMA-aware by default."""
        return kubedevice.default_preferred_allocation(available, must_include, size)

    async def pre_start(self, devices: Sequence[kubedevice.Device]) -> None:
        """Optional (advertised when overridden): runs before each container starts."""
        log.info("preparing %s", ", ".join(d.id for d in devices))


if __name__ == "__main__":
    parser = kubedevice.argument_parser("A gadget device plugin.")
    parser.add_argument("--count", type=int, default=4, help="how many gadgets to offer")
    args = parser.parse_args()
    raise SystemExit(kubedevice.main(Gadget(args.count), args=args))

"""A minimal device plugin: four counters, default Allocate. Run with --device-plugin-dir DIR."""

from collections.abc import AsyncIterator, Sequence

import kubedevice


class Counter(kubedevice.DevicePlugin):
    resource_name = "example.com/counter"

    async def devices(self) -> AsyncIterator[Sequence[kubedevice.Device]]:
        yield [
            kubedevice.Device(
                id=f"counter-{i}",
                envs={"COUNTER": str(i)},
                device_specs=[kubedevice.DeviceSpec(f"/dev/counter{i}", "/dev/null")],
            )
            for i in range(4)
        ]


if __name__ == "__main__":
    raise SystemExit(kubedevice.main(Counter()))

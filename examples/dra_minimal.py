"""A complete small DRA driver: four counters, a greeting from the claim's opaque config.

Run: python examples/dra_minimal.py --node-name NODE [--kubeconfig FILE]
        [--kubelet-dir DIR] [--cdi-dir DIR]
docs/dra.md shows this file verbatim; tests/dra/test_example.py runs it against a real
API server and calls it as the kubelet would.
"""

from collections.abc import AsyncIterator, Sequence

import kubedevice.dra as dra


class Counters(dra.Driver):
    driver_name = "counter.example.com"

    async def devices(self) -> AsyncIterator[Sequence[dra.Device]]:
        yield [
            dra.Device(
                name=f"counter-{i}",
                attributes={"index": i, "model": "counter", "firmware": dra.Version("1.2.0")},
                capacity={"memory": "1Gi"},
                edits=dra.ContainerEdits(
                    env={"COUNTER": str(i)},
                    device_nodes=[dra.DeviceNode(f"/dev/counter{i}", host_path="/dev/null")],
                ),
            )
            for i in range(4)
        ]

    async def prepare(self, claim: dra.Claim) -> Sequence[dra.PreparedDevice]:
        prepared = []
        for allocated in claim.devices:
            if allocated.device is None:
                raise dra.ClaimError(f"{allocated.name} is gone")
            greeting = "hello"
            for config in allocated.configs:  # classes' first, then the claim's: last wins
                greeting = str(config.parameters.get("greeting", greeting))
            edits = allocated.device.edits
            env = {**edits.env, "GREETING": greeting}
            prepared.append(
                dra.PreparedDevice(allocated, dra.ContainerEdits(env, edits.device_nodes))
            )
        return prepared


if __name__ == "__main__":
    raise SystemExit(dra.main(Counters()))

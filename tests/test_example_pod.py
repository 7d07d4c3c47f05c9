"""Issue "done when": the SDK example's resource, requested by a Pod manifest, is admitted by the
emulator and shows its envs and device nodes; the allocation survives an emulator restart."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from kubedevice.kubelet import Emulator
from kubedevice.kubelet.types import RegistrationEvent

ROOT = Path(__file__).resolve().parents[1]
RESOURCE = "example.com/counter"


async def test_example_pod_admitted_and_survives_emulator_restart(sock_dir: Path) -> None:
    dp_dir = sock_dir / "dp"
    dp_dir.mkdir()
    emu = Emulator(dp_dir, control_socket=False)
    await emu.start()
    plugin = await asyncio.create_subprocess_exec(
        sys.executable, str(ROOT / "examples/minimal.py"), "--device-plugin-dir", str(dp_dir),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:
        await emu.wait_for_resource(RESOURCE, allocatable=4, timeout=15)
        pod = await emu.apply_pod((ROOT / "examples/pod-counter.yaml").read_text())
        app = pod.container("app")
        ids = app.devices[RESOURCE]
        assert len(ids) == 2
        numbers = sorted(i.removeprefix("counter-") for i in ids)
        assert app.runtime.envs == {"COUNTER": ",".join(numbers)}
        assert sorted((d.container_path, d.host_path) for d in app.runtime.devices) == [
            (f"/dev/counter{n}", "/dev/null") for n in numbers
        ]

        # a new emulator on the same directory: the checkpoint restores the allocation and the
        # resource (tests/kubelet/test_restart.py checks allocatable 0 until re-registration)
        await emu.stop()
        emu = Emulator(dp_dir, control_socket=False)
        await emu.start()
        assert RESOURCE in emu.node().resources
        await emu.wait_until(
            lambda: any(isinstance(e, RegistrationEvent) and e.ok for e in emu.events), 15
        )
        status = await emu.wait_for_resource(RESOURCE, allocatable=4, timeout=15)
        assert status.allocated == 2
    finally:
        plugin.terminate()
        assert await asyncio.wait_for(plugin.wait(), 15) == 0
        await emu.stop()

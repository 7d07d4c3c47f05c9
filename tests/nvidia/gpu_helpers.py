"""Building blocks for GPU plugin tests: GPU values and fake /dev and /sys trees."""

from __future__ import annotations

from pathlib import Path

from kubedevice.nvidia.backend import GpuInfo, MigDeviceInfo

GIB = 1 << 30


def gpu(i: int, *, mig: bool = False, name: str = "NVIDIA H200") -> GpuInfo:
    return GpuInfo(
        index=i,
        uuid=f"GPU-0000000{i}-aaaa-bbbb-cccc-dddddddddddd",
        minor=i,
        name=name,
        memory_total=141 * GIB,
        pci_bus_id=f"0000:{0x18 + i:02x}:00.0",
        compute_capability=(9, 0),
        architecture="hopper",
        brand="nvidia",
        mig_capable=True,
        mig_enabled=mig,
    )


def mig_device(parent: GpuInfo, i: int, profile: str, caps: tuple[int, ...]) -> MigDeviceInfo:
    return MigDeviceInfo(
        parent_uuid=parent.uuid,
        parent_index=parent.index,
        uuid=f"MIG-{parent.index}{i}000000-aaaa-bbbb-cccc-dddddddddddd",
        index=i,
        profile=profile,
        gi_id=i + 1,
        ci_id=0,
        memory_total=18 * GIB,
        cap_minors=caps,
    )


def fake_host(root: Path, gpus: list[GpuInfo], numa: dict[int, int]) -> tuple[Path, Path]:
    """A /dev with the GPUs' nodes and nvidiactl + nvidia-uvm, a /sys with their NUMA nodes."""
    dev, sys = root / "dev", root / "sys"
    (dev / "nvidia-caps").mkdir(parents=True)
    for g in gpus:
        (dev / f"nvidia{g.minor}").touch()
        pci = sys / "bus" / "pci" / "devices" / g.pci_bus_id
        pci.mkdir(parents=True)
        (pci / "numa_node").write_text(f"{numa.get(g.index, -1)}\n")
    for name in ("nvidiactl", "nvidia-uvm"):
        (dev / name).touch()
    for minor in range(1, 40):
        (dev / "nvidia-caps" / f"nvidia-cap{minor}").touch()
    return dev, sys

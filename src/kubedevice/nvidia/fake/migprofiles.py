"""The GPU instance profiles a fake MIG device reports (``nvmlGpuInstanceProfileInfo_t``).

Hopper (H100 and H200) values, as NVIDIA's MIG user guide lists them per profile: a GPU has
8 memory slices; ``<n>g`` profiles of 1, 2, 3, 4 and 7 compute slices take 1 or 2, 2, 4, 4
and 8 of them. Hopper MIG instances have no video encoder; only ``+me`` profiles and the
whole-GPU ``7g`` profile get the optical-flow engine. A machine file gives a MIG device's
``placement_start``; without it the devices are laid out first-fit in the order given.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Final

from kubedevice.nvidia.backend import MigEngines, MigProfileInfo

__all__ = ["MEMORY_SLICES", "engines", "first_fit", "profile_info"]

#: Memory slices of a MIG-capable Hopper GPU.
MEMORY_SLICES: Final = 8

# (compute slices, memory slices) -> (SMs, copy engines, decoders, encoders, JPEG, OFA)
_HOPPER: Final[dict[tuple[int, int], tuple[int, int, int, int, int, int]]] = {
    (1, 1): (16, 1, 1, 0, 1, 0),
    (1, 2): (26, 1, 1, 0, 1, 0),
    (2, 2): (32, 2, 2, 0, 2, 0),
    (3, 4): (60, 3, 3, 0, 3, 0),
    (4, 4): (64, 4, 4, 0, 4, 0),
    (7, 8): (132, 8, 7, 0, 7, 1),
}
_PROFILE: Final = re.compile(r"^(?:\d+c\.)?(\d+)g\.\d+gb(\+me)?")


def engines(slices: int, memory_slices: int, *, media: bool = False) -> MigEngines | None:
    """The engines of a Hopper GPU instance of ``slices`` compute and ``memory_slices``
    memory slices (``media``: a ``+me`` profile); ``None`` if Hopper has no such profile."""
    counts = _HOPPER.get((slices, memory_slices))
    if counts is None:
        return None
    sms, copy, dec, enc, jpeg, ofa = counts
    return MigEngines(
        multiprocessors=sms,
        copy_engines=copy,
        decoders=dec,
        encoders=enc,
        jpeg_engines=jpeg,
        ofa_engines=1 if media else ofa,
    )


def profile_info(
    profile: str, memory_mib: int, parent_memory_mib: int, start: int
) -> MigProfileInfo | None:
    """The profile info of a Hopper MIG device at memory slice ``start``; ``None`` if the
    profile is not one of Hopper's."""
    match = _PROFILE.match(profile)
    if match is None:
        return None
    size = max(1, round(memory_mib * MEMORY_SLICES / parent_memory_mib))
    found = engines(int(match.group(1)), size, media=bool(match.group(2)))
    if found is None:
        return None
    return MigProfileInfo(
        engines=found, memory_mib=memory_mib, placement_start=start, placement_size=size
    )


def first_fit(sizes: Sequence[int], given: Sequence[int | None]) -> list[int]:
    """Placement starts: the given ones, the others at the first free run of slices."""
    used = [False] * MEMORY_SLICES
    for start, size in zip(given, sizes, strict=True):
        if start is not None:
            used[start : start + size] = [True] * size
    out: list[int] = []
    for start, size in zip(given, sizes, strict=True):
        if start is None:
            start = next(
                (
                    s
                    for s in range(0, MEMORY_SLICES - size + 1, size)
                    if not any(used[s : s + size])
                ),
                0,
            )
            used[start : start + size] = [True] * size
        out.append(start)
    return out

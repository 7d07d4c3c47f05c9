"""Setting a GPU's time-slice level: through the backend where it can, else ``nvidia-smi``.

Levels are NVIDIA's (0 Default, 1 Short, 2 Medium, 3 Long), as ``nvidia-smi
compute-policy --set-timeslice`` takes them.
"""

from __future__ import annotations

import subprocess

from kubedevice.errors import NvmlError
from kubedevice.nvidia.backend import NvmlBackend, TimeSliceControl
from kubedevice.nvidia.cdi import find_tool

__all__ = ["set_time_slice"]


def set_time_slice(backend: NvmlBackend, driver_root: str, uuid: str, level: int) -> None:
    """Set a GPU's time-slice level through the backend, or nvidia-smi (blocking).

    Raises:
        NvmlError: The GPU refuses, or there is no nvidia-smi in the driver root.
    """
    if isinstance(backend, TimeSliceControl):
        backend.set_time_slice(uuid, level)
        return
    smi = find_tool(driver_root, "nvidia-smi")
    if smi is None:
        raise NvmlError("NotSupported", "no nvidia-smi in the driver root to set it", uuid)
    try:
        proc = subprocess.run(
            [smi, "compute-policy", "-i", uuid, f"--set-timeslice={level}"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NvmlError("Unknown", f"nvidia-smi failed: {exc}", uuid) from exc
    if proc.returncode != 0:
        text = (proc.stderr or proc.stdout).strip().splitlines()
        raise NvmlError("Unknown", f"nvidia-smi: {text[-1] if text else proc.returncode}", uuid)

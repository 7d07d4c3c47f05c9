"""The GPU DRA driver (`kubedevice nvidia dra`): a Driver on the DRA kit (:mod:`kubedevice.dra`).

``driver`` the driver (NVML start, health monitor, configs checked then applied, CDI edits per
claim), ``devices`` GPUs and MIG devices as DRA devices with NVIDIA's attribute names, ``config``
the opaque GpuConfig / MigDeviceConfig a claim may carry. The device plugin of the same GPUs is
the rest of :mod:`kubedevice.nvidia`; both read one config (:mod:`kubedevice.nvidia.config`).
"""

from kubedevice.nvidia.dra.driver import DEFAULT_DRIVER_NAME, GpuDraDriver

__all__ = ["DEFAULT_DRIVER_NAME", "GpuDraDriver"]

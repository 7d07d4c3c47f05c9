"""Why a GPU is not healthy, as the DRA kit's :class:`~kubedevice.dra.Fault`.

The taint key's name part is the kind (``xid``, ``gpu-lost``, ``ecc``, ``nvml-error``), the
value the XID number; the message, shown in the pods' ``allocatedResourcesStatus``, names
the XID and what it usually means (``XID 79: GPU has fallen off the bus``).
"""

from __future__ import annotations

from typing import Final

from kubedevice.dra import Fault

__all__ = ["XID_MEANINGS", "fault_of"]

#: Short meanings of XIDs that take a GPU out of service (NVIDIA's XID catalogue).
XID_MEANINGS: Final = {
    13: "graphics engine exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    45: "preemptive cleanup after an earlier error",
    48: "double-bit ECC error",
    61: "internal micro-controller breakpoint",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping recorded",
    64: "ECC page retirement or row remapping failed",
    68: "video processor exception",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    109: "context switch timeout",
    119: "GSP RPC timeout",
    120: "GSP error",
}


def fault_of(kind: str, code: str, reason: str) -> Fault:
    """The fault of a GPU that the health monitor marked Unhealthy with ``reason``."""
    if kind == "xid" and code.isdigit():
        meaning = XID_MEANINGS.get(int(code))
        message = f"XID {code}: {meaning}" if meaning else f"XID {code}"
        return Fault("xid", code, message)
    if kind == "gpu-lost":
        return Fault("gpu-lost", "", "GPU lost: it fell off the bus or stopped answering")
    return Fault(kind, code, reason)

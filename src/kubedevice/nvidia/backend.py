"""The narrow NVML interface the GPU plugin is written against, and the values it returns.

Two implementations exist: :mod:`kubedevice.nvidia.nvml_real` (nvidia-ml-py, a real
driver) and :mod:`kubedevice.nvidia.fake` (a JSON file: recordings of real GPUs
and synthetic machines). Everything above this module sees only these types, never
``pynvml``.

Rules every implementation keeps:

* "Not supported" is normal (many calls answer NVML_ERROR_NOT_SUPPORTED on a given
  GPU or driver): such a value is ``None`` or empty, never an exception.
* Any other NVML failure raises :class:`~kubedevice.errors.NvmlError` carrying the
  NVML error name (``"GpuIsLost"``, ``"Unknown"`` ...) and, where one GPU is concerned,
  its UUID, so the caller marks that GPU only.
* Methods are blocking and thread-safe; callers run them off the event loop.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, Protocol, runtime_checkable

__all__ = [
    "ARCHITECTURE_NAMES",
    "BRAND_NAMES",
    "DriverInfo",
    "EventKind",
    "GpuInfo",
    "GpuInstance",
    "GpuInstanceProfile",
    "GpuSample",
    "HealthEvent",
    "Link",
    "MigDeviceInfo",
    "MigEngines",
    "MigPartitioning",
    "MigPlacement",
    "MigProfileInfo",
    "MpsControlProgram",
    "NvmlBackend",
    "P2PLevel",
    "ProcessSample",
    "TimeSliceControl",
]

#: NVML brand values (nvmlBrandType_t) -> the names :attr:`GpuInfo.brand` holds.
BRAND_NAMES: Final[Mapping[int, str]] = {
    0: "unknown",
    1: "quadro",
    2: "tesla",
    3: "nvs",
    4: "grid",
    5: "geforce",
    6: "titan",
    7: "nvidia-vapps",
    8: "nvidia-vpc",
    9: "nvidia-vcs",
    10: "nvidia-vws",
    11: "nvidia-cloud-gaming",
    12: "quadro-rtx",
    13: "nvidia-rtx",
    14: "nvidia",
    15: "geforce-rtx",
    16: "titan-rtx",
}
#: NVML architecture values (nvmlDeviceArchitecture_t) -> :attr:`GpuInfo.architecture`.
ARCHITECTURE_NAMES: Final[Mapping[int, str]] = {
    2: "kepler",
    3: "maxwell",
    4: "pascal",
    5: "volta",
    6: "turing",
    7: "ampere",
    8: "ada",
    9: "hopper",
    10: "blackwell",
}


@dataclass(frozen=True, slots=True)
class DriverInfo:
    """What the driver says of itself."""

    driver_version: str  # "580.159.04"
    cuda_version: str  # "13.0" (from nvmlSystemGetCudaDriverVersion 13000)
    nvml_version: str  # "13.580.159.04"


@dataclass(frozen=True, slots=True)
class GpuInfo:
    """One physical GPU, as enumerated at start-up (static facts only)."""

    index: int  # NVML index
    uuid: str  # "GPU-f4dbb85b-..."
    minor: int  # /dev/nvidia<minor>
    name: str  # "NVIDIA H200"
    memory_total: int  # bytes
    pci_bus_id: str  # sysfs form, lower case: "0000:00:06.0"
    compute_capability: tuple[int, int]  # (9, 0)
    architecture: str  # "hopper", "ampere", ... ("unknown" when NVML has no name for it)
    brand: str  # "nvidia", "tesla", ... ("unknown")
    mig_capable: bool  # the GPU supports MIG at all
    mig_enabled: bool  # current MIG mode is enabled
    serial: str | None = None
    #: The NUMA node the backend knows of (a fake machine's); ``None``: ask sysfs only.
    numa_node: int | None = None


@dataclass(frozen=True, slots=True)
class MigEngines:
    """The engines and multiprocessors of one GPU instance profile
    (``nvmlGpuInstanceProfileInfo_t``'s counts)."""

    multiprocessors: int  # multiprocessorCount
    copy_engines: int  # copyEngineCount
    decoders: int  # decoderCount
    encoders: int  # encoderCount
    jpeg_engines: int  # jpegCount
    ofa_engines: int  # ofaCount


@dataclass(frozen=True, slots=True)
class MigProfileInfo:
    """What NVML says about a MIG device's GPU instance profile
    (``nvmlGpuInstanceProfileInfo_t``) and where the instance sits in the GPU's memory."""

    engines: MigEngines
    memory_mib: int  # memorySizeMB (MiB, as nvml.h documents it)
    placement_start: int  # the GPU instance's placement: its first memory slice
    placement_size: int  # and how many memory slices it spans


@dataclass(frozen=True, slots=True)
class MigDeviceInfo:
    """One MIG device (a compute instance inside a GPU instance) of a MIG-enabled GPU."""

    parent_uuid: str
    parent_index: int
    uuid: str  # "MIG-..."
    index: int  # position among its parent's MIG devices
    profile: str  # canonical name without the "mig-" prefix: "1g.18gb", "3g.71gb", "1c.3g.71gb"
    gi_id: int  # GPU instance id
    ci_id: int  # compute instance id
    memory_total: int  # bytes
    # Minors of /dev/nvidia-caps/nvidia-cap<N> giving access to this GI and CI.
    cap_minors: tuple[int, ...] = ()
    #: The GPU instance's profile and placement; ``None`` where NVML cannot tell.
    profile_info: MigProfileInfo | None = None


@dataclass(frozen=True, slots=True, order=True)
class MigPlacement:
    """Where a GPU instance sits on its GPU: memory slices ``start`` .. ``start+size-1``.

    NVML's ``nvmlGpuInstancePlacement_t``, as ``nvmlDeviceGetGpuInstancePossiblePlacements``
    reports it (an H100's 3g profile: ``{0,4}`` and ``{4,4}``).
    """

    start: int
    size: int

    @property
    def memory_slices(self) -> range:
        """The memory slices it occupies."""
        return range(self.start, self.start + self.size)


@dataclass(frozen=True, slots=True)
class GpuInstanceProfile:
    """A GPU instance profile of a MIG-capable GPU and where it may be placed.

    Attributes:
        id: The profile ID NVML's create call takes (``nvmlGpuInstanceProfileInfo_t.id``,
            as ``nvidia-smi mig -lgip`` lists it: on an H100 19 = 1g, 20 = 1g+me, 15 = 1g
            with twice the memory, 14 = 2g, 9 = 3g, 5 = 4g, 0 = 7g).
        name: Canonical name without ``mig-``: ``1g.10gb``, ``1g.10gb+me``, ``3g.40gb``.
        slices: Compute slices (the ``<n>g``).
        memory_mib: Memory of one instance.
        placements: Every placement NVML reports as possible, in order.
        media_extensions: Whether it takes the GPU's one set of media extensions (OFA).
        compute_profile: The ``NVML_COMPUTE_INSTANCE_PROFILE_*`` of a compute instance
            that takes the whole GPU instance.
        engines: Its engines and multiprocessors (``None``: the backend cannot tell).
    """

    id: int
    name: str
    slices: int
    memory_mib: int
    placements: tuple[MigPlacement, ...]
    media_extensions: bool = False
    compute_profile: int = 0
    engines: MigEngines | None = None


@dataclass(frozen=True, slots=True)
class GpuInstance:
    """A GPU instance that exists on a GPU, with its compute instance(s) as MIG devices."""

    gpu_uuid: str
    gi_id: int
    profile_id: int
    placement: MigPlacement
    devices: tuple[MigDeviceInfo, ...] = ()


class P2PLevel(enum.IntEnum):
    """How two GPUs are connected over PCIe (NVML's nvmlGpuTopologyLevel_t values).

    Lower is closer. NVLink is reported separately in :class:`Link`.
    """

    INTERNAL = 0  # same board (multi-GPU board)
    SINGLE = 10  # PIX: at most one PCIe bridge
    MULTIPLE = 20  # PXB: several PCIe bridges, no host bridge
    HOSTBRIDGE = 30  # PHB: through a PCIe host bridge
    NODE = 40  # NODE: host bridges within one NUMA node
    SYSTEM = 50  # SYS: across the SMP interconnect (different NUMA nodes)


@dataclass(frozen=True, slots=True)
class Link:
    """The connection between two GPUs."""

    level: P2PLevel
    nvlinks: int = 0  # number of NVLink links directly between the two (0 = none)


@dataclass(frozen=True, slots=True)
class ProcessSample:
    """A process using a GPU."""

    pid: int
    used_memory: int | None  # bytes; None when NVML does not say


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One reading of a GPU's live values. ``None`` = NotSupported by this GPU/driver."""

    utilization_gpu: int | None = None  # percent
    utilization_memory: int | None = None  # percent
    memory_used: int | None = None  # bytes
    memory_total: int | None = None  # bytes
    power_mw: int | None = None  # milliwatts
    temperature_c: int | None = None
    processes: tuple[ProcessSample, ...] = ()
    ecc_double_bit_volatile: int | None = None  # uncorrected ECC errors since boot
    remapped_rows_pending: bool | None = None
    remapped_rows_failure: bool | None = None


class EventKind(enum.StrEnum):
    """What an NVML event (or a failed probe) says happened to a GPU."""

    XID = "xid"  # nvmlEventTypeXidCriticalError; HealthEvent.xid holds the code
    ECC_DOUBLE_BIT = "ecc-double-bit"  # nvmlEventTypeDoubleBitEccError
    GPU_LOST = "gpu-lost"  # the GPU fell off the bus (NVML_ERROR_GPU_IS_LOST)


@dataclass(frozen=True, slots=True)
class HealthEvent:
    """One event from the NVML event set."""

    kind: EventKind
    uuid: str  # the GPU (or MIG device) concerned
    xid: int | None = None  # for EventKind.XID
    monotonic: float = field(default=0.0, compare=False)  # time.monotonic() it was read


@runtime_checkable
class NvmlBackend(Protocol):
    """The NVML calls the GPU plugin makes. See the module docstring for the rules."""

    def init(self) -> DriverInfo:
        """Load and initialise NVML.

        Raises:
            NvmlError: no library, no driver, or no permission (code says which).
        """
        ...

    def shutdown(self) -> None:
        """Release NVML; the backend may be initialised again afterwards."""
        ...

    def gpus(self) -> list[GpuInfo]:
        """Every GPU, in NVML index order."""
        ...

    def mig_devices(self, gpu_uuid: str) -> list[MigDeviceInfo]:
        """The MIG devices of a MIG-enabled GPU (empty when MIG is off or unsupported)."""
        ...

    def link(self, uuid_a: str, uuid_b: str) -> Link | None:
        """How two distinct GPUs are connected; ``None`` when NVML cannot tell."""
        ...

    def sample(self, uuid: str) -> GpuSample:
        """Read the live values of one GPU (a field NVML does not support is ``None``)."""
        ...

    def probe(self, uuid: str) -> None:
        """Check that a GPU answers (the health re-check after a quiet period).

        Raises:
            NvmlError: the GPU does not answer (e.g. ``GpuIsLost``).
        """
        ...

    def watch(self, uuids: list[str]) -> None:
        """Register the health events (critical XID, double-bit ECC) of these GPUs.

        A GPU whose events cannot be registered (NotSupported) is skipped with no error.
        Calling it again replaces the watched set.
        """
        ...

    def wait_event(self, timeout_ms: int) -> HealthEvent | None:
        """Block until the next health event of a watched GPU, or the timeout.

        Returns ``None`` on timeout. Must return promptly (well under the timeout)
        after :meth:`interrupt`.
        """
        ...

    def interrupt(self) -> None:
        """Wake a thread blocked in :meth:`wait_event` (best effort for real NVML)."""
        ...


@runtime_checkable
class TimeSliceControl(Protocol):
    """A backend that can set a GPU's time-slice interval (optional; the fake can).

    Levels are NVIDIA's: 0 default, 1 short, 2 medium, 3 long (``nvidia-smi
    compute-policy --set-timeslice``).
    """

    def set_time_slice(self, uuid: str, level: int) -> None:
        """Set the time-slice level of one GPU.

        Raises:
            NvmlError: the GPU does not answer or refuses.
        """
        ...


@runtime_checkable
class MpsControlProgram(Protocol):
    """A backend that brings its own MPS control program (the fake's stand-in).

    A real machine's is ``nvidia-cuda-mps-control`` in the driver root.
    """

    def mps_control_command(self) -> list[str]:
        """The command line of the MPS control program, before its arguments."""
        ...


@runtime_checkable
class MigPartitioning(Protocol):
    """A backend that creates and destroys MIG devices (optional; both backends can).

    A MIG device made here is one GPU instance at a placement with one compute instance
    taking all of it. The GPU must be in MIG mode.
    """

    def gpu_instance_profiles(self, gpu_uuid: str) -> list[GpuInstanceProfile]:
        """The GPU's instance profiles and their possible placements (empty: no MIG).

        Raises:
            NvmlError: the GPU does not answer.
        """
        ...

    def gpu_instances(self, gpu_uuid: str) -> list[GpuInstance]:
        """The GPU instances that exist now on the GPU (empty when MIG is off)."""
        ...

    def create_mig_device(
        self, gpu_uuid: str, profile_id: int, placement: MigPlacement
    ) -> MigDeviceInfo:
        """Create a GPU instance at ``placement`` and a compute instance taking all of it.

        Raises:
            NvmlError: ``InsufficientResources`` when the placement overlaps an instance
                (or the profile's units are taken), ``InvalidArgument`` for a placement
                the profile does not have, ``NotSupported`` without MIG mode. Nothing is
                left behind on failure.
        """
        ...

    def destroy_mig_device(self, gpu_uuid: str, gi_id: int) -> None:
        """Destroy a GPU instance and its compute instances.

        Raises:
            NvmlError: ``NotFound`` when there is no such instance, ``InUse`` when a
                process still uses it.
        """
        ...

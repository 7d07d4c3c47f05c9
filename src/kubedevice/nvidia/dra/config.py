"""``GpuConfig``: the opaque device configuration of the GPU DRA driver, and its checks.

A claim (or a DeviceClass) passes it as ``config[].opaque.parameters`` for the driver.
The shape follows NVIDIA's DRA driver, so a claim written for it is read the same way::

    apiVersion: resource.kubedevice.io/v1     # or resource.nvidia.com/v1beta1
    kind: GpuConfig                           # MigDeviceConfig for MIG devices
    sharing:
      strategy: TimeSlicing
      timeSlicingConfig:
        interval: Long                        # Default, Short, Medium or Long

Only the settings the NVML backend can apply are accepted: time-slicing and its interval
(MPS is not chosen per claim: with ``dra.mps`` every memory share is an MPS client;
``strategy: MPS`` is refused with that reason). Every error names the field
(``sharing.timeSlicingConfig.interval``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from kubedevice.errors import ConfigError
from kubedevice.plugin.configbase import parse_model
from kubedevice.plugin.schema import Model

__all__ = [
    "API_VERSIONS",
    "TIME_SLICE_LEVELS",
    "GpuConfig",
    "GpuSharing",
    "TimeSlicingConfig",
    "effective_config",
    "parse_gpu_config",
]

#: The ``apiVersion`` values accepted: ours, and NVIDIA's (claims written for its driver).
API_VERSIONS: Final = ("resource.kubedevice.io/v1", "resource.nvidia.com/v1beta1")
#: Time-slice interval names -> the level NVIDIA's tools take (``--set-timeslice``).
TIME_SLICE_LEVELS: Final[Mapping[str, int]] = {"Default": 0, "Short": 1, "Medium": 2, "Long": 3}

Interval = Literal["Default", "Short", "Medium", "Long"]


@dataclass(frozen=True, kw_only=True)
class TimeSlicingConfig(Model):
    """How long each context runs before the GPU switches to the next."""

    interval: Interval = "Default"


@dataclass(frozen=True, kw_only=True)
class GpuSharing(Model):
    """How the containers of a claim (and the claims of one GPU) share it."""

    strategy: Literal["TimeSlicing", "MPS"]
    time_slicing_config: TimeSlicingConfig | None = None
    mps_config: dict[str, Any] | None = None

    def check(self) -> None:
        if self.strategy == "MPS":
            raise ValueError(
                "strategy: 'MPS' is not set per claim by this driver: run it with dra.mps "
                "(--mps) and every memory share is an MPS client; use 'TimeSlicing' here"
            )
        if self.mps_config is not None:
            raise ValueError("mpsConfig: only allowed with strategy 'MPS'")

    @property
    def interval(self) -> str:
        """The time-slice interval asked for (``Default`` when not given)."""
        return (self.time_slicing_config or TimeSlicingConfig()).interval


@dataclass(frozen=True, kw_only=True)
class GpuConfig(Model):
    """The whole opaque parameters object (``kind: GpuConfig`` or ``MigDeviceConfig``)."""

    api_version: str = field(metadata={"alias": "apiVersion"})
    kind: Literal["GpuConfig", "MigDeviceConfig"]
    sharing: GpuSharing | None = None

    def check(self) -> None:
        if self.api_version not in API_VERSIONS:
            raise ValueError(
                f"apiVersion: must be one of {', '.join(API_VERSIONS)} (got {self.api_version!r})"
            )
        if (
            self.kind == "MigDeviceConfig"
            and self.sharing is not None
            and self.sharing.time_slicing_config is not None
        ):
            raise ValueError(
                "sharing.timeSlicingConfig: a MIG device has no time-slice interval of its own"
            )

    @property
    def interval(self) -> str | None:
        """The time-slice interval to set, ``None`` when the config says nothing of it."""
        if self.sharing is None:
            return None
        return self.sharing.interval


def parse_gpu_config(parameters: Any, source: str = "GpuConfig") -> GpuConfig:
    """Validate one opaque config's decoded parameters.

    Raises:
        ConfigError: One line per problem: ``<source>: <field>: <what was expected>``.
    """
    if not isinstance(parameters, Mapping):
        raise ConfigError(f"{source}: (top level): expected a JSON object")
    return parse_model(GpuConfig, parameters, source)


def effective_config(parameters: Sequence[Any], source: str) -> GpuConfig | None:
    """The config in force for one device: each is validated, the last one wins.

    ``parameters`` come in the kit's order (the classes' first, then the claim's), so a
    claim's config overrides its class's.

    Raises:
        ConfigError: Any of them is invalid (named ``<source>[<i>]``).
    """
    config: GpuConfig | None = None
    for i, params in enumerate(parameters):
        config = parse_gpu_config(params, f"{source}[{i}]")
    return config

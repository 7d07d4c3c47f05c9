"""The ``Register`` call to the kubelet and the retry backoff around it.

One call per attempt on a fresh channel, with a deadline; gRPC errors become
:class:`~kubedevice.errors.RegistrationError` (chained).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from kubedevice._api import VERSION, dp, dp_grpc
from kubedevice.errors import RegistrationError
from kubedevice.plugin.types import PluginOptions

__all__ = ["Backoff", "register"]


async def register(
    kubelet_socket: Path,
    *,
    endpoint: str,
    resource_name: str,
    options: PluginOptions,
    deadline: float = 10.0,
) -> None:
    """Call ``/v1beta1.Registration/Register`` once.

    Args:
        kubelet_socket: Path of ``kubelet.sock``.
        endpoint: The plugin's socket file name, relative to the device plugin directory.
        resource_name: The extended resource name.
        options: The plugin's options (sent for kubelets up to 1.24; newer ones ask
            ``GetDevicePluginOptions``).
        deadline: Deadline of the call in seconds (it covers the kubelet's dial-back).

    Raises:
        RegistrationError: The kubelet could not be reached or refused the registration.
    """
    request = dp.RegisterRequest(
        version=VERSION,
        endpoint=endpoint,
        resource_name=resource_name,
        options=dp.DevicePluginOptions(
            pre_start_required=options.pre_start_required,
            get_preferred_allocation_available=options.get_preferred_allocation_available,
        ),
    )
    # A local subchannel pool: gRPC's global pool would otherwise make this fresh channel wait
    # out the ~1 s reconnect backoff left by an earlier failed connect to a restarting kubelet.
    channel_options = [("grpc.enable_retries", 0), ("grpc.use_local_subchannel_pool", 1)]
    async with grpc.aio.insecure_channel(
        f"unix://{kubelet_socket}", options=channel_options
    ) as channel:
        stub = dp_grpc.RegistrationStub(channel)
        try:
            await stub.Register(request, timeout=deadline)
        except grpc.aio.AioRpcError as exc:
            raise RegistrationError(
                f"Register of {resource_name!r} at {kubelet_socket} failed: "
                f"{exc.code().name}: {exc.details()}"
            ) from exc


@dataclass
class Backoff:
    """Bounded exponential backoff with jitter: ``initial`` doubling up to ``maximum``.

    Attributes:
        initial: First delay in seconds.
        maximum: Largest delay in seconds.
        jitter: Each delay is multiplied by a random factor in ``[1 - jitter, 1 + jitter]``
            (and never exceeds ``maximum``).
    """

    initial: float = 0.1
    maximum: float = 5.0
    jitter: float = 0.2
    _next: float = field(default=0.0, init=False, repr=False)

    def reset(self) -> None:
        """Start again from ``initial``."""
        self._next = 0.0

    def next_delay(self) -> float:
        """The next delay to wait, in seconds."""
        base = self._next or self.initial
        self._next = min(base * 2, self.maximum)
        delay = min(base, self.maximum) * random.uniform(1 - self.jitter, 1 + self.jitter)
        return min(delay, self.maximum)

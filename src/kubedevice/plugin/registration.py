"""The ``Register`` call to the kubelet, the channel it goes over, and the retry backoff.

One call per attempt, with a deadline, on a fresh channel or on a
:class:`KubeletChannels` channel that every plugin of a server shares for one
``kubelet.sock`` (200 resources re-registering after a kubelet restart then make one
connection, not 200); gRPC errors become :class:`~kubedevice.errors.RegistrationError`
(chained).
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import AsyncIterator, Hashable
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from kubedevice._api import VERSION, dp, dp_grpc
from kubedevice.errors import RegistrationError
from kubedevice.plugin.types import PluginOptions

__all__ = ["Backoff", "KubeletChannels", "register"]


async def register(
    kubelet_socket: Path,
    *,
    endpoint: str,
    resource_name: str,
    options: PluginOptions,
    deadline: float = 10.0,
    channel: grpc.aio.Channel | None = None,
) -> None:
    """Call ``/v1beta1.Registration/Register`` once.

    Args:
        kubelet_socket: Path of ``kubelet.sock``.
        endpoint: The plugin's socket file name, relative to the device plugin directory.
        resource_name: The extended resource name.
        options: The plugin's options (sent for kubelets up to 1.24; newer ones ask
            ``GetDevicePluginOptions``).
        deadline: Deadline of the call in seconds (it covers the kubelet's dial-back).
        channel: A channel to ``kubelet_socket`` to call on (left open); ``None``: a fresh
            one, closed after the call.

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
    if channel is not None:
        await _call(channel, request, kubelet_socket, resource_name, deadline)
        return
    async with _channel(kubelet_socket) as fresh:
        await _call(fresh, request, kubelet_socket, resource_name, deadline)


def _channel(kubelet_socket: Path) -> grpc.aio.Channel:
    # A local subchannel pool: gRPC's global pool would otherwise make this fresh channel wait
    # out the ~1 s reconnect backoff left by an earlier failed connect to a restarting kubelet.
    channel_options = [("grpc.enable_retries", 0), ("grpc.use_local_subchannel_pool", 1)]
    return grpc.aio.insecure_channel(f"unix://{kubelet_socket}", options=channel_options)


async def _call(
    channel: grpc.aio.Channel,
    request: dp.RegisterRequest,
    kubelet_socket: Path,
    resource_name: str,
    deadline: float,
) -> None:
    stub = dp_grpc.RegistrationStub(channel)
    try:
        await stub.Register(request, timeout=deadline)
    except grpc.aio.AioRpcError as exc:
        raise RegistrationError(
            f"Register of {resource_name!r} at {kubelet_socket} failed: "
            f"{exc.code().name}: {exc.details()}"
        ) from exc


class KubeletChannels:
    """One channel to ``kubelet.sock`` per kubelet (its socket's identity), shared.

    :meth:`use` lends the channel for the kubelet identified by ``key``, creating it on
    first use; a new key (``kubelet.sock`` re-created: a new kubelet) replaces it, and a
    replaced or failed channel is closed once its last user is done. A failed call drops
    the channel, so the next attempt connects afresh instead of waiting out gRPC's
    reconnect backoff (which a fresh channel never inherits).
    """

    def __init__(self, kubelet_socket: Path) -> None:
        self.kubelet_socket = kubelet_socket
        self._current: tuple[Hashable, grpc.aio.Channel] | None = None
        self._users: dict[grpc.aio.Channel, int] = {}
        self.created = 0  #: channels made so far (one per kubelet when all goes well)

    @contextlib.asynccontextmanager
    async def use(self, key: Hashable) -> AsyncIterator[grpc.aio.Channel]:
        """The shared channel for the kubelet ``key``, for the duration of the block."""
        if self._current is None or self._current[0] != key:
            old, self._current = self._current, (key, _channel(self.kubelet_socket))
            self.created += 1
            if old is not None and not self._users.get(old[1]):
                self._users.pop(old[1], None)
                await old[1].close()
        channel = self._current[1]
        self._users[channel] = self._users.get(channel, 0) + 1
        try:
            yield channel
        except RegistrationError:
            if self._current is not None and self._current[1] is channel:
                self._current = None  # the next attempt connects afresh
            raise
        finally:
            self._users[channel] -= 1
            current = self._current is not None and self._current[1] is channel
            if not self._users[channel] and not current:
                del self._users[channel]
                await channel.close()

    async def close(self) -> None:
        """Close every channel (their calls are cancelled)."""
        channels = set(self._users)
        if self._current is not None:
            channels.add(self._current[1])
        self._current = None
        self._users.clear()
        for channel in channels:
            await channel.close()


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

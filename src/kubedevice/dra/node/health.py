"""The ``v1alpha1.DRAResourceHealth`` service: device health streamed to the kubelet.

Every ``NodeWatchResources`` stream gets the complete list of the driver's devices at once
and again on every change of the device list (bursts coalesce: a slow stream only ever
gets the newest list), and every 10 s without a change. Each device carries a message:
why it is not healthy (its :class:`~kubedevice.dra.model.types.Fault`: ``XID 79: ...``, ``GPU
lost``, the failing check), empty when healthy; and how long the kubelet may trust the
report (``health_check_timeout_seconds``, :data:`TIMEOUT_S`: three resends), after which
it counts the device as Unknown. The kubelet puts health and message into the pods'
``status.containerStatuses[].allocatedResourcesStatus``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any, Final

from kubedevice._api.drahealth.v1alpha1 import api_pb2 as pb, api_pb2_grpc as pb_grpc
from kubedevice.dra.model.types import Device, Health

__all__ = ["HealthService"]

log = logging.getLogger(__name__)

_STATUS = {
    Health.HEALTHY: pb.HealthStatus.HEALTHY,
    Health.UNHEALTHY: pb.HealthStatus.UNHEALTHY,
    Health.UNKNOWN: pb.HealthStatus.UNKNOWN,
}


#: The kubelet counts a device's health as Unknown 30 s after its last report (its
#: DefaultHealthTimeout), so the list is sent again this often even when nothing changed.
RESEND_S: Final = 10.0
#: How long the kubelet trusts a report (``health_check_timeout_seconds``); its default,
#: when none is sent, is 30 s.
TIMEOUT_S: Final = 30


def message_of(device: Device) -> str:
    """What the pod's status says about ``device``: the fault, or empty when healthy."""
    if device.health == Health.HEALTHY:
        return ""
    if device.fault is not None:
        return str(device.fault)
    return "Unknown" if device.health == Health.UNKNOWN else "unhealthy (no reason given)"


class HealthService(pb_grpc.DRAResourceHealthServicer):
    """Streams the devices' health of one pool to every watcher.

    Args:
        pool: The pool's name (the node's).
        resend_s: Send the current list again after this long without a change.
        timeout_s: The ``health_check_timeout_seconds`` sent with every device.
    """

    def __init__(self, pool: str, resend_s: float = RESEND_S, timeout_s: int = TIMEOUT_S) -> None:
        self.pool = pool
        self.resend_s = resend_s
        self.timeout_s = timeout_s
        self._message = pb.NodeWatchResourcesResponse()
        self._since: dict[str, tuple[Health, str, int]] = {}
        self._version = 0
        self._changed = asyncio.Condition()
        self._closed = False
        self.streams = 0  # open streams

    async def update(self, devices: Sequence[Device]) -> None:
        """A new device list: every stream gets it."""
        now = int(time.time())
        since: dict[str, tuple[Health, str, int]] = {}
        message = pb.NodeWatchResourcesResponse()
        for device in devices:
            text = message_of(device)
            previous = self._since.get(device.name)
            same = previous is not None and previous[:2] == (device.health, text)
            stamp = previous[2] if previous is not None and same else now
            since[device.name] = (device.health, text, stamp)
            message.devices.add(
                device=pb.DeviceIdentifier(pool_name=self.pool, device_name=device.name),
                health=_STATUS[device.health],
                last_updated_time=stamp,
                health_check_timeout_seconds=self.timeout_s,
                message=text,
            )
        async with self._changed:
            self._since = since
            self._message = message
            self._version += 1
            self._changed.notify_all()

    async def close(self) -> None:
        """End every stream."""
        async with self._changed:
            self._closed = True
            self._changed.notify_all()

    async def NodeWatchResources(
        self, request: pb.NodeWatchResourcesRequest, context: Any
    ) -> AsyncIterator[pb.NodeWatchResourcesResponse]:
        self.streams += 1
        log.info("health stream opened")
        try:
            seen = -1
            while True:
                async with self._changed:
                    if not self._closed and self._version == seen:
                        with contextlib.suppress(TimeoutError):  # no change: the same again
                            await asyncio.wait_for(self._changed.wait(), self.resend_s)
                    if self._closed:
                        return
                    seen, message = self._version, self._message
                yield message
        finally:
            self.streams -= 1
            log.info("health stream closed")

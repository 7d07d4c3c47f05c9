"""The ``v1alpha1.DRAResourceHealth`` service: device health streamed to the kubelet.

Every ``NodeWatchResources`` stream gets the complete list of the driver's devices at once
and again on every change of the device list (bursts coalesce: a slow stream only ever
gets the newest list), and every 10 s without a change (the kubelet counts a device's
health as Unknown 30 s after its last report). The kubelet puts the health into the pods'
``allocatedResourcesStatus``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any, Final

from kubedevice._api.drahealth.v1alpha1 import api_pb2 as pb, api_pb2_grpc as pb_grpc
from kubedevice.dra.types import Device, Health

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


class HealthService(pb_grpc.DRAResourceHealthServicer):
    """Streams the devices' health of one pool to every watcher.

    Args:
        pool: The pool's name (the node's).
        resend_s: Send the current list again after this long without a change.
    """

    def __init__(self, pool: str, resend_s: float = RESEND_S) -> None:
        self.pool = pool
        self.resend_s = resend_s
        self._message = pb.NodeWatchResourcesResponse()
        self._since: dict[str, tuple[Health, int]] = {}
        self._version = 0
        self._changed = asyncio.Condition()
        self._closed = False
        self.streams = 0  # open streams

    async def update(self, devices: Sequence[Device]) -> None:
        """A new device list: every stream gets it."""
        now = int(time.time())
        since: dict[str, tuple[Health, int]] = {}
        message = pb.NodeWatchResourcesResponse()
        for device in devices:
            previous = self._since.get(device.name)
            stamp = previous[1] if previous and previous[0] == device.health else now
            since[device.name] = (device.health, stamp)
            message.devices.add(
                device=pb.DeviceIdentifier(pool_name=self.pool, device_name=device.name),
                health=_STATUS[device.health],
                last_updated_time=stamp,
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

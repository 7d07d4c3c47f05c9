"""The ``pluginregistration.Registration`` service a DRA driver serves to the kubelet.

The kubelet's plugin watcher finds ``<driver>-reg.sock`` in its ``plugins_registry/``,
calls ``GetInfo`` (type ``DRAPlugin``, the driver name, the DRA socket, the services
served) and tells the outcome with ``NotifyRegistrationStatus``, which is logged. A
kubelet that restarts scans the directory again and calls again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any, Final

from kubedevice._api.pluginregistration.v1 import api_pb2 as pb, api_pb2_grpc as pb_grpc

__all__ = [
    "DRA_PLUGIN_TYPE",
    "HEALTH_V1ALPHA1",
    "V1",
    "V1BETA1",
    "RegistrationService",
    "supported_versions",
]

log = logging.getLogger(__name__)

#: ``PluginInfo.type`` of a DRA driver.
DRA_PLUGIN_TYPE: Final = "DRAPlugin"
#: The service names the kubelet looks for in ``supported_versions``.
V1: Final = "v1.DRAPlugin"
V1BETA1: Final = "v1beta1.DRAPlugin"
HEALTH_V1ALPHA1: Final = "v1alpha1.DRAResourceHealth"


def supported_versions(*, health: bool) -> tuple[str, ...]:
    """The services the DRA socket serves, as ``supported_versions`` names them."""
    return (V1, V1BETA1, HEALTH_V1ALPHA1) if health else (V1, V1BETA1)


class RegistrationService(pb_grpc.RegistrationServicer):
    """Answers the kubelet's plugin watcher for one driver.

    Args:
        driver_name: The plugin's name.
        endpoint: The DRA socket's path.
        versions: The services served there.
        on_registered: Called each time the kubelet says it registered the driver.
    """

    def __init__(
        self,
        driver_name: str,
        endpoint: str,
        versions: Sequence[str],
        on_registered: Callable[[], None] | None = None,
    ) -> None:
        self.driver_name = driver_name
        self.endpoint = endpoint
        self.versions = tuple(versions)
        self.on_registered = on_registered
        self.registrations = 0
        self.registered = asyncio.Event()
        self.last_error = ""

    async def GetInfo(self, request: pb.InfoRequest, context: Any) -> pb.PluginInfo:
        log.debug("kubelet asked for the plugin info")
        return pb.PluginInfo(
            type=DRA_PLUGIN_TYPE,
            name=self.driver_name,
            endpoint=self.endpoint,
            supported_versions=list(self.versions),
        )

    async def NotifyRegistrationStatus(
        self, request: pb.RegistrationStatus, context: Any
    ) -> pb.RegistrationStatusResponse:
        if request.plugin_registered:
            self.registrations += 1
            self.last_error = ""
            log.info("registered with the kubelet as DRA driver %s", self.driver_name)
            self.registered.set()
            if self.on_registered is not None:
                self.on_registered()
        else:
            self.last_error = request.error
            self.registered.clear()
            log.error("the kubelet refused DRA driver %s: %s", self.driver_name, request.error)
        return pb.RegistrationStatusResponse()

"""The kubelet's ``v1beta1.Registration`` server on ``kubelet.sock``, with its checks.

Validates version and resource name with the kubelet's rules and error texts (contract.md#constants,
#resource-names), dials the plugin (10 s), calls ``GetDevicePluginOptions`` and hands the connected
endpoint to the manager before answering, exactly in the kubelet's order (contract.md#registration).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable
from pathlib import Path

import grpc
from grpc import aio

from kubedevice._api import SUPPORTED_VERSIONS, dp, dp_grpc
from kubedevice.errors import PluginRpcError
from kubedevice.kubelet.endpoint import DialError, PluginEndpoint, dial, go_error_text
from kubedevice.kubelet.events import EventLog
from kubedevice.kubelet.sockets import serve_grpc, stop_grpc
from kubedevice.kubelet.types import PluginOptions, RegistrationEvent

__all__ = [
    "RegistrationServer",
    "extended_resource_name_error",
    "is_extended_resource_name",
    "version_error",
]

log = logging.getLogger(__name__)

_DNS1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN = re.compile(rf"^{_DNS1123_LABEL}(\.{_DNS1123_LABEL})*$")
_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")


def _is_qualified_name(value: str) -> bool:
    parts = value.split("/")
    if len(parts) == 1:
        prefix, name = "", parts[0]
    elif len(parts) == 2:
        prefix, name = parts
        if not prefix or len(prefix) > 253 or not _DNS1123_SUBDOMAIN.match(prefix):
            return False
    else:
        return False
    return bool(name) and len(name) <= 63 and bool(_QUALIFIED_NAME.match(name))


def is_extended_resource_name(name: str) -> bool:
    """The kubelet's ``IsExtendedResourceName`` (contract.md#resource-names)."""
    if "/" not in name or "kubernetes.io/" in name:
        return False
    if name.startswith("requests."):
        return False
    return _is_qualified_name("requests." + name)


def version_error(version: str) -> str | None:
    """The kubelet's error text for an unsupported version, or None."""
    if version in SUPPORTED_VERSIONS:
        return None
    supported = "[" + " ".join(f'"{v}"' for v in SUPPORTED_VERSIONS) + "]"
    return (
        f'requested API version "{version}" is not supported by kubelet. '
        f"Supported version is {supported}"
    )


def extended_resource_name_error(name: str) -> str | None:
    """The kubelet's error text for an invalid resource name, or None."""
    return None if is_extended_resource_name(name) else f'the ResourceName "{name}" is invalid'


ConnectedCallback = Callable[[PluginEndpoint], None]


class _Servicer(dp_grpc.RegistrationServicer):
    def __init__(self, server: RegistrationServer) -> None:
        self._server = server

    async def Register(
        self,
        request: dp.RegisterRequest,
        context: aio.ServicerContext[dp.RegisterRequest, dp.Empty],
    ) -> dp.Empty:
        error = await self._server.register(request)
        if error is not None:
            await context.abort(grpc.StatusCode.UNKNOWN, error)
        return dp.Empty()


class RegistrationServer:
    """Serves ``Registration`` on ``socket_path`` (mode 0600)."""

    def __init__(
        self,
        socket_path: Path,
        events: EventLog,
        on_connected: ConnectedCallback,
        *,
        dial_timeout_s: float,
    ) -> None:
        self.socket_path = socket_path
        self._events = events
        self._on_connected = on_connected
        self._dial_timeout_s = dial_timeout_s
        self._server: aio.Server | None = None

    async def start(self) -> None:
        """Bind and serve."""
        self._server = await serve_grpc(
            self.socket_path,
            lambda server: dp_grpc.add_RegistrationServicer_to_server(_Servicer(self), server),
        )

    async def stop(self) -> None:
        """Stop serving and remove the socket."""
        server, self._server = self._server, None
        await stop_grpc(server, self.socket_path)

    async def register(self, req: dp.RegisterRequest) -> str | None:
        """Handle one Register; returns the error text or None."""
        t = self._events.now()
        req_opts = PluginOptions(
            pre_start_required=req.options.pre_start_required,
            get_preferred_allocation_available=req.options.get_preferred_allocation_available,
        )

        def record(error: str | None, dialed: bool, options: PluginOptions | None = None) -> None:
            self._events.append(
                RegistrationEvent(
                    t=t,
                    version=req.version,
                    endpoint=req.endpoint,
                    resource=req.resource_name,
                    request_options=req_opts,
                    dialed=dialed,
                    options=options,
                    error=error,
                )
            )
            extra = {"resource": req.resource_name, "socket": req.endpoint}
            if error:
                log.warning("registration refused: %s", error, extra=extra)
            else:
                log.info("plugin registered", extra=extra)

        error = version_error(req.version) or extended_resource_name_error(req.resource_name)
        if error is not None:
            record(error, False)
            return error
        # Go's filepath.Join: an absolute endpoint is still joined under the dir, then cleaned.
        socket = Path(os.path.normpath(f"{self.socket_path.parent}/{req.endpoint}"))  # noqa: ASYNC240
        try:
            channel = await dial(socket, self._dial_timeout_s)
        except DialError as exc:
            record(str(exc), False)
            return str(exc)
        ep = PluginEndpoint(req.resource_name, socket, channel, PluginOptions(), self._events)
        try:
            options = await ep.get_options()
        except PluginRpcError as exc:
            await ep.close()
            msg = f"failed to get device plugin options: {go_error_text(exc)}"
            record(msg, True)
            return msg
        except BaseException:  # the plugin gave up on Register (cancelled): drop the channel
            await ep.close()
            raise
        ep.options = options
        self._on_connected(ep)
        record(None, True, options)
        return None

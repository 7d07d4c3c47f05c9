"""The class plugin authors subclass: one required device source, optional hooks.

Which optional RPCs a plugin advertises follows from which hooks its class overrides
(:meth:`DevicePlugin.options`). No gRPC type appears here.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, ClassVar

from kubedevice.plugin.config import default_socket_name, validate_resource_name
from kubedevice.plugin.policy import default_preferred_allocation
from kubedevice.plugin.types import (
    DEFAULT,
    AllocateResult,
    Device,
    PluginOptions,
    checked_snapshot,
)

__all__ = ["DevicePlugin"]

_Sink = Callable[[Sequence[Device]], object]


class DevicePlugin:
    """Base class of a device plugin for one resource name.

    Subclasses set :attr:`resource_name` (as a class attribute or in ``__init__``) and
    provide the devices, either by overriding :meth:`devices` (an async iterator of full
    snapshots, the first being the initial list) or by calling :meth:`update` whenever
    the set changes; both can be combined. Every other hook is optional:

    * :meth:`allocate` - return a :class:`ContainerAllocation`, or ``kubedevice.DEFAULT``
      to get the response built from the devices' declared artefacts (the default).
    * :meth:`preferred_allocation` - overriding it (or setting
      :attr:`advertise_preferred_allocation`) advertises ``GetPreferredAllocation``.
    * :meth:`pre_start` - overriding it advertises ``PreStartContainer``.

    Hooks written with ``async def`` run on the server's event loop (do blocking work
    there with ``asyncio.to_thread``); hooks written as plain functions run in a worker
    thread, and a plain generator ``devices()`` runs in a thread of its own. A hook whose
    signature cannot take the server's arguments is refused when the plugin is added.

    Attributes:
        resource_name: The extended resource name, e.g. ``example.com/gpu``; checked
            with the kubelet's rule before any network call.
        socket_name: Socket file name in the device plugin directory; ``None`` derives
            it from the resource name (``example.com-gpu.sock``).
        advertise_preferred_allocation: Advertise ``GetPreferredAllocation`` with the
            default policy even when :meth:`preferred_allocation` is not overridden.
    """

    resource_name: str
    socket_name: str | None = None
    advertise_preferred_allocation: ClassVar[bool] = False

    _kd_sink: _Sink | None = None
    _kd_pending: tuple[Device, ...] | None = None

    if TYPE_CHECKING:
        # The types a subclass may override with: ``async def`` or plain ``def`` hooks
        # (a plain generator for devices()). The implementations are below.

        def devices(self) -> AsyncIterator[Sequence[Device]] | Iterator[Sequence[Device]]: ...

        def allocate(
            self, devices: Sequence[Device]
        ) -> AllocateResult | Awaitable[AllocateResult]: ...

        def preferred_allocation(
            self, available: Sequence[Device], must_include: Sequence[Device], size: int
        ) -> Sequence[str] | Awaitable[Sequence[str]]: ...

        def pre_start(self, devices: Sequence[Device]) -> Awaitable[None] | None: ...

    else:

        async def devices(self) -> AsyncIterator[Sequence[Device]]:
            """Yield full device snapshots: the first is the initial list, then one per change.

            Each snapshot replaces the previous one entirely. When the iterator ends the last
            snapshot stays in force; when it raises, the error is logged and the last
            snapshot stays too. The default yields nothing and waits, for plugins that only
            use :meth:`update`.

            Yields:
                The complete current device list.
            """
            await asyncio.Event().wait()
            yield ()  # pragma: no cover - makes this an async generator

        async def allocate(self, devices: Sequence[Device]) -> AllocateResult:
            """Build the response for one container that gets ``devices``.

            The IDs were already checked: known, healthy, distinct, at least one.

            Args:
                devices: The devices, in the kubelet's request order.

            Returns:
                A :class:`ContainerAllocation`, or ``kubedevice.DEFAULT`` for the union of
                the devices' declared device nodes, mounts, envs, annotations and CDI names.
                Raising :class:`~kubedevice.AllocationError` refuses the request with
                ``INVALID_ARGUMENT``; any other exception makes the RPC fail with ``INTERNAL``.
            """
            return DEFAULT

        async def preferred_allocation(
            self, available: Sequence[Device], must_include: Sequence[Device], size: int
        ) -> Sequence[str]:
            """Choose ``size`` device IDs for a container (``GetPreferredAllocation``).

            The answer is checked: every must-include ID is added if missing, IDs that were
            not offered and duplicates are dropped, and a short answer is filled with the
            default policy; any repair is logged. Raising falls back to the default policy.

            Args:
                available: The devices the kubelet offers (must-include ones among them).
                must_include: Devices already chosen; they count toward ``size``.
                size: The total number of devices the container requests.

            Returns:
                The preferred device IDs. The default policy takes the must-include devices,
                then devices sharing NUMA nodes with them, then the rest in offered order.
            """
            return default_preferred_allocation(available, must_include, size)

        async def pre_start(self, devices: Sequence[Device]) -> None:
            """Prepare ``devices`` before a container that uses them starts.

            Overriding this advertises ``pre_start_required``. Raising makes the RPC fail with
            ``INTERNAL`` (the kubelet then fails the container start).

            Args:
                devices: The container's devices (known IDs only, any health).
            """

    def update(self, devices: Iterable[Device]) -> None:
        """Publish a new full snapshot now, from the event loop the server runs on.

        Works before the plugin is added to a server too: the latest pushed snapshot is
        the initial list whenever the plugin is added (again).

        Args:
            devices: The complete current device list.

        Raises:
            ConfigError: The list has a device ID twice or an item that is not a
                :class:`Device`; the last good list stays in force.
        """
        snapshot = checked_snapshot(devices, getattr(self, "resource_name", ""))
        self._kd_pending = snapshot  # the initial list if the plugin is (re-)added later
        sink = self._kd_sink
        if sink is not None:
            sink(snapshot)

    def options(self) -> PluginOptions:
        """The options this plugin advertises, derived from the hooks it overrides.

        Returns:
            ``pre_start_required`` if :meth:`pre_start` is overridden and
            ``get_preferred_allocation_available`` if :meth:`preferred_allocation` is
            overridden or :attr:`advertise_preferred_allocation` is set.
        """
        cls = type(self)
        return PluginOptions(
            pre_start_required=cls.pre_start is not DevicePlugin.pre_start,
            get_preferred_allocation_available=(
                cls.preferred_allocation is not DevicePlugin.preferred_allocation
                or self.advertise_preferred_allocation
            ),
        )

    def validated_resource_name(self) -> str:
        """:attr:`resource_name`, checked with the kubelet's rule.

        Returns:
            The resource name.

        Raises:
            InvalidResourceNameError: It is missing or the kubelet would reject it.
        """
        return validate_resource_name(getattr(self, "resource_name", ""))

    def effective_socket_name(self) -> str:
        """The socket file name this plugin serves on.

        Returns:
            :attr:`socket_name`, or the name derived from :attr:`resource_name`.
        """
        return self.socket_name or default_socket_name(self.validated_resource_name())

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {getattr(self, 'resource_name', '?')}>"

"""The driver interface a DRA driver author implements: devices and prepare/unprepare hooks.

The kit (``kubedevice.dra``) does the rest: registration with the kubelet, the DRA gRPC
services, reading claims, CDI specs, the prepared-claim checkpoint, ResourceSlices and the
health stream. Imports nothing from the kubelet side.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Sequence
from typing import ClassVar

from kubedevice.dra.model.types import Claim, CounterSet, Device, PreparedClaim, PreparedDevice
from kubedevice.errors import ClaimError

__all__ = ["Driver"]


class Driver(abc.ABC):
    """Subclass it: set :attr:`driver_name`, write :meth:`devices`, optionally the hooks.

    Hooks may be ``async def`` (run on the event loop) or plain ``def`` (run in a thread).
    A hook that raises :class:`~kubedevice.errors.ClaimError` fails that claim with the
    error's text; any other exception fails it with its type and text (logged with its
    traceback); the other claims of the same call are unaffected.
    """

    #: The driver's name, a DNS subdomain (``gpu.example.com``); ``--driver-name`` and
    #: :class:`~kubedevice.dra.DriverOptions` override it.
    driver_name: ClassVar[str] = ""

    @abc.abstractmethod
    def devices(self) -> AsyncIterator[Sequence[Device]]:
        """Yield the full device list now, and again whenever it changes (hot-plug, health).

        Each snapshot replaces the previous one: the kit republishes the ResourceSlices
        and sends the health stream. Names must be unique in a snapshot.
        """

    def counter_sets(self) -> Sequence[CounterSet]:
        """The counter sets the devices consume from (:attr:`Device.consumes_counters`).

        Read with every :meth:`devices` snapshot and published with it, in ResourceSlices
        of their own. The default is none.
        """
        return ()

    async def prepare(self, claim: Claim) -> Sequence[PreparedDevice]:
        """Prepare ``claim``'s devices on this node; return what each device's containers get.

        Called once per claim UID (a claim shared by several pods, or asked again, is
        answered from the checkpoint). Apply ``claim.configs`` (or each device's
        ``configs``, already filtered per request and in order) here. What the driver
        must remember about a device to undo it later goes in :attr:`PreparedDevice.data`:
        the checkpoint keeps it, so it outlives a restart of the driver.

        The default gives each device its own :attr:`Device.edits`, and fails the claim
        if a device is no longer published.
        """
        prepared: list[PreparedDevice] = []
        for allocated in claim.devices:
            if allocated.device is None:
                raise ClaimError(f"device {allocated.name} is not on this node any more")
            prepared.append(PreparedDevice(allocated, allocated.device.edits))
        return prepared

    async def unprepare(self, claim: PreparedClaim) -> None:  # noqa: B027 (optional hook)
        """Undo :meth:`prepare` for ``claim`` (also for claims prepared before a restart).

        ``claim.data`` has what :meth:`prepare` recorded for each device. The default does
        nothing (the kit removes the claim's CDI spec itself).
        """

    async def restore(self, claims: Sequence[PreparedClaim]) -> None:  # noqa: B027 (optional hook)
        """Rebuild the driver's state from the claims an earlier run prepared.

        Called once at start, with every claim of the checkpoint (none on a first start),
        before :meth:`devices` and before any :meth:`prepare` or :meth:`unprepare`. If it
        raises, the driver does not start. The default does nothing.

        With a pod UID (a DaemonSet rolling with ``maxSurge``), another instance of the
        driver may prepare and unprepare claims on the node too: whenever it changed the
        checkpoint, this hook is called again, between calls, with the whole new set of
        prepared claims (take it as the truth: rebuild, do not merge). Every call runs
        under the node's claims lock, so no other instance is inside a hook meanwhile:
        what no claim of the set owns is an orphan.
        """

    async def refresh(self, claim: PreparedClaim) -> Sequence[PreparedDevice | None] | None:
        """Check that what ``claim``'s prepare made still exists; make it again where it is
        gone (a reboot destroys what lives on the hardware, not the checkpoint).

        Called for each prepared claim at start (after :meth:`restore`, before serving) and
        before every answer from the checkpoint (a repeated ``NodePrepareResources``, as
        the kubelet sends for its pods after a reboot). Return ``None`` when nothing
        changed; else one entry per device of ``claim`` (same order): ``None`` keeps that
        device's checkpoint entry, a :class:`PreparedDevice` for the same device replaces
        its ``data`` and CDI edits (the claim's CDI spec is rewritten; its CDI IDs, held by
        the kubelet, stay, so a device answered without edits must stay without). A
        :class:`~kubedevice.errors.ClaimError` fails that answer (the kubelet retries); at
        start it is logged and the claim kept. The default does nothing.
        """
        return None

"""MIG on demand: the GPU instances made for claims, who owns which, one NVML change at a time.

:class:`MigInstances` is the GPU driver's record of the instances it made (GPU, GI ID, MIG
UUID -> claim UID), rebuilt from the checkpoint at start, and every NVML change to them:

* **make** (prepare): each partition's instance is made, or adopted when one is already at
  that profile and placement and no other claim owns it (a prepare cut off after NVML made
  it: the retry takes it instead of failing with ``InsufficientResources``). The NVML work
  runs in a thread that a cancelled caller cannot stop, so a cancelled make waits for it to
  end, then destroys what it made for the claim before it gives up the lock;
* **undo** (unprepare of a claim whose prepare recorded nothing): the instances at the
  claim's placements that no other claim owns are destroyed;
* **remake** (start, and every answer from the checkpoint): a claim's instance that is gone
  (a reboot destroys every MIG instance) is made again at its placement, with a new GI ID,
  MIG UUID and ``nvidia-caps`` nodes;
* **orphans** (start): instances no prepared claim owns are destroyed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Sequence
from typing import TypeVar

from kubedevice.dra.model.types import PreparedClaim
from kubedevice.errors import ClaimError, NvmlError
from kubedevice.nvidia.backend import MigDeviceInfo, MigPartitioning
from kubedevice.nvidia.dra import ondemand
from kubedevice.nvidia.dra.devices import Partition
from kubedevice.nvidia.dra.ondemand import MigRecord

__all__ = ["MigInstances", "caps_of"]

log = logging.getLogger(__name__)

_T = TypeVar("_T")


def caps_of(mig: MigDeviceInfo) -> tuple[str, ...]:
    """The ``nvidia-caps`` nodes of a MIG device (its GPU and compute instance's)."""
    return tuple(f"/dev/nvidia-caps/nvidia-cap{m}" for m in mig.cap_minors)


async def _to_end(work: Awaitable[_T]) -> _T:
    """Await ``work`` to its end even if the caller is cancelled meanwhile (the
    cancellation is raised once it has ended)."""
    task = asyncio.ensure_future(work)
    cancelled = False
    while not task.done():
        try:
            await asyncio.wait((task,))
        except asyncio.CancelledError:
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError
    return task.result()


class MigInstances:
    """The MIG devices made for claims on one node's GPUs.

    Args:
        backend: The NVML backend that makes and destroys them.
    """

    def __init__(self, backend: MigPartitioning) -> None:
        self.backend = backend
        self._lock = asyncio.Lock()  # one NVML change at a time
        # (GPU UUID, GI ID) -> (claim UID, MIG UUID)
        self._owners: dict[tuple[str, int], tuple[str, str]] = {}

    def owner(self, gpu: str, gi: int) -> str | None:
        """The claim UID owning GPU instance ``gi`` of ``gpu``, if known."""
        found = self._owners.get((gpu, gi))
        return found[0] if found else None

    def _others(self, gpu: str, uid: str) -> set[int]:
        return {gi for (g, gi), (owner, _) in self._owners.items() if g == gpu and owner != uid}

    def _own(self, uid: str, mig: MigDeviceInfo) -> MigRecord:
        self._owners[(mig.parent_uuid, mig.gi_id)] = (uid, mig.uuid)
        return MigRecord(mig.parent_uuid, mig.gi_id, mig.uuid)

    def _drop(self, record: MigRecord) -> None:
        if self._owners.get((record.gpu, record.gi), ("", ""))[1] == record.uuid:
            del self._owners[(record.gpu, record.gi)]

    # ---- prepare ----------------------------------------------------------------------

    async def make(
        self, uid: str, wanted: Sequence[tuple[str, Partition, str] | None]
    ) -> list[MigDeviceInfo | None]:
        """Make (or adopt) the MIG device of each ``(GPU UUID, partition, device name)`` for
        claim ``uid``.

        Runs to its end: if the caller is cancelled, the NVML work finishes and what it made
        is destroyed before the cancellation is raised.

        Raises:
            ClaimError: NVML refused one (those made for this call are destroyed).
        """
        task = asyncio.ensure_future(self._make(uid, wanted))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.cancelled():
                raise
        try:
            made = await _to_end(task)
        except ClaimError:
            raise asyncio.CancelledError from None  # it destroyed its own work
        records = [MigRecord(m.parent_uuid, m.gi_id, m.uuid) for m in made if m is not None]
        log.warning(
            "claim %s: its prepare was cancelled after NVML made %d MIG device(s); destroying",
            uid,
            len(records),
        )
        try:
            await _to_end(self.destroy(records))
        except NvmlError as exc:  # a retry adopts them; an unprepare destroys them
            log.warning("claim %s: cannot destroy its MIG devices: %s", uid, exc)
        raise asyncio.CancelledError

    async def _make(
        self, uid: str, wanted: Sequence[tuple[str, Partition, str] | None]
    ) -> list[MigDeviceInfo | None]:
        out: list[MigDeviceInfo | None] = []
        for item in wanted:
            if item is None:
                out.append(None)
                continue
            gpu, part, name = item
            try:
                async with self._lock:
                    mig, adopted = await asyncio.to_thread(
                        ondemand.make_or_adopt, self.backend, gpu, part, self._others(gpu, uid)
                    )
                    self._own(uid, mig)
            except NvmlError as exc:
                made = [MigRecord(m.parent_uuid, m.gi_id, m.uuid) for m in out if m]
                await self.destroy(made)
                raise ClaimError(f"cannot make MIG device {name}: {exc}") from None
            log.info(
                "MIG device %s (%s, GPU instance %d) %s on %s for claim %s",
                mig.uuid,
                part.profile.name,
                mig.gi_id,
                "already there, taken" if adopted else "made",
                gpu,
                uid,
            )
            out.append(mig)
        return out

    # ---- unprepare ----------------------------------------------------------------------

    async def destroy(self, records: Sequence[MigRecord]) -> None:
        """Destroy these MIG devices (those still there).

        Raises:
            NvmlError: NVML refused (``InUse`` ...).
        """
        for record in records:
            async with self._lock:
                gone = await asyncio.to_thread(ondemand.destroy_if_ours, self.backend, record)
                self._drop(record)
            if gone:
                log.info("MIG device %s (GPU instance %d) destroyed", record.uuid, record.gi)

    async def undo(self, uid: str, wanted: Sequence[tuple[str, Partition]]) -> None:
        """Destroy what a prepare of ``uid`` that recorded nothing may have made: the
        instance at each partition that no other claim owns.

        Raises:
            NvmlError: NVML refused.
        """
        for gpu, part in wanted:
            async with self._lock:
                there = await asyncio.to_thread(
                    ondemand.find_at, self.backend, gpu, part, self._others(gpu, uid)
                )
                if there is None:
                    continue
                await asyncio.to_thread(self.backend.destroy_mig_device, gpu, there.gi_id)
                self._drop(MigRecord(gpu, there.gi_id, there.uuid))
            log.warning(
                "claim %s: its prepare recorded nothing; MIG device %s (GPU instance %d) "
                "at its placement destroyed",
                uid,
                there.uuid,
                there.gi_id,
            )

    # ---- start and answers from the checkpoint ---------------------------------------------

    async def remake(self, uid: str, record: MigRecord, part: Partition) -> MigDeviceInfo | None:
        """Claim ``uid``'s MIG device made again at ``part`` if ``record``'s is gone (a
        reboot); ``None`` when it is still there. Runs to its end, as :meth:`make`.

        Raises:
            NvmlError: NVML refused.
        """
        return await _to_end(self._remake(uid, record, part))

    async def _remake(self, uid: str, record: MigRecord, part: Partition) -> MigDeviceInfo | None:
        async with self._lock:
            if await asyncio.to_thread(ondemand.holds, self.backend, record):
                self._owners[(record.gpu, record.gi)] = (uid, record.uuid)
                return None
            self._drop(record)
            mig, adopted = await asyncio.to_thread(
                ondemand.make_or_adopt,
                self.backend,
                record.gpu,
                part,
                self._others(record.gpu, uid),
            )
            self._own(uid, mig)
        log.warning(
            "claim %s: MIG device %s (GPU instance %d) is gone; %s at its placement: %s "
            "(GPU instance %d)",
            uid,
            record.uuid,
            record.gi,
            "found another" if adopted else "made again",
            mig.uuid,
            mig.gi_id,
        )
        return mig

    async def restore(self, claims: Sequence[PreparedClaim], gpus: Sequence[str]) -> None:
        """Take the owners from ``claims`` (the checkpoint: the truth) and destroy the
        instances on ``gpus`` that none of them owns.

        Raises:
            NvmlError: NVML refused.
        """
        self._owners = {}
        owned: list[MigRecord] = []
        for claim in claims:
            for record in map(MigRecord.from_data, claim.data):
                if record is not None:
                    self._owners[(record.gpu, record.gi)] = (claim.ref.uid, record.uuid)
                    owned.append(record)
        async with self._lock:
            orphans = await asyncio.to_thread(ondemand.find_orphans, self.backend, gpus, owned)
            for gpu, gi in orphans:
                await asyncio.to_thread(self.backend.destroy_mig_device, gpu, gi)
                log.warning(
                    "MIG on demand: GPU instance %d on %s owned by no claim: destroyed", gi, gpu
                )

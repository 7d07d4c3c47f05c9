"""The claim work of the DRA kubelet-plugin services (:mod:`kubedevice.dra.node.servicers`).

``NodePrepareResources``: per claim, the checkpoint's answer when the claim was prepared
before (idempotent; a claim shared by several pods is prepared once), else the claim is read
from the API server, checked, handed to the driver's ``prepare`` hook, its CDI spec written
and the checkpoint saved (with each device's ``data`` from the hook).
``NodeUnprepareResources``: the ``unprepare`` hook, the spec removed, the claim forgotten;
an unknown claim is success. At start the checkpoint's claims go to the ``restore`` hook, and
each (as before every answer from the checkpoint) to ``refresh``, which remakes what is gone. A
claim's failure goes in its own ``error``; the other claims of the call are unaffected.
Each call and the start-up restore hold the node's claims lock
(:mod:`kubedevice.dra.state.handover`): a claim prepared by another instance of the driver
is answered and unprepared as its own.
A call cut off by its deadline or by the driver stopping does not cut its work short
(:mod:`kubedevice.dra.node.inflight`): a retry of the claim waits for it and answers from
the record.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import json
import logging
import re
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, Final

from kubedevice._api.dra.v1 import api_pb2 as v1
from kubedevice.dra.api.claims import claim_from_object
from kubedevice.dra.api.kube import KubeClient
from kubedevice.dra.driver import Driver
from kubedevice.dra.model.taints import TaintPolicy
from kubedevice.dra.model.types import (
    MAX_DEVICE_DATA_BYTES,
    Claim,
    ClaimRef,
    Device,
    PreparedClaim,
    PreparedDevice,
)
from kubedevice.dra.node.inflight import InFlight
from kubedevice.dra.node.refresh import ask_refresh, check_prepared_device
from kubedevice.dra.node.released import CALL_DEADLINE, Releases
from kubedevice.dra.node.rules import check_claim
from kubedevice.dra.state.cdi import CdiWriter, cdi_edits
from kubedevice.dra.state.checkpoint import Checkpoint
from kubedevice.dra.state.handover import SharedClaims
from kubedevice.dra.state.lock import ClaimsLock
from kubedevice.dra.state.saver import CheckpointSaver
from kubedevice.dra.state.threads import in_thread
from kubedevice.errors import (
    ClaimError,
    ConfigError,
    DeviceHeldError,
    KubeApiError,
    KubeDeviceError,
)

__all__ = ["ClaimService"]

log = logging.getLogger(__name__)

#: At most this many claims in one call (the kubelet sends a pod's claims of one driver).
MAX_CLAIMS_PER_CALL = 1024


_DNS_LABEL: Final = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS_SUBDOMAIN: Final = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)
_UID: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$")


class ClaimService:
    """Prepares and unprepares claims for one driver; the gRPC servicers call it.

    Args:
        driver: The author's driver (its hooks).
        driver_name: The driver's name (resolved).
        node_name: This node, and the name of its pool.
        kube: The API client (``None``: every claim fails, for tests without a cluster).
        checkpoint: The prepared-claim checkpoint, loaded.
        cdi: The CDI spec writer.
        devices: Returns the driver's current devices by name.
        taints: The taints of devices that are not healthy (default: ``NoSchedule`` ones).
        claims_lock: The node's claims lock, shared with other instances of the driver
            (``None``: this process is alone, nothing to serialise with).
    """

    def __init__(
        self,
        driver: Driver,
        *,
        driver_name: str,
        node_name: str,
        kube: KubeClient | None,
        checkpoint: Checkpoint,
        cdi: CdiWriter,
        devices: Callable[[], Mapping[str, Device]],
        taints: TaintPolicy | None = None,
        claims_lock: ClaimsLock | None = None,
    ) -> None:
        self.driver = driver
        self.driver_name = driver_name
        self.node_name = node_name
        self.kube = kube
        self.checkpoint = checkpoint
        self.cdi = cdi
        self.devices = devices
        self.taints = taints or TaintPolicy(driver_name)
        self._locks: dict[str, tuple[asyncio.Lock, list[int]]] = {}  # uid -> lock, users
        #: The calls' work in flight (each run to its end, even when its call is cut off).
        self.inflight = InFlight()
        #: Prepares waiting for a device's last claim to be unprepared.
        self.releases = Releases(kube, driver_name)
        self.saver = CheckpointSaver(checkpoint)
        #: The node's claims lock around each call (:mod:`kubedevice.dra.state.handover`).
        self.shared = SharedClaims(
            claims_lock, checkpoint, lambda claims: _call_hook(driver.restore, claims)
        )

    async def restore(self) -> None:
        """Load the checkpoint and make it true again, before anything is served (under the
        node's claims lock, when there is one).

        The prepared claims go to the driver's ``restore`` hook; a claim whose prepare was
        interrupted (the driver died in the hook) is undone (``unprepare`` hook, CDI spec
        removed, forgotten); every prepared claim's CDI spec is written again where it is
        missing or differs (the CDI dir is a tmpfs that a reboot empties).

        Raises:
            KubeDeviceError: The ``restore`` hook failed.
            OSError: The claims lock cannot be taken.
        """
        async with self.shared.hold():
            await asyncio.to_thread(self.checkpoint.load)
            await self._restore_loaded()
            self.shared.started = True

    async def _restore_loaded(self) -> None:
        claims = list(self.checkpoint.claims.values())
        try:
            await _call_hook(self.driver.restore, claims)
        except Exception as exc:
            raise KubeDeviceError(
                f"the driver's restore hook failed: {type(exc).__name__}: {exc}"
            ) from exc
        if claims:
            log.info("%d prepared claims handed to the driver's restore hook", len(claims))
        for interrupted in list(self.checkpoint.preparing.values()):
            log.warning(
                "claim %s: its prepare was interrupted before it finished; undoing it",
                interrupted.ref,
            )
            await self._undo(interrupted)
            await asyncio.to_thread(self.cdi.remove, interrupted.ref.uid)
            del self.checkpoint.preparing[interrupted.ref.uid]
            try:
                await self.saver.save()
            except OSError as exc:  # still "preparing" on disk: undone again next start
                log.error("cannot save the checkpoint: %s", exc)
        written = 0
        for claim in claims:
            try:
                claim = await self._refresh(claim)
            except ClaimError as exc:  # checked again on the next prepare of the claim
                log.error("claim %s: %s", claim.ref, exc)
            try:
                written += await self._ensure_spec(claim)
            except ClaimError as exc:  # answered again (and retried) on the next prepare
                log.error("claim %s: %s", claim.ref, exc)
        if written:
            log.warning("%d claims' CDI specs were missing or changed; written again", written)

    # ---- the RPCs (v1 messages) ------------------------------------------------------

    async def prepare(
        self, request: v1.NodePrepareResourcesRequest, deadline: float | None = None
    ) -> v1.NodePrepareResourcesResponse:
        """Answer ``NodePrepareResources``: one entry per claim UID of the request (the
        call's ``deadline``, ``loop.time()``, bounds a wait for a device's last claim)."""
        CALL_DEADLINE.set(deadline)  # in the caller's task: its work's task inherits it
        response = v1.NodePrepareResourcesResponse()
        claims = list(request.claims)
        if len(claims) > MAX_CLAIMS_PER_CALL:
            for claim in claims:
                response.claims[
                    claim.uid
                ].error = f"{len(claims)} claims in one call; at most {MAX_CLAIMS_PER_CALL}"
            return response
        answers = await self.inflight.run(self._prepare_all(claims), "prepare")
        for claim, answer in zip(claims, answers, strict=True):
            response.claims[claim.uid].CopyFrom(answer)
        return response

    async def unprepare(
        self, request: v1.NodeUnprepareResourcesRequest
    ) -> v1.NodeUnprepareResourcesResponse:
        """Answer ``NodeUnprepareResources``: one entry per claim UID of the request."""
        response = v1.NodeUnprepareResourcesResponse()
        claims = list(request.claims)
        answers = await self.inflight.run(self._unprepare_all(claims), "unprepare")
        for claim, error in zip(claims, answers, strict=True):
            response.claims[claim.uid].error = error
        return response

    async def _prepare_all(
        self, claims: Sequence[v1.Claim]
    ) -> list[v1.NodePrepareResourceResponse]:
        try:
            async with self.shared.hold_for_call():
                return await asyncio.gather(*(self._prepare_one(c) for c in claims))
        except ClaimError as exc:  # the claims lock cannot be taken
            return [v1.NodePrepareResourceResponse(error=str(exc)) for _ in claims]

    async def _unprepare_all(self, claims: Sequence[v1.Claim]) -> list[str]:
        try:
            async with self.shared.hold_for_call():
                return await asyncio.gather(*(self._unprepare_one(c) for c in claims))
        except ClaimError as exc:
            return [str(exc) for _ in claims]

    # ---- one claim ---------------------------------------------------------------------

    async def _prepare_one(self, raw: v1.Claim) -> v1.NodePrepareResourceResponse:
        try:
            ref = _ref(raw)
        except ClaimError as exc:
            return v1.NodePrepareResourceResponse(error=str(exc))
        async with self._lock(ref.uid):
            try:
                prepared = self.checkpoint.claims.get(ref.uid)
                if prepared is None:
                    interrupted = self.checkpoint.preparing.get(ref.uid)
                    if interrupted is not None:
                        log.warning("claim %s: an earlier prepare was interrupted; undoing it", ref)
                        await self._forget(interrupted, undo=True)
                    prepared = await self._prepare_new(ref)
                    log.info("prepared claim %s: %d devices", ref, len(prepared.devices))
                else:
                    prepared = await self._answer_again(prepared)
                    log.debug("claim %s was prepared before; same answer", ref)
            except ClaimError as exc:
                log.warning("cannot prepare claim %s: %s", ref, exc)
                return v1.NodePrepareResourceResponse(error=str(exc))
            except Exception as exc:
                log.exception("cannot prepare claim %s", ref)
                return v1.NodePrepareResourceResponse(
                    error=f"preparing failed: {type(exc).__name__}: {exc}"
                )
        return _answer(prepared)

    async def _answer_again(self, prepared: PreparedClaim) -> PreparedClaim:
        """A claim prepared before: its CDI spec written again if it is gone or differs.

        A checkpoint entry older than the edits it keeps cannot rebuild a lost spec: then
        the claim is read again and the prepare hook called again (its answer replaces
        the entry), as on a first prepare.
        """
        if any(e is None for e in prepared.edits) or len(prepared.edits) < len(prepared.devices):
            wanted = any(prepared.cdi_ids)
            path = self.cdi.path(prepared.ref.uid)
            if not wanted or await asyncio.to_thread(path.is_file):
                return prepared
            log.warning(
                "claim %s: its CDI spec is gone and its checkpoint entry predates the edits "
                "it needs; preparing it again",
                prepared.ref,
            )
            return await self._prepare_new(prepared.ref)
        prepared = await self._refresh(prepared)
        if await self._ensure_spec(prepared):
            log.warning("claim %s: CDI spec missing or changed; written again", prepared.ref)
        return prepared

    async def _refresh(self, prepared: PreparedClaim) -> PreparedClaim:
        """The driver's ``refresh`` hook: what it remade replaces the checkpoint entry
        (ClaimError: the hook failed, or the entry, changed in memory, cannot be saved)."""
        merged = await ask_refresh(self.driver, prepared, _call_hook, _json_data)
        if merged is None:
            return prepared
        self.checkpoint.claims[prepared.ref.uid] = merged
        try:
            await self.saver.save()
        except OSError as exc:
            raise ClaimError(f"cannot save the remade claim: {exc}") from None
        return merged

    async def _ensure_spec(self, prepared: PreparedClaim) -> bool:
        """Write ``prepared``'s spec from its edits if the file is missing or differs.

        Raises:
            ClaimError: It cannot be written.
        """
        specs = _spec_devices(prepared)
        if specs is None:
            return False  # an entry older than the edits: see _answer_again
        try:
            # a read of one small file in the CDI dir (a tmpfs), on the loop like the write
            return self.cdi.ensure(prepared.ref.uid, specs)
        except (OSError, ConfigError) as exc:
            raise ClaimError(f"cannot write the claim's CDI spec again: {exc}") from None

    async def _prepare_new(self, ref: ClaimRef) -> PreparedClaim:
        claim = await self._read(ref)
        while True:
            try:
                check_claim(
                    claim,
                    driver_name=self.driver_name,
                    node_name=self.node_name,
                    devices=self.devices(),
                    taints=self.taints,
                    held=[*self.checkpoint.claims.values(), *self.checkpoint.preparing.values()],
                )
                break
            except DeviceHeldError as exc:  # its last claim may be on its way out
                holder = self.checkpoint.claims.get(exc.holder)
                if holder is None or not await self.releases.wait(holder, ref, exc.device):
                    raise
        started = PreparedClaim(
            ref=ref,
            devices=tuple((d.request, d.pool, d.name) for d in claim.devices),
            cdi_ids=tuple(() for _ in claim.devices),
            share_ids=tuple(d.share_id for d in claim.devices),
            admin_access=tuple(d.admin_access for d in claim.devices),
        )
        # "prepare started" is in the file before the hook runs: if the driver dies in the
        # hook, the next start (or the next unprepare) undoes what the hook did. Not
        # fsynced: a killed process leaves the page cache to the next start; a power loss
        # takes what the hook did to the devices with it (and the kubelet prepares the
        # running pods' claims again after a reboot); the synced save below covers it
        before = self.checkpoint.claims.pop(ref.uid, None)
        self.checkpoint.preparing[ref.uid] = started
        try:
            await self.saver.save(sync=False, follow=False)
        except OSError as exc:
            del self.checkpoint.preparing[ref.uid]
            if before is not None:
                self.checkpoint.claims[ref.uid] = before
            raise ClaimError(f"cannot record the claim before preparing it: {exc}") from None
        try:
            results = await _call_hook(self.driver.prepare, claim)
        except Exception:
            await self._drop_started(ref)  # the hook failed: it undid its own work
            raise
        try:
            prepared = _check_prepared(claim, results)
        except ClaimError:
            await self._undo(started)  # the hook did its work: undo it for every device
            await self._drop_started(ref)
            raise
        done = self._record(ref, prepared)
        try:
            specs = _spec_devices(done) or []
            text = self.cdi.text(ref.uid, specs) if specs else None  # refused: nothing saved
            self.checkpoint.claims[ref.uid] = done
            del self.checkpoint.preparing[ref.uid]
            # the synced save and the claim's CDI spec (one small file, not fsynced) side by
            # side, each in a thread: the spec adds no time of its own. A crash between the
            # two is safe: a start, or the kubelet's next prepare of the claim, writes a
            # prepared claim's missing spec again from the checkpoint
            for result in await asyncio.gather(
                self.saver.save(),
                asyncio.to_thread(self.cdi.put, ref.uid, text),
                return_exceptions=True,
            ):
                if isinstance(result, BaseException):
                    raise result
        except (OSError, ConfigError) as exc:
            self.checkpoint.claims.pop(ref.uid, None)
            self.checkpoint.preparing[ref.uid] = started
            await asyncio.to_thread(self.cdi.remove, ref.uid)
            await self._undo(done)
            await self._drop_started(ref)
            raise ClaimError(f"cannot record the prepared claim: {exc}") from None
        return done

    def _record(self, ref: ClaimRef, prepared: Sequence[PreparedDevice]) -> PreparedClaim:
        """The checkpoint entry of a prepared claim: one spec device per device with edits
        (a device in two requests with the same edits once, with other edits ``_<n>``)."""
        used: dict[str, Mapping[str, Any]] = {}
        cdi_ids: list[tuple[str, ...]] = []
        edits: list[Mapping[str, Any]] = []
        for item in prepared:
            own = cdi_edits(item.edits)
            edits.append(own)
            if not own:
                cdi_ids.append(())
                continue
            base = name = f"{ref.uid}-{item.device.name}"
            if item.device.share_id is not None:  # each share its own CDI device
                base = name = f"{base}-{item.device.share_id}"
            n = 0
            while used.setdefault(name, own) != own:
                n += 1
                name = f"{base}_{n}"
            cdi_ids.append((self.cdi.qualified(name),))
        return PreparedClaim(
            ref=ref,
            devices=tuple((p.device.request, p.device.pool, p.device.name) for p in prepared),
            cdi_ids=tuple(cdi_ids),
            share_ids=tuple(p.device.share_id for p in prepared),
            data=tuple(p.data for p in prepared),
            edits=tuple(edits),
            admin_access=tuple(p.device.admin_access for p in prepared),
        )

    async def _drop_started(self, ref: ClaimRef) -> None:
        """Forget a claim whose prepare failed (best effort on disk: a start undoes it)."""
        if self.checkpoint.preparing.pop(ref.uid, None) is None:
            return
        try:
            await self.saver.save()
        except OSError as exc:
            log.error("cannot save the checkpoint: %s", exc)

    async def _read(self, ref: ClaimRef) -> Claim:
        if self.kube is None:
            raise ClaimError("no API server to read the claim from")
        try:
            obj = await self.kube.get_claim(ref.namespace, ref.name)
        except KubeApiError as exc:
            if exc.status == 404:
                raise ClaimError(f"claim {ref.namespace}/{ref.name} does not exist") from None
            raise ClaimError(f"cannot read claim {ref.namespace}/{ref.name}: {exc}") from None
        return claim_from_object(
            ref,
            obj,
            driver_name=self.driver_name,
            pool=self.node_name,
            devices=self.devices(),
        )

    async def _undo(self, prepared: PreparedClaim) -> None:
        try:
            await _call_hook(self.driver.unprepare, prepared)
        except Exception:
            log.exception("unprepare of %s after a failed prepare failed too", prepared.ref)

    async def _forget(self, prepared: PreparedClaim, *, undo: bool) -> None:
        """Unprepare ``prepared`` and forget it once the checkpoint without it is saved.

        Raises:
            ClaimError: The checkpoint cannot be saved (the claim is kept: retried later).
            Exception: The ``unprepare`` hook failed (with ``undo=False``).
        """
        uid = prepared.ref.uid
        if undo:
            await self._undo(prepared)
        else:
            await _call_hook(self.driver.unprepare, prepared)
        # one unlink in the CDI dir (a tmpfs): cheaper here than a hop to a thread and back
        self.cdi.remove(uid)
        table = (
            self.checkpoint.claims if uid in self.checkpoint.claims else self.checkpoint.preparing
        )
        del table[uid]
        try:
            # answered once every process sees it (a restarted driver does not bring the
            # claim back); the fsync follows at once, off the call's path
            await self.saver.save(sync=False)
        except OSError as exc:
            table[uid] = prepared  # forgotten only once that is on disk
            raise ClaimError(
                f"cannot save the checkpoint without claim {prepared.ref} ({exc}); "
                "it stays prepared until an unprepare succeeds"
            ) from None
        self.releases.released(uid)

    async def _unprepare_one(self, raw: v1.Claim) -> str:
        if not raw.uid:
            return "claim uid is empty"
        async with self._lock(raw.uid):
            prepared = self.checkpoint.claims.get(raw.uid)
            interrupted = self.checkpoint.preparing.get(raw.uid) if prepared is None else None
            try:
                if prepared is not None:
                    await self._forget(prepared, undo=False)
                    log.info("unprepared claim %s", prepared.ref)
                elif interrupted is not None:
                    await self._forget(interrupted, undo=True)
                    log.info("undid the interrupted prepare of claim %s", interrupted.ref)
                else:
                    self.cdi.remove(raw.uid)  # one unlink, as in _forget
            except ClaimError as exc:
                log.warning("cannot unprepare claim %s: %s", raw.uid, exc)
                return str(exc)
            except Exception as exc:
                log.exception("cannot unprepare claim %s", raw.uid)
                return f"unpreparing failed: {type(exc).__name__}: {exc}"
        return ""

    @contextlib.asynccontextmanager
    async def _lock(self, uid: str) -> AsyncIterator[None]:
        """One prepare or unprepare at a time per claim; the lock goes with its last user."""
        lock, users = self._locks.setdefault(uid, (asyncio.Lock(), [0]))
        users[0] += 1
        try:
            async with lock:
                yield
        finally:
            users[0] -= 1
            if users[0] == 0:
                del self._locks[uid]


def _ref(raw: v1.Claim) -> ClaimRef:
    for field in ("namespace", "uid", "name"):
        if not getattr(raw, field):
            raise ClaimError(f"claim {field} is empty")
    # They go into the API server's URL and the CDI file name: nothing else gets through.
    if not _DNS_LABEL.match(raw.namespace):
        raise ClaimError(f"claim namespace {raw.namespace[:80]!r} is not a namespace name")
    if len(raw.name) > 253 or not _DNS_SUBDOMAIN.match(raw.name):
        raise ClaimError(f"claim name {raw.name[:80]!r} is not a ResourceClaim name")
    if len(raw.uid) > 128 or not _UID.match(raw.uid):
        raise ClaimError(f"claim uid {raw.uid[:80]!r} is not a UID")
    return ClaimRef(namespace=raw.namespace, name=raw.name, uid=raw.uid)


def _check_prepared(claim: Claim, results: Any) -> list[PreparedDevice]:
    if not isinstance(results, Sequence) or isinstance(results, str):
        raise ClaimError(f"the prepare hook returned {type(results).__name__}, not a list")
    allocated = {(d.request, d.name) for d in claim.devices}
    out: list[PreparedDevice] = []
    for item in results:
        item = check_prepared_device(item, "the prepare hook")
        if (item.device.request, item.device.name) not in allocated:
            raise ClaimError(
                f"the prepare hook returned device {item.device.name} (request "
                f"{item.device.request}), which is not allocated to the claim"
            )
        out.append(dataclasses.replace(item, data=_json_data(item)))
    return out


def _json_data(item: PreparedDevice) -> Mapping[str, Any]:
    """The device's ``data`` as the checkpoint will give it back (read from its JSON)."""
    what = f"the prepare hook's data for device {item.device.name}"
    if not isinstance(item.data, Mapping):
        raise ClaimError(f"{what} is {type(item.data).__name__}, not a mapping")
    try:
        if not all(isinstance(key, str) for key in item.data):
            raise TypeError("its keys must be strings")
        text = json.dumps(dict(item.data), allow_nan=False, sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise ClaimError(f"{what} is not JSON: {exc}") from None
    if len(text.encode()) > MAX_DEVICE_DATA_BYTES:
        raise ClaimError(f"{what} is larger than {MAX_DEVICE_DATA_BYTES} bytes as JSON")
    data: dict[str, Any] = json.loads(text)
    return MappingProxyType(data)


def _spec_devices(prepared: PreparedClaim) -> list[tuple[str, Mapping[str, Any]]] | None:
    """``(spec device name, edits)`` of the claim's spec; ``None`` if the edits are unknown."""
    if len(prepared.edits) < len(prepared.devices) or any(e is None for e in prepared.edits):
        return None
    out: list[tuple[str, Mapping[str, Any]]] = []
    for ids, edits in zip(prepared.cdi_ids, prepared.edits, strict=False):
        if ids and edits:
            out.append((ids[0].split("=", 1)[1], edits))
    return out


def _answer(prepared: PreparedClaim) -> v1.NodePrepareResourceResponse:
    answer = v1.NodePrepareResourceResponse()
    for i, (request, pool, device) in enumerate(prepared.devices):
        entry = answer.devices.add(
            # the kubelet gives a container the devices whose request names contain the
            # request it names (resources.claims[].request), always a top-level request:
            # a subrequest's device ("gpu/small", firstAvailable) is answered as "gpu"
            request_names=[request.split("/", 1)[0]],
            pool_name=pool,
            device_name=device,
            cdi_device_ids=list(prepared.cdi_ids[i]) if i < len(prepared.cdi_ids) else [],
        )
        share_id = prepared.share_ids[i] if i < len(prepared.share_ids) else None
        if share_id is not None:
            entry.share_id = share_id
    return answer


async def _call_hook(hook: Callable[[Any], Any], argument: Any) -> Any:
    """Await an ``async def`` hook; run a plain one in a thread (a daemon thread: one that
    never returns holds neither the process at its exit nor the kit's own thread work)."""
    if inspect.iscoroutinefunction(hook):
        return await hook(argument)
    result = await in_thread(hook, argument)
    if inspect.isawaitable(result):
        return await result
    return result

"""``status.devices`` of the claims a driver prepared: Ready, Healthy, and the device's data.

After a claim is prepared, the driver writes one entry per prepared device into the claim's
``status.devices`` (``resource.k8s.io/v1`` ``AllocatedDeviceStatus``) by server-side apply
with the field manager ``<driver>/<node>``, so entries of other drivers are left alone:

- condition ``Ready``: ``True``, reason ``Prepared``;
- condition ``Healthy``: ``True``, ``False`` or ``Unknown``, the reason the fault's kind in
  CamelCase (``Xid``, ``GpuLost``, ``HealthCheck``) and its message (``XID 79: ...``);
- ``data``: the device's ``uuid``, ``pciBusID`` and ``path`` attributes, where it has them.

A health change rewrites the entries of the prepared claims with that device. Writes run in
the background, never delaying the kubelet's call, and give way to its calls: a write waits
until no ``NodePrepareResources``/``NodeUnprepareResources`` has been in flight for
:data:`QUIET_S` (at most :data:`MAX_DEFER_S` after it was asked for), so that on a small
node the apply (costly for the API server too) does not compete with the next call. A
claim's status already written with the same entries (a repeated prepare) is not written
again. A failure is logged and retried with backoff, except a refusal (403: the driver
lacks ``resourceclaims/status`` and, from Kubernetes 1.36, ``associated-node:patch`` on
``resourceclaims/driver``; 404: the claim is gone; 409/422: the claim changed, e.g.
deallocated), logged once per claim and dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final

from kubedevice.dra.api.kube import KubeClient
from kubedevice.dra.model.types import Device, Health, PreparedClaim
from kubedevice.dra.state.checkpoint import Checkpoint
from kubedevice.errors import KubeApiError
from kubedevice.plugin.registration import Backoff

__all__ = ["MAX_DEFER_S", "QUIET_S", "ClaimStatusWriter", "device_status"]

log = logging.getLogger(__name__)

#: A status write waits until no claim call has been in flight for this long...
QUIET_S: Final = 0.05
#: ... but at most this long after it was asked for.
MAX_DEFER_S: Final = 1.0

_DATA_ATTRIBUTES: Final = {
    "uuid": "uuid",
    "resource.kubernetes.io/pciBusID": "pciBusID",
    "path": "path",
}
_FINAL: Final = frozenset({403, 404, 409, 422})  # retrying would not help


def _reason(kind: str) -> str:
    """A fault kind as a condition reason (``gpu-lost`` -> ``GpuLost``)."""
    out = "".join(p[:1].upper() + p[1:] for p in kind.replace(".", "-").split("-") if p)
    return out if out[:1].isalpha() else f"Fault{out}"


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def device_status(
    driver: str,
    pool: str,
    name: str,
    device: Device | None,
    since: Callable[[str, str], str],
    share_id: str | None = None,
) -> dict[str, Any]:
    """One ``status.devices`` entry. ``since(type, status)`` gives a condition's
    ``lastTransitionTime``."""
    if device is None:
        healthy, reason, message = "Unknown", "DeviceGone", "the device is no longer published"
    elif device.health == Health.HEALTHY:
        healthy, reason, message = "True", "Healthy", ""
    elif device.health == Health.UNKNOWN:
        healthy, reason, message = "Unknown", "Unknown", str(device.fault or "")
    else:
        fault = device.fault
        healthy = "False"
        reason = _reason(fault.kind) if fault is not None else "Unhealthy"
        message = str(fault) if fault is not None else "unhealthy (no reason given)"
    conditions = [
        {
            "type": "Ready",
            "status": "True",
            "reason": "Prepared",
            "message": f"prepared on node {pool}",
            "lastTransitionTime": since("Ready", "True"),
        },
        {
            "type": "Healthy",
            "status": healthy,
            "reason": reason,
            "message": message,
            "lastTransitionTime": since("Healthy", healthy),
        },
    ]
    entry: dict[str, Any] = {
        "driver": driver,
        "pool": pool,
        "device": name,
        "conditions": conditions,
    }
    if share_id:
        entry["shareID"] = share_id
    data = {}
    if device is not None:
        for attribute, key in _DATA_ATTRIBUTES.items():
            if attribute in device.attributes:
                data[key] = device.attributes[attribute]
    if data:
        entry["data"] = data
    return entry


class ClaimStatusWriter:
    """Keeps ``status.devices`` of the prepared claims (see the module's docstring).

    Args:
        kube: The API client.
        driver: The driver's name.
        node: This node's name (the pool's).
        checkpoint: The prepared claims.
        devices: The driver's current devices by name.
    """

    def __init__(
        self,
        kube: KubeClient,
        driver: str,
        node: str,
        checkpoint: Checkpoint,
        devices: Callable[[], Mapping[str, Device]],
    ) -> None:
        self.kube = kube
        self.driver = driver
        self.node = node
        self.checkpoint = checkpoint
        self.devices = devices
        self.manager = f"{driver}/{node}"[:128]
        self.writes = 0
        self._dirty: set[str] = set()
        self._writing: set[str] = set()
        self._wake = asyncio.Event()
        self._written = asyncio.Condition()
        self._seen: dict[str, tuple[Health, str]] = {}
        self._times: dict[tuple[str, str, str], tuple[str, str]] = {}
        self._bodies: dict[str, dict[str, Any]] = {}  # uid -> the body last written
        self.backoff = Backoff(initial=0.5, maximum=30.0)
        self._calls = 0  # claim calls in flight
        self._idle = asyncio.Event()
        self._idle.set()
        self._last_call = 0.0  # loop time the last claim call ended

    def call_started(self) -> None:
        """A claim call (prepare or unprepare) began: writes wait until it ends."""
        self._calls += 1
        self._idle.clear()

    def call_ended(self) -> None:
        """A claim call ended."""
        self._calls -= 1
        self._last_call = asyncio.get_running_loop().time()
        if self._calls == 0:
            self._idle.set()

    async def _quiet(self, deadline: float) -> None:
        """Wait until no claim call has been in flight for :data:`QUIET_S`, or ``deadline``."""
        loop = asyncio.get_running_loop()
        while (now := loop.time()) < deadline:
            if self._calls:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._idle.wait(), deadline - now)
                continue
            wait = self._last_call + QUIET_S - now
            if wait <= 0:
                return
            await asyncio.sleep(min(wait, deadline - now))

    def prepared(self, uids: Iterable[str]) -> None:
        """Claims just prepared: write their status (soon, from :meth:`run`)."""
        self._dirty.update(uids)
        self._wake.set()

    def devices_changed(self, devices: Sequence[Device]) -> None:
        """A new device list: rewrite the claims whose devices' health changed."""
        now = {d.name: (d.health, str(d.fault or "")) for d in devices}
        changed = {n for n in now.keys() | self._seen.keys() if now.get(n) != self._seen.get(n)}
        first = not self._seen
        self._seen = now
        if first or not changed:
            return
        for uid, claim in self.checkpoint.claims.items():
            if any(name in changed for _request, _pool, name in claim.devices):
                self._dirty.add(uid)
        if self._dirty:
            self._wake.set()

    async def wait_written(self, uid: str) -> None:
        """Wait until ``uid``'s status has been written (or given up) since it was marked."""
        async with self._written:
            await self._written.wait_for(lambda: uid not in self._dirty | self._writing)

    async def run(self) -> None:
        """Write what is marked; retry failures with backoff. Never returns."""
        loop = asyncio.get_running_loop()
        while True:
            await self._wake.wait()
            deadline = loop.time() + MAX_DEFER_S
            await self._quiet(deadline)
            self._wake.clear()
            batch, self._dirty = sorted(self._dirty), set()
            self._writing = set(batch)
            retry = False
            for uid in batch:
                await self._quiet(deadline)
                claim = self.checkpoint.claims.get(uid)
                try:
                    if claim is not None:
                        await self._write(claim)
                except KubeApiError as exc:
                    assert claim is not None
                    if exc.status in _FINAL:
                        log.warning("status of claim %s not written: %s", claim.ref, exc)
                    else:
                        retry = True
                        self._dirty.add(uid)
                        log.warning("status of claim %s: %s; trying again", claim.ref, exc)
                finally:
                    async with self._written:
                        self._writing.discard(uid)
                        self._written.notify_all()
            if retry:
                await asyncio.sleep(self.backoff.next_delay())
                self._wake.set()
            else:
                self.backoff.reset()

    def body(self, claim: PreparedClaim) -> dict[str, Any]:
        """The apply patch of ``claim``'s status: one entry per prepared device."""
        devices = self.devices()
        uid = claim.ref.uid

        def since(name: str) -> Callable[[str, str], str]:
            def when(kind: str, status: str) -> str:
                key = (uid, name, kind)
                known = self._times.get(key)
                if known is None or known[0] != status:
                    known = (status, _now())
                    self._times[key] = known
                return known[1]

            return when

        share_ids = claim.share_ids or (None,) * len(claim.devices)
        entries = [
            device_status(self.driver, pool, name, devices.get(name), since(name), share)
            for (_request, pool, name), share in zip(claim.devices, share_ids, strict=False)
        ]
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": claim.ref.name, "namespace": claim.ref.namespace, "uid": uid},
            "status": {"devices": entries},
        }

    async def _write(self, claim: PreparedClaim) -> None:
        body = self.body(claim)
        uid = claim.ref.uid
        if self._bodies.get(uid) == body:
            return  # written already, the same (a repeated prepare)
        await self.kube.apply_claim_status(claim.ref.namespace, claim.ref.name, body, self.manager)
        self.writes += 1
        log.debug("status of claim %s written (%d devices)", claim.ref, len(claim.devices))
        self._bodies[uid] = body
        live = self.checkpoint.claims
        for key in [k for k in self._times if k[0] not in live]:
            del self._times[key]
        for gone in [u for u in self._bodies if u not in live]:
            del self._bodies[gone]

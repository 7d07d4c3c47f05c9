"""Waiting for a device's previous claim to be unprepared once the API server has let it go.

A pod force-deleted (grace 0) is gone from the API server at once; its claim is deallocated
(or deleted) and the scheduler gives the device to the next claim, whose prepare can reach
the driver before the kubelet has unprepared the old claim (a fraction of a second later).
The kit's "one device, one claim" rule (:mod:`kubedevice.dra.node.rules`) would refuse it,
and the kubelet would try that pod again only after its back-off (a minute or more). So when
the claim holding the device no longer holds it in the API server (gone, a new claim of the
same name, no longer allocated that device, or reserved for no pod), the prepare waits for
that claim's unprepare, until shortly before the call's deadline, and is checked again. A
claim the API server still gives the device to is refused at once, as before.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from typing import Any, Final

from kubedevice.dra.api.kube import KubeClient
from kubedevice.dra.model.types import ClaimRef, PreparedClaim
from kubedevice.errors import KubeApiError

__all__ = ["CALL_DEADLINE", "MAX_WAIT_S", "Releases"]

log = logging.getLogger(__name__)

#: The deadline of the call being served (``loop.time()``), ``None`` when it has none.
CALL_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "kubedevice_dra_call_deadline", default=None
)
#: The longest wait for a call without a deadline (the kubelet's calls have 45 s).
MAX_WAIT_S: Final = 40.0
#: The answer leaves this long before the call's deadline.
_MARGIN_S: Final = 1.0


class Releases:
    """Waiters for claims to be unprepared on this node (see the module).

    Args:
        kube: The API client (``None``: nothing is known to be let go; no wait).
        driver_name: The driver, whose allocation results count.
    """

    def __init__(self, kube: KubeClient | None, driver_name: str) -> None:
        self.kube = kube
        self.driver_name = driver_name
        self._waiting: dict[str, tuple[asyncio.Future[None], list[int]]] = {}  # uid -> users

    def released(self, uid: str) -> None:
        """Claim ``uid`` is unprepared and forgotten: its waiters go on."""
        if self._waiting:
            entry = self._waiting.pop(uid, None)
            if entry is not None and not entry[0].done():
                entry[0].set_result(None)

    async def wait(self, holder: PreparedClaim, claim: ClaimRef, device: str) -> bool:
        """Wait for ``holder``'s unprepare if the API server no longer gives it ``device``;
        whether it came (``False``: it holds the device in the API server, or did not go
        in time)."""
        if self.kube is None:
            return False
        loop = asyncio.get_running_loop()
        now = loop.time()
        deadline = CALL_DEADLINE.get()
        until = (
            now + MAX_WAIT_S if deadline is None else min(deadline - _MARGIN_S, now + MAX_WAIT_S)
        )
        if until <= now:
            return False
        uid = holder.ref.uid
        gone, users = self._waiting.setdefault(uid, (loop.create_future(), [0]))
        users[0] += 1
        try:
            async with asyncio.timeout_at(until):
                if not await self._let_go(holder, device):
                    return False
                log.info(
                    "claim %s: device %s is still prepared for claim %s, which the API server "
                    "no longer gives it to; waiting for its unprepare",
                    claim,
                    device,
                    holder.ref,
                )
                await asyncio.shield(gone)
        except TimeoutError:
            log.warning(
                "claim %s: claim %s, which holds device %s, was not unprepared within %.1f s",
                claim,
                holder.ref,
                device,
                loop.time() - now,
            )
            return False
        finally:
            users[0] -= 1
            if users[0] == 0 and self._waiting.get(uid, (None,))[0] is gone:
                del self._waiting[uid]
        log.info(
            "claim %s: claim %s unprepared after %.3f s; device %s is free",
            claim,
            holder.ref,
            loop.time() - now,
            device,
        )
        return True

    async def _let_go(self, holder: PreparedClaim, device: str) -> bool:
        """Whether the API server no longer gives ``device`` to ``holder``."""
        assert self.kube is not None
        ref = holder.ref
        try:
            obj = await self.kube.get_claim(ref.namespace, ref.name)
        except KubeApiError as exc:
            return exc.status == 404
        if _get(obj, "metadata", "uid") != ref.uid:
            return True  # deleted; this is another claim of the same name
        status = obj.get("status") or {}
        if not status.get("reservedFor"):
            return True  # no pod uses it any more
        results = _get(status, "allocation", "devices", "results") or []
        given = {
            (r.get("pool"), r.get("device"))
            for r in results
            if isinstance(r, dict) and r.get("driver") == self.driver_name
        }
        return not any(
            (pool, device) in given for _r, pool, name in holder.devices if name == device
        )


def _get(obj: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj

"""Claims as the cases use them: make one, prepare it, and judge the answer.

A :class:`KitClaim` is a claim the kit made and allocated (its ref and its requests);
:func:`answer_problem` says what is wrong with a driver's answer for it, and
:func:`cdi_problems` what a container runtime would find wrong with its CDI IDs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from grpc import aio

from kubedevice.conformance.dra.context import DraContext
from kubedevice.conformance.dra.fixtures import Request
from kubedevice.conformance.dra.kube import ApiError
from kubedevice.conformance.dra.kubelet import Answer, ClaimRef, rpc_text

__all__ = ["KitClaim", "answer_problem", "cdi_problems", "make", "prepare", "unprepare"]


@dataclass(frozen=True)
class KitClaim:
    """A claim the kit made, with what it allocated."""

    ref: ClaimRef
    requests: tuple[Request, ...]

    @property
    def uid(self) -> str:
        """The claim's UID."""
        return self.ref[2]


async def make(ctx: DraContext, requests: Sequence[Request], *, allocate: bool = True) -> KitClaim:
    """Make (and allocate) a claim in the API server."""
    ref = await asyncio.to_thread(ctx.fixtures.claim, requests, allocate=allocate)
    return KitClaim(ref, tuple(requests))


async def prepare(
    ctx: DraContext, claims: Sequence[KitClaim | ClaimRef], *, version: str | None = None
) -> dict[str, Answer] | str:
    """NodePrepareResources of ``claims``: the answers, or the RPC error's text."""
    refs = [c.ref if isinstance(c, KitClaim) else c for c in claims]
    fresh = [ref[2] for ref in refs if ref[2] not in ctx.learned.before]
    if fresh:  # what was there before: a driver's static devices are not the claim's
        there = ctx.cdi.ids()
        ctx.learned.before.update((uid, there) for uid in fresh)
    try:
        return await ctx.client().prepare(refs, version=version or ctx.learned.version)
    except (aio.AioRpcError, OSError) as exc:
        return f"RPC error: {rpc_text(exc)}"


async def unprepare(ctx: DraContext, claims: Sequence[KitClaim | ClaimRef]) -> dict[str, str] | str:
    """NodeUnprepareResources of ``claims``: the errors by UID, or the RPC error's text."""
    refs = [c.ref if isinstance(c, KitClaim) else c for c in claims]
    try:
        return await ctx.client().unprepare(refs, version=ctx.learned.version)
    except (aio.AioRpcError, OSError) as exc:
        return f"RPC error: {rpc_text(exc)}"


def answer_of(answers: dict[str, Answer] | str, claim: KitClaim | ClaimRef) -> Answer | str:
    """The claim's answer, or what is wrong (an RPC error, no answer for it)."""
    uid = claim.uid if isinstance(claim, KitClaim) else claim[2]
    if isinstance(answers, str):
        return answers
    if uid not in answers:
        return f"no answer for claim {uid} (answered {sorted(answers)})"
    return answers[uid]


def answer_problem(claim: KitClaim, answer: Answer | str, *, names: bool = True) -> str:
    """What is wrong with a successful answer for ``claim`` ("" when right).

    Right: no error; exactly the allocated (pool, device) pairs; with ``names``, each
    under the top-level name of the request it was allocated for.
    """
    if isinstance(answer, str):
        return answer
    if answer.error:
        return f"per-claim error: {answer.error}"
    want = sorted((r.device.pool, r.device.name) for r in claim.requests)
    got = sorted((d.pool, d.device) for d in answer.devices)
    if got != want:
        return f"devices {got}, allocated {want}"
    if names:
        for r in claim.requests:
            for d in answer.devices:
                if (d.pool, d.device) == (r.device.pool, r.device.name) and list(
                    d.request_names
                ) != [r.name]:
                    return f"device {d.device} answered under {list(d.request_names)}, " \
                           f"the claim's request is {r.name!r}"  # fmt: skip
    return ""


def cdi_problems(ctx: DraContext, answers: Sequence[Answer]) -> tuple[str, str]:
    """(what does not resolve, what is invalid) for every CDI ID of ``answers``."""
    unresolved: list[str] = []
    invalid: list[str] = []
    for answer in answers:
        for device in answer.devices:
            for cdi_id in device.cdi_ids:
                found = ctx.cdi.resolve(cdi_id)
                if isinstance(found, str):
                    unresolved.append(found)
                elif found[0].problem:
                    invalid.append(f"{found[0].path.name}: {found[0].problem}")
    return "; ".join(unresolved[:3]), "; ".join(sorted(set(invalid))[:3])


def cdi_ids(answers: Sequence[Answer]) -> set[str]:
    """Every CDI ID of ``answers``."""
    return {i for a in answers for d in a.devices for i in d.cdi_ids}


def own_ids(ctx: DraContext, claim: KitClaim, answer: Answer) -> set[str]:
    """The CDI IDs of ``answer`` that were not in the CDI dir before the claim was first
    prepared: the claim's own (a driver's static devices, as a common spec, outlive it)."""
    return cdi_ids([answer]) - ctx.learned.before.get(claim.uid, set())


async def delete(ctx: DraContext, claim: KitClaim) -> str:
    """Delete the claim from the API server ("" or the error)."""
    try:
        await asyncio.to_thread(ctx.fixtures.delete_claim, claim.ref[1])
    except ApiError as exc:
        return str(exc)
    return ""

"""Pod admission: topology hints, device choice, GetPreferredAllocation, Allocate, PreStart.

Mirrors ``manager.go Allocate/allocateContainerResources/devicesToAllocate/filterByAffinity``,
``topology_hints.go`` (contract.md#allocation, #prestartcontainer, #topology) and the
topology manager's policies (none, best-effort, restricted, single-numa-node) and scopes
(container, pod) on a machine whose NUMA nodes are those the devices report. Sets are
walked in sorted order where the kubelet walks Go maps (unspecified order).
"""

from __future__ import annotations

import heapq
import itertools
import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kubedevice.errors import AdmissionError, PluginRpcError
from kubedevice.kubelet.endpoint import go_error_text
from kubedevice.kubelet.manager import DeviceManager
from kubedevice.kubelet.pods import ContainerSpec, PodSpec

__all__ = ["POLICIES", "SCOPES", "Admitter", "Hint", "StartResult", "pod_device_request"]

log = logging.getLogger(__name__)

#: The kubelet's topology manager refuses machines with more NUMA nodes than this.
MAX_NUMA_NODES = 8
#: ``--topology-manager-policy`` values (the kubelet's default is ``none``).
POLICIES = ("none", "best-effort", "restricted", "single-numa-node")
#: ``--topology-manager-scope`` values.
SCOPES = ("container", "pod")
#: The kubelet's ``TopologyAffinityError`` text.
TOPOLOGY_AFFINITY_MESSAGE = "Resources cannot be allocated with Topology locality"


@dataclass(frozen=True, slots=True)
class Hint:
    """A topology hint: NUMA node set (None = every node) and whether it is preferred."""

    nodes: frozenset[int] | None
    preferred: bool


@dataclass(frozen=True, slots=True)
class StartResult:
    """Outcome of starting one container (PreStartContainer)."""

    started: bool
    error: str | None = None


class _AllocFailed(Exception):
    """The device manager's Allocate error (kubelet text)."""


class Admitter:
    """Admits pods one at a time against a ``DeviceManager``.

    ``policy`` and ``scope`` are one of ``POLICIES`` and ``SCOPES`` (the ``Emulator``
    checks them when it is built, before any ``Admitter`` exists).
    """

    def __init__(
        self, manager: DeviceManager, policy: str = "none", scope: str = "container"
    ) -> None:
        self.m = manager
        self.policy = policy
        self.scope = scope

    # ------------------------------------------------------------------ topology

    def _resource_hints(
        self, resource: str, request: int, reusable: set[str], numa: Sequence[int]
    ) -> list[Hint] | None:
        r = self.m.resources.get(resource)
        if r is None or not any(d.numa for d in r.devices.values()):
            return None  # no topology preference
        available = r.healthy - self.m.allocated.get(resource, set())
        if len(available | reusable) < request:
            return []
        # Count devices per NUMA set once; each mask then only looks at the distinct sets.
        all_sets = Counter(d.numa for d in r.devices.values())
        avail_sets = Counter(r.devices[d].numa for d in available)
        reuse_sets = [r.devices[d].numa for d in reusable if d in r.devices and r.devices[d].numa]
        masks: list[frozenset[int]] = []
        min_size = len(numa)
        for size in range(1, len(numa) + 1):
            for combo in itertools.combinations(numa, size):
                mask = frozenset(combo)
                in_mask = sum(n for s, n in all_sets.items() if mask.intersection(s))
                if in_mask >= request and size < min_size:
                    min_size = size
                if any(not mask.intersection(s) for s in reuse_sets):
                    continue
                matching = len(reuse_sets)
                matching += sum(n for s, n in avail_sets.items() if mask.intersection(s))
                if matching >= request:
                    masks.append(mask)
        return [Hint(m, len(m) == min_size) for m in masks]

    def _numa(self) -> tuple[int, ...]:
        # ids a bitmask cannot hold (negative, >= 64) are not NUMA nodes of any machine
        return tuple(n for n in self.m.numa_nodes() if 0 <= n < 64)

    def _merge(self, hints: dict[str, list[Hint] | None]) -> tuple[Hint | None, bool]:
        """The policy's ``Merge`` over the device manager's hints: (best hint, admit).

        ``hints`` maps each requested resource to its hints (None: no topology preference,
        []: no NUMA combination can satisfy it), like the kubelet's hint provider answer.
        A best hint of None means "no affinity" (the device manager then ignores NUMA).
        """
        numa = self._numa()
        if not numa or len(numa) > MAX_NUMA_NODES:
            return None, True
        all_nodes = frozenset(numa)
        # filterProvidersHints: no preference -> {any, preferred}; none possible ->
        # {any, not preferred}; a provider with no resource at all -> {any, preferred}
        lists = [
            [Hint(None, True)] if hs is None else (hs or [Hint(None, False)])
            for _, hs in sorted(hints.items())
        ] or [[Hint(None, True)]]
        single = self.policy == "single-numa-node"
        if single:  # filterSingleNumaHints: preferred "any" or preferred one-node hints
            lists = [
                [h for h in hs if h.preferred and (h.nodes is None or len(h.nodes) == 1)]
                for hs in lists
            ]
        # HintMerger: BestNonPreferredAffinityCount is the largest of the providers'
        # narrowest hint widths
        best_np = max(
            (
                min(len(h.nodes) for h in hs if h.nodes is not None)
                for hs in lists
                if any(h.nodes is not None for h in hs)
            ),
            default=0,
        )
        best: Hint | None = None
        for combo in itertools.product(*lists):
            affinities = [h.nodes for h in combo if h.nodes is not None]
            mask = all_nodes.intersection(*affinities)
            # mergePermutation: preferred only if every hint is preferred AND all the
            # affinities are equal
            preferred = all(h.preferred for h in combo) and all(
                a == affinities[0] for a in affinities
            )
            best = _compare(best, Hint(mask, preferred), best_np)
        if best is None:
            best = Hint(all_nodes, False)
        if single and best.nodes == all_nodes:
            best = Hint(None, best.preferred)
        return best, self.policy == "best-effort" or best.preferred

    def _hints(
        self, request: Mapping[str, int], reuse: Mapping[str, set[str]]
    ) -> dict[str, list[Hint] | None]:
        """The device manager's ``GetTopologyHints`` (one container's limits, with the
        devices its init containers leave to it) or ``GetPodTopologyHints`` (the pod's
        effective request, nothing to reuse)."""
        numa = self._numa()
        out: dict[str, list[Hint] | None] = {}
        for res, count in sorted(request.items()):
            if count > 0 and res in self.m.resources:
                out[res] = self._resource_hints(res, count, reuse.get(res, set()), numa)
        return out

    # ------------------------------------------------------------------ device choice

    async def _devices_to_allocate(
        self,
        pod: PodSpec,
        c: ContainerSpec,
        resource: str,
        required: int,
        reusable: set[str],
        hint: Hint | None,
    ) -> list[str]:
        m = self.m
        r = m.resources.get(resource)
        if r is None:
            raise _AllocFailed(f"cannot allocate unregistered device {resource}")
        if not r.healthy:
            raise _AllocFailed(
                f"no healthy devices present; cannot allocate unhealthy devices {resource}"
            )
        allocated: list[str] = []
        chosen: set[str] = set()
        needed = required

        def take(devices: set[str]) -> bool:
            # the kubelet takes in Go-map order; the emulator takes the smallest IDs
            nonlocal needed
            if needed > 0:
                for d in heapq.nsmallest(needed, devices - chosen):
                    chosen.add(d)
                    allocated.append(d)
                    needed -= 1
            return needed == 0

        if take(reusable):
            return allocated
        available = r.healthy - m.allocated.get(resource, set())
        if len(available) < needed:
            raise _AllocFailed(
                f"requested number of devices unavailable for {resource}. "
                f"Requested: {needed}, Available: {len(available)}"
            )
        aligned: set[str] = set()
        unaligned: set[str] = set()
        no_topology: set[str] = set()
        if hint is None or hint.nodes is None:
            no_topology = set(available)
        else:
            for d in available:
                numa = r.devices[d].numa
                if not numa:
                    no_topology.add(d)
                elif hint.nodes.intersection(numa):
                    aligned.add(d)
                else:
                    unaligned.add(d)
        if needed < len(aligned):
            preferred = await self._preferred(
                resource, aligned | chosen, set(allocated), required, pod, c
            )
            if take(preferred & aligned):
                return allocated
        if take(aligned):  # always enough when more were aligned than needed
            return allocated
        preferred = await self._preferred(
            resource, available | chosen, set(allocated), required, pod, c
        )
        if take(preferred & available):
            return allocated
        if take(unaligned) or take(no_topology):
            return allocated
        raise _AllocFailed(
            "unexpectedly allocated less resources than required. "
            f"Requested: {required}, Got: {required - needed}"
        )

    async def _preferred(
        self,
        resource: str,
        available: set[str],
        must_include: set[str],
        size: int,
        pod: PodSpec,
        c: ContainerSpec,
    ) -> set[str]:
        r = self.m.resources[resource]
        if not r.options.get_preferred_allocation_available or r.endpoint is None:
            return set()
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "pod %s/%s container %s: GetPreferredAllocation %s available %s "
                "must_include %s size %d",
                pod.namespace,
                pod.name,
                c.name,
                resource,
                ",".join(sorted(available)),
                ",".join(sorted(must_include)),
                size,
            )
        try:
            ids = await r.endpoint.get_preferred_allocation(
                sorted(available), sorted(must_include), size
            )
        except PluginRpcError as exc:
            raise _AllocFailed(
                "device plugin GetPreferredAllocation rpc failed with err: " + go_error_text(exc)
            ) from exc
        return set(ids)

    # ------------------------------------------------------------------ admission

    def _decide(self, who: str, hints: dict[str, list[Hint] | None]) -> Hint | None:
        best, admit = self._merge(hints)
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "topology manager (%s, %s scope) %s: hints %s, best hint %s, admit %s",
                self.policy,
                self.scope,
                who,
                {r: _hints_text(h) for r, h in hints.items()},
                _hint_text(best),
                admit,
            )
        if not admit:
            raise AdmissionError("TopologyAffinityError", TOPOLOGY_AFFINITY_MESSAGE)
        return best

    async def admit(self, pod: PodSpec) -> None:
        """Allocate devices for every container of ``pod``; ``AdmissionError`` on failure."""
        reuse: dict[str, set[str]] = {}
        pod_hint: Hint | None = None
        if self.policy != "none" and self.scope == "pod":
            pod_hint = self._decide(
                f"pod {pod.namespace}/{pod.name}", self._hints(pod_device_request(pod), {})
            )
        try:
            for c in pod.containers:
                if self.policy == "none":
                    hint = None  # the none scope: no hint provider is asked
                elif self.scope == "pod":
                    hint = pod_hint
                else:
                    who = f"pod {pod.namespace}/{pod.name} container {c.name}"
                    hint = self._decide(who, self._hints(c.limits, reuse))
                await self._allocate_container(pod, c, reuse, hint)
                mine = self.m.container_devices(pod.uid, c.name)
                for res, a in mine.items():
                    if c.kind == "init":
                        reuse.setdefault(res, set()).update(a.device_ids)
                    else:
                        reuse.setdefault(res, set()).difference_update(a.device_ids)
        except AdmissionError:
            self.m.remove_pod(pod.uid)  # devices of the containers admitted before
            raise
        except _AllocFailed as exc:
            self.m.remove_pod(pod.uid)
            raise AdmissionError(
                "UnexpectedAdmissionError", f"Allocate failed due to {exc}, which is unexpected"
            ) from None

    async def _allocate_container(
        self, pod: PodSpec, c: ContainerSpec, reuse: dict[str, set[str]], hint: Hint | None
    ) -> None:
        for resource, count in sorted(c.limits.items()):
            if count <= 0:
                continue
            ids = await self._devices_to_allocate(
                pod, c, resource, count, reuse.get(resource, set()), hint
            )
            r = self.m.resources.get(resource)
            ep = r.endpoint if r is not None else None
            if ep is None:
                raise _AllocFailed(f"unknown Device Plugin {resource}")
            try:
                raw = await ep.allocate_raw(ids)
            except PluginRpcError as exc:
                # a stopped endpoint answers with the kubelet's plain errEndpointStopped text
                raise _AllocFailed(exc.details if ep.stopped else go_error_text(exc)) from exc
            if raw is None:
                raise _AllocFailed(
                    "no containers return in allocation response "
                    "&AllocateResponse{ContainerResponses:[]*ContainerAllocateResponse{},}"
                )
            if log.isEnabledFor(logging.DEBUG):
                log.debug(
                    "pod %s/%s container %s: %s chosen %s",
                    pod.namespace,
                    pod.name,
                    c.name,
                    resource,
                    ",".join(ids),
                )
            self.m.add_allocation(pod.uid, c.name, resource, ids, raw)

    async def start_containers(self, pod: PodSpec) -> dict[str, StartResult]:
        """Start every container in order: PreStartContainer where the plugin requires it."""
        out: dict[str, StartResult] = {}
        for c in pod.containers:
            error: str | None = None
            for resource, a in sorted(self.m.container_devices(pod.uid, c.name).items()):
                if c.limits.get(resource, 0) <= 0:
                    continue
                r = self.m.resources.get(resource)
                if r is None or not r.options.pre_start_required:
                    continue
                if r.endpoint is None:
                    error = f"endpoint not found in cache for a registered resource: {resource}"
                    break
                try:
                    await r.endpoint.pre_start(a.device_ids)
                except PluginRpcError as exc:
                    error = "device plugin PreStartContainer rpc failed with err: " + go_error_text(
                        exc
                    )
                    break
            out[c.name] = StartResult(error is None, error)
        return out


def pod_device_request(pod: PodSpec) -> dict[str, int]:
    """The pod's effective limits (``resource.PodLimits``): apps plus sidecars, or the
    largest init container plus the sidecars started before it, whichever is larger."""
    out: dict[str, int] = {}
    resources = {r for c in pod.containers for r in c.limits}
    for res in resources:
        sidecars = init_max = apps = 0
        for c in pod.containers:
            n = c.limits.get(res, 0)
            if c.kind == "sidecar":
                sidecars += n
                init_max = max(init_max, sidecars)
            elif c.kind == "init":
                init_max = max(init_max, sidecars + n)
            else:
                apps += n
        out[res] = max(apps + sidecars, init_max)
    return out


def _hint_text(h: Hint | None) -> str:
    if h is None:
        return "{} (no NUMA nodes)"
    if h.nodes is None:
        return f"{{any {'preferred' if h.preferred else 'not preferred'}}}"
    nodes = ",".join(map(str, sorted(h.nodes)))
    return f"{{{nodes} {'preferred' if h.preferred else 'not preferred'}}}"


def _hints_text(hs: list[Hint] | None) -> str:
    return "no preference" if hs is None else "[" + " ".join(map(_hint_text, hs)) + "]"


def _mask(nodes: frozenset[int] | None) -> int:
    """The topology manager's bitmask of a NUMA node set (bit ``n`` = node ``n``)."""
    return sum(1 << n for n in nodes or ())


def _narrower(a: frozenset[int] | None, b: frozenset[int] | None) -> bool:
    """The kubelet's ``IsNarrowerThan``: fewer NUMA nodes, then the smaller bitmask."""
    an, bn = len(a or ()), len(b or ())
    if an != bn:
        return an < bn
    return _mask(a) < _mask(b)


def _fitter(current: Hint, candidate: Hint) -> Hint:
    if candidate.nodes == current.nodes:
        return current
    return current if _narrower(current.nodes, candidate.nodes) else candidate


def _compare(current: Hint | None, candidate: Hint, best_np: int) -> Hint | None:
    """The kubelet's ``HintMerger.compare`` (best-effort policy, default options)."""
    if not candidate.nodes:
        return current
    if current is None:
        return candidate
    if current.preferred != candidate.preferred:
        return candidate if candidate.preferred else current
    if current.preferred:
        return _fitter(current, candidate)
    # both non-preferred: get as close as possible to best_np without exceeding it
    cur, cand = len(current.nodes or ()), len(candidate.nodes)
    if cur > best_np:
        return _fitter(current, candidate)
    if cur == best_np:
        return current if cand != best_np else _fitter(current, candidate)
    if cand > best_np:
        return current
    if cand == best_np:
        return candidate
    if cand != cur:
        return candidate if cand > cur else current
    return _fitter(current, candidate)

"""The DRA conformance cases: id, MUST/SHOULD/INFO level, title and the upstream behaviour.

Data only, in the order a run reports them; ``docs/conformance.md`` lists the same cases
for people. ``section`` names what the kubelet (or the API server, or a CDI runtime) does
that makes the rule matter.
"""

from __future__ import annotations

from typing import Final

from kubedevice.conformance.catalogue import Case, Level

__all__ = ["AREAS", "DRA_CASES", "DRA_CASES_BY_ID"]

M, S, I = Level.MUST, Level.SHOULD, Level.INFO  # noqa: E741 - I for INFO, as M and S


def _c(case_id: str, level: Level, title: str, section: str) -> Case:
    return Case(case_id, level, title, section, per_resource=False)


DRA_CASES: Final[tuple[Case, ...]] = (
    # registration
    _c("reg-socket", M, "a registration socket appears in plugins_registry/ within 30 s of start",
       "kubelet plugin watcher: watches plugins_registry/ for new sockets"),
    _c("reg-type", M, "GetInfo answers type DRAPlugin",
       "plugin watcher: the handler is chosen by PluginInfo.type"),
    _c("reg-name", M, "GetInfo names the driver: a DNS subdomain of at most 63 characters "
       "(and --expect-driver when given)",
       "DRA manager: the driver name keys its plugins and ResourceSlice.spec.driver"),
    _c("reg-endpoint", M, "GetInfo's endpoint is an absolute path to a socket that answers",
       "DRA manager: dials PluginInfo.endpoint for every call"),
    _c("reg-endpoint-place", S, "the DRA socket lies under the kubelet's plugins/ directory",
       "kubelet: plugins/<driver>/ is the DRA drivers' place (cleaned with the kubelet dir)"),
    _c("reg-versions", M, "supported_versions names v1.DRAPlugin (or v1beta1.DRAPlugin)",
       "DRA manager: refuses a driver without a service it speaks"),
    _c("reg-versions-v1", S, "supported_versions names both v1.DRAPlugin and v1beta1.DRAPlugin",
       "kubelet 1.34+ calls v1; 1.32-1.33 call v1beta1"),
    _c("reg-services-answer", M, "every DRA service named in supported_versions answers an "
       "empty NodePrepareResources", "DRA manager: calls the newest version named"),
    _c("reg-notify", M, "NotifyRegistrationStatus (registered) is answered",
       "plugin watcher: tells the outcome of each registration"),
    _c("reg-refused-survives", S, "after a refused registration the driver stays up and "
       "registers again when asked", "plugin watcher: refuses a driver with an error"),
    _c("reg-kubelet-restart", M, "a restarted kubelet (GetInfo and Notify again on the same "
       "socket) registers the driver again, which keeps serving",
       "kubelet start-up: the plugin watcher re-scans plugins_registry/"),
    # slices
    _c("slices-published", M, "ResourceSlices for the node appear within 30 s of start",
       "scheduler: allocates only devices published in ResourceSlices"),
    _c("slices-published-fast", S, "ResourceSlices appear within 5 s of registration",
       "pods wait for slices after a node starts"),
    _c("slices-node", M, "every slice names the driver, this node (spec.nodeName) and a pool",
       "scheduler: node-local devices are found by spec.nodeName"),
    _c("slices-own-only", M, "no slice for another node or under another driver name",
       "kubelet node authorizer: a node writes only its own slices"),
    _c("slices-pool-consistent", M, "the pool's slices share one generation and their "
       "resourceSliceCount is their number", "scheduler: uses a pool only when it is complete"),
    _c("slices-devices-valid", M, "device names are unique in the pool and valid DNS labels",
       "API server validation; scheduler: a device is (driver, pool, name)"),
    _c("slices-quiet-writes", S, "no slice write in a quiet period (only watches)",
       "API server load: every write wakes every scheduler and controller"),
    _c("slices-quiet-list", S, "no LIST in a quiet period (needs --k8s-bin: read from the "
       "API server's audit log)", "API server load: a LIST is the most expensive read"),
    _c("slices-after-wipe", M, "all the node's slices deleted (the kubelet's start-up wipe): "
       "back within 45 s", "kubelet start-up: deletes the node's ResourceSlices"),
    _c("slices-after-delete", M, "one slice deleted by someone else: back within 45 s",
       "controllers and admins delete slices; the driver owns them"),
    _c("slices-back-fast", S, "after the wipe and the deletion, back within 5 s",
       "pods wait for slices"),
    # prepare
    _c("prepare-basic", M, "a one-device claim is prepared: no error, the allocated "
       "(pool, device) answered", "kubelet: NodePrepareResources before the pod's containers"),
    _c("prepare-request-names", M, "each device is answered under the claim's request name",
       "kubelet: gives a container the CDI IDs of the requests it names"),
    _c("prepare-subrequest", M, "a firstAvailable claim's device is answered under the "
       "top-level request name, not request/subrequest",
       "kubelet: containers name top-level requests only"),
    _c("prepare-multi-request", M, "a two-request claim: each device under its own request",
       "kubelet: per-request CDI IDs for containers"),
    _c("prepare-cdi-resolves", M, "every CDI ID answered has a spec in the CDI dir with that "
       "device", "container runtime: an unresolvable CDI ID fails the container"),
    _c("prepare-cdi-valid", M, "every spec is valid CDI: cdiVersion, kind, named devices with "
       "edits, device nodes that exist", "container runtime: refuses invalid specs"),
    _c("prepare-idempotent", M, "the same call again answers the same",
       "kubelet: calls again after a restart or a retry"),
    _c("prepare-v1beta1", M, "where v1beta1 is offered, it answers the same as v1",
       "kubelet 1.32-1.33 call v1beta1"),
    _c("prepare-batch", M, "8 claims in one call (as many as there are devices) are all "
       "prepared", "kubelet: one call per pod with all its claims"),
    _c("prepare-missing-claim", M, "a claim missing from the API server is a per-claim error, "
       "not an RPC error; the other claims of the call are prepared",
       "kubelet: reads per-claim errors; an RPC error fails every claim of the pod"),
    _c("prepare-uid-mismatch", M, "a claim whose UID differs from the API server's is a "
       "per-claim error", "kubelet: a claim deleted and made again has a new UID"),
    _c("prepare-unallocated", M, "a claim without an allocation is a per-claim error",
       "a claim is prepared only once allocated"),
    _c("prepare-double-allocation", M, "a device allocated to two unrelated claims is refused "
       "for the second", "scheduler: never does this; a stale allocation can"),
    _c("prepare-admin-access", S, "an admin-access claim of a device already prepared is "
       "prepared", "DRAAdminAccess: monitoring claims share a device"),
    _c("prepare-foreign-config", M, "an opaque config for another driver is ignored",
       "allocation config lists every driver's configs; each driver reads its own"),
    _c("prepare-own-config", S, "the claim's opaque config (--claim-config) for one request is "
       "accepted", "allocation.devices.config: per-request driver parameters"),
    # unprepare
    _c("unprepare-removes", M, "unprepare answers no error and removes the claim's CDI devices",
       "kubelet: NodeUnprepareResources after the pod's containers are gone"),
    _c("unprepare-idempotent", M, "unprepare again answers no error",
       "kubelet: calls again after a restart or a retry"),
    _c("unprepare-unknown", M, "unprepare of a claim never prepared answers no error",
       "kubelet: unprepares what its checkpoint names, prepared or not"),
    _c("unprepare-deleted-claim", M, "unprepare of a prepared claim gone from the API server "
       "succeeds", "kubelet: unprepares after the claim was deleted"),
    _c("prepare-again", M, "a claim unprepared is prepared again",
       "a pod restarted on the node"),
    # deadlines
    _c("deadline-prepare-retry", M, "a prepare cut off by its deadline and retried leaves one "
       "prepared result: same devices, one set of CDI devices",
       "kubelet: cancels at its deadline and retries the pod"),
    _c("deadline-unprepare-retry", M, "an unprepare cut off and retried leaves nothing behind",
       "kubelet: retries unprepare until it succeeds"),
    _c("deadline-overlap", M, "slowed by the driver's own knob (--slow-env), a prepare cut off "
       "halfway and retried while the first still runs leaves one result",
       "kubelet: retries a pod at once after its deadline; the driver may still be working"),
    _c("deadline-within", M, "every call was answered within the kubelet's 45 s",
       "kubelet: NodePrepareResources deadline"),
    # restarts
    _c("restart-reregisters", M, "after SIGKILL and a new start, registers within 30 s",
       "DaemonSet restarts a crashed driver"),
    _c("restart-same-answer", M, "after SIGKILL and a new start, prepared claims are answered "
       "the same", "kubelet: prepares again after a driver restart; containers keep their IDs"),
    _c("restart-unprepare", M, "after a restart, a claim prepared before is unprepared and its "
       "CDI devices removed", "kubelet: unprepares claims of pods gone meanwhile"),
    _c("reboot-specs-back", M, "after a reboot (CDI dir wiped, driver started again), every "
       "answer's CDI IDs have specs again", "node reboot: a tmpfs CDI dir is empty"),
    _c("upgrade-side-by-side", S, "a second instance with another pod UID beside the first: "
       "no failed call while the first stops ({pod_uid} in the command)",
       "DaemonSet rolling update with maxSurge (seamless upgrade)"),
    # health
    _c("health-stream", S, "NodeWatchResources streams a first message within 5 s",
       "kubelet 1.34+: DRAResourceHealth feeds pod status"),
    _c("health-all-devices", S, "the health stream names every published device",
       "kubelet: a device not reported is Unknown in the pod status"),
    _c("health-per-connection", S, "two streams at once are both served",
       "kubelet: a stream per connection, opened again after an error"),
    _c("health-reconnect", S, "after a driver restart a new stream is served",
       "kubelet: reconnects when the stream ends"),
    # sigterm
    _c("sigterm-sockets", M, "SIGTERM: the registration and DRA sockets are removed",
       "plugin watcher: a stale socket is dialled again and again"),
    _c("sigterm-exit", M, "SIGTERM: exit within 30 s", "kubelet: terminationGracePeriodSeconds"),
    _c("sigterm-exit-fast", S, "SIGTERM: exit status 0 within 5 s",
       "DaemonSet updates wait for the old pod"),
    # cost (reported, never judged)
    _c("cost-rss", I, "resident memory after the run's calls", "node overhead"),
    _c("cost-idle-cpu", I, "CPU used in the quiet period", "node overhead"),
    _c("cost-prepare-latency", I, "NodePrepareResources p50/p99 of the run's one-claim calls",
       "pod start-up latency"),
    _c("cost-start-to-slices", I, "start to the first slice", "node start-up"),
    _c("cost-sigterm-exit", I, "SIGTERM to exit", "rolling updates"),
)  # fmt: skip

DRA_CASES_BY_ID: Final = {case.id: case for case in DRA_CASES}

#: The areas, by case id prefix, in the report's order (docs/conformance.md groups by them).
AREAS: Final = (
    "reg",
    "slices",
    "prepare",
    "unprepare",
    "deadline",
    "restart",
    "reboot",
    "upgrade",
    "health",
    "sigterm",
    "cost",
)

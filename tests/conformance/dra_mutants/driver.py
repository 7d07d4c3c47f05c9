"""A small DRA driver on ``kubedevice.dra``, and its deliberately broken variants (mutants).

    python driver.py [--mutant NAME] --node-name NODE --kubelet-dir DIR --cdi-dir DIR ...
    (or KD_DRA_MUTANT=NAME; the other flags are ``kubedevice.dra``'s own)

:class:`Widgets` is the unbroken driver: sixteen widgets, each prepared with its own env var
and device node. Each entry of :data:`MUTANTS` reintroduces one bug class that DRA drivers
have shipped, as one small override, and names the conformance case that must catch it.
A bug a driver author can write with the public API (a hook, a signal handler) is written
so; a bug that the kit itself prevents (answers under subrequest names, a device given to
two claims, ...) is injected below the public API by wrapping or subclassing a kit class
here, in this process only: the kit's sources are never changed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubedevice.dra as dra

log = logging.getLogger("widgets")

DRIVER_NAME = "widget.example.com"
WIDGETS = 16
ENV_MUTANT = "KD_DRA_MUTANT"


class Widgets(dra.Driver):
    """The unbroken driver: ``widget-0``..``widget-15``, each a device node and an env var."""

    driver_name = DRIVER_NAME

    def __init__(self, cdi_dir: Path) -> None:
        self.cdi_dir = cdi_dir

    def host_node(self, index: int) -> str:
        """The host device node a widget's containers get."""
        return "/dev/null"

    async def devices(self) -> AsyncIterator[Sequence[dra.Device]]:
        yield [
            dra.Device(name=f"widget-{i}", attributes={"index": i, "model": "widget"})
            for i in range(WIDGETS)
        ]

    async def prepare(self, claim: dra.Claim) -> Sequence[dra.PreparedDevice]:
        prepared = []
        for allocated in claim.devices:
            if allocated.device is None:
                raise dra.ClaimError(f"{allocated.name} is gone")
            index = int(allocated.name.rsplit("-", 1)[1])
            node = dra.DeviceNode(f"/dev/widget{index}", host_path=self.host_node(index))
            edits = dra.ContainerEdits(env={"WIDGET": str(index)}, device_nodes=[node])
            prepared.append(dra.PreparedDevice(allocated, edits))
        return prepared


# ---- the mutants ------------------------------------------------------------------------


@dataclass(frozen=True)
class Mutant:
    """One bug: the case that must fail on it, what it is, and how it is put in."""

    case: str
    bug: str
    apply: Callable[[Widgets], None]


MUTANTS: dict[str, Mutant] = {}


def mutant(name: str, case: str, bug: str) -> Callable[[Callable[[Widgets], None]], None]:
    """Register the decorated function as mutant ``name``, caught by ``case``."""

    def register(apply: Callable[[Widgets], None]) -> None:
        MUTANTS[name] = Mutant(case, bug, apply)

    return register


def _patch(owner: Any, name: str, new: Any) -> Any:
    """Replace ``owner.name`` with ``new``; the old value. A name the kit no longer has stops
    the mutant at once (a mutant that silently stopped being broken would prove nothing)."""
    if not hasattr(owner, name):
        raise SystemExit(f"mutant: {getattr(owner, '__name__', owner)} has no {name} any more")
    old = getattr(owner, name)
    setattr(owner, name, new)
    return old


def _service() -> Any:
    import kubedevice.dra.node.service as service

    return service


def _server() -> Any:
    import kubedevice.dra.node.server as server

    return server


@mutant(
    "subrequest-names",
    "prepare-subrequest",
    "a firstAvailable device answered under 'req/sub', not the claim's request 'req'",
)
def _subrequest_names(driver: Widgets) -> None:
    def full_names(prepared: Any) -> Any:
        out = answer(prepared)
        for entry, (request, _pool, _device) in zip(out.devices, prepared.devices, strict=True):
            entry.request_names[:] = [request]
        return out

    answer = _patch(_service(), "_answer", full_names)


@mutant(
    "reboot-no-spec",
    "reboot-specs-back",
    "after a reboot (CDI dir emptied) claims are answered from the checkpoint, specs not "
    "written again",
)
def _reboot_no_spec(driver: Widgets) -> None:
    async def never_rewritten(self: Any, *args: Any, **kwargs: Any) -> bool:
        return False

    _patch(_service().ClaimService, "_ensure_spec", never_rewritten)


@mutant(
    "double-prepare",
    "prepare-double-allocation",
    "a device prepared for one claim is prepared for an unrelated second claim",
)
def _double_prepare(driver: Widgets) -> None:
    def forgetful(claim: Any, **kwargs: Any) -> None:
        check(claim, **{**kwargs, "held": ()})  # does not look at what other claims hold

    check = _patch(_service(), "check_claim", forgetful)


@mutant(
    "missing-claim-rpc-error",
    "prepare-missing-claim",
    "a claim missing from the API server fails the whole call (an RPC error)",
)
def _missing_claim_rpc_error(driver: Widgets) -> None:
    async def read_all_first(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        for claim in request.claims:  # `if err != nil { return nil, err }`
            await self.kube.get_claim(claim.namespace, claim.name)
        return await prepare(self, request, *args, **kwargs)

    prepare = _patch(_service().ClaimService, "prepare", read_all_first)


@mutant(
    "claim-by-name",
    "prepare-uid-mismatch",
    "a claim is known by namespace/name, not UID: a claim made again under the same name "
    "gets the old claim's answer",
)
def _claim_by_name(driver: Widgets) -> None:
    service = _service()

    async def by_name(self: Any, raw: Any, *args: Any, **kwargs: Any) -> Any:
        for prepared in self.checkpoint.claims.values():
            if (prepared.ref.namespace, prepared.ref.name) == (raw.namespace, raw.name):
                return service._answer(prepared)
        return await prepare_one(self, raw, *args, **kwargs)

    prepare_one = _patch(service.ClaimService, "_prepare_one", by_name)


@mutant(
    "prepare-not-idempotent",
    "prepare-idempotent",
    "the same prepare again prepares anew, under new CDI device names",
)
def _prepare_not_idempotent(driver: Widgets) -> None:
    cls = _service().ClaimService

    async def anew(self: Any, prepared: Any, *args: Any, **kwargs: Any) -> Any:
        return await self._prepare_new(prepared.ref)

    def fresh_names(self: Any, ref: Any, prepared: Any, *args: Any, **kwargs: Any) -> Any:
        done = record(self, ref, prepared, *args, **kwargs)
        suffix = uuid.uuid4().hex[:6]
        ids = tuple(tuple(f"{i}-{suffix}" for i in group) for group in done.cdi_ids)
        return dataclasses.replace(done, cdi_ids=ids)

    _patch(cls, "_answer_again", anew)
    record = _patch(cls, "_record", fresh_names)


@mutant(
    "unprepare-not-idempotent",
    "unprepare-idempotent",
    "a second unprepare of a claim it already unprepared is an error",
)
def _unprepare_not_idempotent(driver: Widgets) -> None:
    done: set[str] = set()

    async def once_only(self: Any, raw: Any, *args: Any, **kwargs: Any) -> str:
        if raw.uid in done:
            return f"claim {raw.uid} is not prepared"
        error: str = await unprepare_one(self, raw, *args, **kwargs)
        if not error:
            done.add(raw.uid)
        return error

    unprepare_one = _patch(_service().ClaimService, "_unprepare_one", once_only)


@mutant(
    "unprepare-leaves-spec",
    "unprepare-removes",
    "unprepare forgets the claim but leaves its CDI spec",
)
def _unprepare_leaves_spec(driver: Widgets) -> None:
    import kubedevice.dra.state.cdi as cdi

    def kept(self: Any, *args: Any, **kwargs: Any) -> bool:
        return False

    _patch(cdi.CdiWriter, "remove", kept)


@mutant(
    "missing-device-node",
    "prepare-cdi-valid",
    "the CDI spec names a host device node that does not exist",
)
def _missing_device_node(driver: Widgets) -> None:
    _patch(driver, "host_node", lambda index: f"/dev/kd-widget-missing{index}")


@mutant(
    "cutoff-two-results",
    "deadline-prepare-retry",
    "a prepare cut off by the kubelet's deadline stops halfway and leaves the CDI spec it "
    "had begun; the retry prepares again and writes another",
)
def _cutoff_two_results(driver: Widgets) -> None:
    from kubedevice.dra.node.inflight import InFlight

    async def with_the_call(self: Any, work: Any, *args: Any, **kwargs: Any) -> Any:
        return await work  # the call's cancellation cancels the work itself

    _patch(InFlight, "run", with_the_call)

    async def staged(claim: dra.Claim) -> Sequence[dra.PreparedDevice]:
        staging = driver.cdi_dir / f"widget-staging-{uuid.uuid4().hex[:8]}.json"
        spec = {
            "cdiVersion": "0.5.0",
            "kind": "widget.example.com/staging",
            "devices": [{"name": f"{claim.ref.uid}-{staging.stem[-8:]}",
                         "containerEdits": {"env": ["WIDGET_STAGING=1"]}}],
        }  # fmt: skip
        staging.write_text(json.dumps(spec))
        await asyncio.sleep(0.3)  # the slow part of a real prepare
        out = await prepare(claim)
        staging.unlink()  # only when not cut off
        return out

    prepare = _patch(driver, "prepare", staged)


@mutant(
    "slices-rewritten",
    "slices-quiet-writes",
    "the ResourceSlices are written again on every resync, changed or not",
)
def _slices_rewritten(driver: Widgets) -> None:
    server = _server()

    class Rewriting(server.SlicePublisher):
        resync_due = False

        def _unchanged(self, *args: Any) -> bool:
            return not self.resync_due and bool(super()._unchanged(*args))

        async def reconcile(self, devices: Sequence[dra.Device]) -> None:
            await super().reconcile(devices)
            self.resync_due = False

        async def run(self) -> None:
            async def resync() -> None:
                while True:
                    await asyncio.sleep(1.0)
                    self.resync_due = True  # the slices are replaced, changed or not
                    self._dirty.set()

            ticker = asyncio.create_task(resync())
            try:
                await super().run()
            finally:
                ticker.cancel()

    _patch(server, "SlicePublisher", Rewriting)


@mutant(
    "slices-not-restored",
    "slices-after-wipe",
    "slices deleted by someone else (the kubelet's start-up wipe) are not published again",
)
def _slices_not_restored(driver: Widgets) -> None:
    server = _server()

    class Deaf(server.SlicePublisher):
        def _on_event(self, kind: str, version: str) -> None:
            pass

    _patch(server, "SlicePublisher", Deaf)


@mutant(
    "foreign-node-slice",
    "slices-own-only",
    "a ResourceSlice is published for another node (a stale node name) besides its own",
)
def _foreign_node_slice(driver: Widgets) -> None:
    server = _server()

    class Stray(server.SlicePublisher):
        stray = False

        async def reconcile(self, devices: Sequence[dra.Device]) -> None:
            if not self.stray:
                other = f"{self.node}-old"
                await self.kube.create_slice({
                    "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                    "metadata": {"generateName": f"{other}-{self.driver}-"},
                    "spec": {"driver": self.driver, "nodeName": other,
                             "pool": {"name": other, "generation": 1, "resourceSliceCount": 1},
                             "devices": [{"name": "widget-0"}]},
                })  # fmt: skip
                self.stray = True
            await super().reconcile(devices)

    _patch(server, "SlicePublisher", Stray)


@mutant(
    "sockets-left",
    "sigterm-sockets",
    "at SIGTERM the gRPC servers stop but their socket files stay",
)
def _sockets_left(driver: Widgets) -> None:
    import kubedevice.dra.node.sockets as sockets

    async def stop_only(self: Any, *args: Any, **kwargs: Any) -> None:
        server, self._server, self._bound = self._server, None, None
        if server is not None:
            await server.stop(*args, **kwargs)

    _patch(sockets.UnixGrpcServer, "stop", stop_only)


@mutant("sigterm-ignored", "sigterm-exit", "SIGTERM is caught and logged, and the driver goes on")
def _sigterm_ignored(driver: Widgets) -> None:
    import kubedevice.dra.runner as runner

    @contextlib.contextmanager
    def ignored(stop: asyncio.Event) -> Iterator[None]:
        import signal

        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, lambda: log.info("SIGTERM: busy, later"))
        yield

    _patch(runner, "stop_on_signals", ignored)


@mutant(
    "getinfo-wrong-type",
    "reg-type",
    "GetInfo answers type 'CSIPlugin' (a copy-paste from a CSI driver)",
)
def _getinfo_wrong_type(driver: Widgets) -> None:
    import kubedevice.dra.node.registration as registration

    _patch(registration, "DRA_PLUGIN_TYPE", "CSIPlugin")


@mutant(
    "getinfo-wrong-versions",
    "reg-versions",
    "supported_versions names only an old service ('1.0.0') the kubelet does not speak",
)
def _getinfo_wrong_versions(driver: Widgets) -> None:
    _patch(_server(), "supported_versions", lambda *, health: ("1.0.0",))


@mutant("health-partial", "health-all-devices", "the health stream leaves out the last device")
def _health_partial(driver: Widgets) -> None:
    from kubedevice.dra.node.health import HealthService

    async def all_but_last(self: Any, devices: Sequence[dra.Device]) -> None:
        await update(self, list(devices)[:-1])

    update = _patch(HealthService, "update", all_but_last)


# ---- main -------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """Run the driver, or the mutant named by ``--mutant`` / ``$KD_DRA_MUTANT``."""
    parser = dra.argument_parser("A small DRA driver and its deliberately broken variants.")
    parser.add_argument(
        "--mutant",
        default=os.environ.get(ENV_MUTANT, ""),
        metavar="NAME",
        help=f"the bug to put in: {', '.join(MUTANTS)}  [env var: {ENV_MUTANT}]",
    )
    args: argparse.Namespace = parser.parse_args(argv)
    driver = Widgets(args.cdi_dir)
    if args.mutant:
        if args.mutant not in MUTANTS:
            parser.error(f"--mutant {args.mutant!r}: choose one of {', '.join(MUTANTS)}")
        MUTANTS[args.mutant].apply(driver)
        log.warning("mutant %s: %s", args.mutant, MUTANTS[args.mutant].bug)
    return dra.main(driver, args=args)


if __name__ == "__main__":
    raise SystemExit(main())

"""A small, independent device plugin for the conformance kit's tests; each flag breaks one thing.

Written with raw ``grpc.aio`` and ``kubedevice._api`` only (never the SDK), so the kit is
proven against a plugin that shares no code with ours. Without flags it follows the contract:
it serves before it registers, sends a full device list at once, refuses unknown and
unhealthy IDs, re-registers when its socket is deleted (kubelet restart) or when the kubelet
drops its ListAndWatch stream, and exits 0 on SIGTERM after removing its sockets.

Run: ``python fixture_plugin.py --device-plugin-dir DIR [--resource NAME ...] [--break-flag]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
from asyncinotify import Inotify, Mask

from kubedevice._api import (
    ENV_DEVICE_PLUGIN_DIR,
    HEALTHY,
    KUBELET_SOCKET,
    UNHEALTHY,
    VERSION,
    dp,
    dp_grpc,
)

#: Each flag breaks exactly one rule; the conformance test maps flag -> case that must fail.
BREAK_FLAGS = (
    "register-before-serve",
    "bad-version",
    "absolute-endpoint",
    "no-first-list",
    "duplicate-ids",
    "lowercase-health",
    "empty-allocate-response",
    "bad-device-spec",
    "accept-unknown-ids",
    "accept-unhealthy-ids",
    "lying-options",
    "bad-preferred",
    "no-reregister",
    "slow-reregister",
    "die-on-stream-kill",
    "no-stream-recovery",
    "ignore-sigterm",
    "leave-socket",
    "raising-preferred",
    "orphan-child",
    "setsid-child",
)


def _log(msg: str) -> None:
    print(f"{time.monotonic():.3f} fixture: {msg}", file=sys.stderr, flush=True)


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--device-plugin-dir", default=os.environ.get(ENV_DEVICE_PLUGIN_DIR))
    p.add_argument("--resource", action="append", default=[], help="repeatable")
    p.add_argument("--devices", type=int, default=4)
    p.add_argument("--unhealthy", type=int, default=1, help="how many of the last devices")
    p.add_argument("--no-gpa", action="store_true", help="do not advertise GetPreferredAllocation")
    p.add_argument("--no-prestart", action="store_true", help="do not require PreStartContainer")
    for flag in BREAK_FLAGS:
        p.add_argument(f"--{flag}", action="store_true")
    ns = p.parse_args(argv)
    if not ns.device_plugin_dir:
        p.error(f"--device-plugin-dir or ${ENV_DEVICE_PLUGIN_DIR} is required")
    if not ns.resource:
        ns.resource = ["example.com/fixture"]
    return ns


class Resource(dp_grpc.DevicePluginServicer):
    """One resource: its own socket, server and registration state."""

    def __init__(self, args: argparse.Namespace, name: str, index: int) -> None:
        self.args = args
        self.name = name
        self.dir = Path(args.device_plugin_dir)
        self.sock_name = f"kdfix-{index}.sock"
        self.sock_path = self.dir / self.sock_name
        self.server: grpc.aio.Server | None = None
        self.kick = asyncio.Event()
        self.registered = False
        #: Set while registering: the next ListAndWatch stream is the kubelet's own.
        self.expect_kubelet_stream = False
        n, bad = args.devices, min(args.unhealthy, args.devices)
        health = HEALTHY.lower() if args.lowercase_health else HEALTHY
        self.devices = [(f"dev-{i}", UNHEALTHY if i >= n - bad else health) for i in range(n)]
        if args.duplicate_ids and n:
            self.devices.append(self.devices[0])

    # --- DevicePlugin service -------------------------------------------------------------
    def _options(self) -> dp.DevicePluginOptions:
        return dp.DevicePluginOptions(
            pre_start_required=not self.args.no_prestart,
            get_preferred_allocation_available=not self.args.no_gpa,
        )

    async def GetDevicePluginOptions(self, request, context):  # type: ignore[no-untyped-def]
        return self._options()

    async def ListAndWatch(self, request, context) -> AsyncIterator[dp.ListAndWatchResponse]:  # type: ignore[no-untyped-def]
        kubelets = self.expect_kubelet_stream
        self.expect_kubelet_stream = False
        try:
            if not self.args.no_first_list:
                yield dp.ListAndWatchResponse(
                    devices=[dp.Device(ID=i, health=h) for i, h in self.devices]
                )
            await asyncio.Future()  # keep the stream open until the kubelet drops it
        except asyncio.CancelledError:
            _log(f"{self.name}: ListAndWatch stream cancelled (kubelet's: {kubelets})")
            if STOPPING.is_set() or not kubelets:
                raise
            if self.args.die_on_stream_kill:
                os._exit(1)
            if not (self.args.no_reregister or self.args.no_stream_recovery):
                self.registered = False
                self.kick.set()
            raise

    def _check_ids(self, ids: list[str], context: grpc.aio.ServicerContext) -> str | None:  # type: ignore[type-arg]
        known = dict(self.devices)
        for i in ids:
            if i not in known and not self.args.accept_unknown_ids:
                return f"unknown device {i!r}"
            if known.get(i, HEALTHY) != HEALTHY and not self.args.accept_unhealthy_ids:
                return f"device {i!r} is unhealthy"
        return None

    async def Allocate(self, request, context):  # type: ignore[no-untyped-def]
        if self.args.empty_allocate_response:
            return dp.AllocateResponse()
        out = dp.AllocateResponse()
        for creq in request.container_requests:
            ids = list(creq.devices_ids)
            err = self._check_ids(ids, context)
            if err:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, err)
            cresp = out.container_responses.add()
            cresp.envs["FIXTURE_DEVICES"] = ",".join(ids)
            for i in ids:
                spec = cresp.devices.add()
                spec.container_path = f"dev/{i}" if self.args.bad_device_spec else f"/dev/{i}"
                spec.host_path = "/dev/null"
                spec.permissions = "rwx" if self.args.bad_device_spec else "rw"
            mount = cresp.mounts.add()
            mount.container_path, mount.host_path, mount.read_only = "/opt/fx", "/tmp", True
        return out

    async def GetPreferredAllocation(self, request, context):  # type: ignore[no-untyped-def]
        if self.args.no_gpa:
            _log("UNADVERTISED RPC CALLED: GetPreferredAllocation")
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "not advertised")
        if self.args.lying_options:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "not implemented")
        out = dp.PreferredAllocationResponse()
        for creq in request.container_requests:
            avail, must = list(creq.available_deviceIDs), list(creq.must_include_deviceIDs)
            if self.args.bad_preferred:
                chosen = ["not-offered", *avail][: max(1, creq.allocation_size - 1)]
            elif self.args.raising_preferred:
                # like an SDK whose hook raised: log the error, answer a valid default
                try:
                    raise KeyError("numa map")
                except KeyError:
                    logging.exception("preferred_allocation hook failed; using the default")
                chosen = (must + [i for i in avail if i not in must])[: creq.allocation_size]
            else:
                chosen = must + [i for i in avail if i not in must]
                chosen = chosen[: creq.allocation_size]
            out.container_responses.add().deviceIDs.extend(chosen)
        return out

    async def PreStartContainer(self, request, context):  # type: ignore[no-untyped-def]
        if self.args.no_prestart:
            _log("UNADVERTISED RPC CALLED: PreStartContainer")
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "not advertised")
        return dp.PreStartContainerResponse()

    # --- lifecycle --------------------------------------------------------------------------
    async def serve(self) -> None:
        await self.stop_server()
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISSOCK(self.sock_path.lstat().st_mode):
                self.sock_path.unlink()
        server = grpc.aio.server()
        dp_grpc.add_DevicePluginServicer_to_server(self, server)
        server.add_insecure_port(f"unix://{self.sock_path}")
        await server.start()
        _log(f"{self.name}: serving {self.sock_path.name}")
        self.sock_path.chmod(0o600)
        self.server = server

    async def stop_server(self) -> None:
        if self.server is not None:
            server, self.server = self.server, None
            await server.stop(0)

    async def register(self) -> None:
        endpoint = str(self.sock_path) if self.args.absolute_endpoint else self.sock_name
        req = dp.RegisterRequest(
            version="v1alpha1" if self.args.bad_version else VERSION,
            endpoint=endpoint,
            resource_name=self.name,
            options=self._options(),
        )
        _log(f"{self.name}: registering {endpoint}")
        self.expect_kubelet_stream = True
        try:
            # A local subchannel pool: a shared one would stay in connect backoff (about
            # 1 s) after a failed try, even once the new kubelet.sock is there.
            target = f"unix://{self.dir / KUBELET_SOCKET}"
            opts = [("grpc.use_local_subchannel_pool", 1)]
            async with grpc.aio.insecure_channel(target, options=opts) as ch:
                await dp_grpc.RegistrationStub(ch).Register(req, timeout=12)
        except grpc.aio.AioRpcError as exc:
            _log(f"{self.name}: Register failed: {exc.code().name} {exc.details()}")
            raise
        _log(f"{self.name}: registered")
        self.registered = True

    async def supervise(self, first: bool) -> None:
        """Serve and register; again whenever kicked (socket deleted, stream dropped)."""
        if first and self.args.register_before_serve:
            reg = asyncio.create_task(self.register())
            # Deliberately late: this mode exists to be caught registering before serving.
            await asyncio.sleep(0.5)
            await self.serve()
            with contextlib.suppress(grpc.aio.AioRpcError):
                await reg
        else:
            self.kick.set()
        while True:
            await self.kick.wait()
            self.kick.clear()
            if self.args.slow_reregister and not first:
                await asyncio.sleep(1.5)  # deliberately slow (the mode under test)
            first = False
            if self.server is None or not self.sock_path.exists():
                await self.serve()
            reg = asyncio.create_task(self.register())
            kicked = asyncio.create_task(self.kick.wait())
            done, _ = await asyncio.wait({reg, kicked}, return_when=asyncio.FIRST_COMPLETED)
            kicked.cancel()
            if reg not in done:
                reg.cancel()  # a newer reason to register arrived; start over
                continue
            if reg.exception() is not None and not self.kick.is_set():
                # Kubelet not there yet: retry when kubelet.sock appears, or shortly.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.kick.wait(), 0.25)
                self.kick.set()


STOPPING = asyncio.Event()


async def _watch_dir(resources: list[Resource], args: argparse.Namespace) -> None:
    with Inotify() as inotify:
        inotify.add_watch(args.device_plugin_dir, Mask.CREATE | Mask.DELETE)
        async for event in inotify:
            name = str(event.name) if event.name is not None else ""
            _log(f"inotify {event.mask!r} {name}")
            for res in resources:
                if event.mask & Mask.DELETE and name == res.sock_name and res.server is not None:
                    res.registered = False
                    if not args.no_reregister:
                        res.kick.set()
                created = event.mask & Mask.CREATE and name == KUBELET_SOCKET
                if created and not res.registered and not args.no_reregister:
                    res.kick.set()


async def _main(args: argparse.Namespace) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    resources = [Resource(args, name, i) for i, name in enumerate(args.resource)]
    if args.orphan_child:  # a background helper it never stops: left behind on SIGTERM
        child = subprocess.Popen(
            [sys.executable, "-c", "import signal; signal.pause()"],
            stdin=subprocess.DEVNULL,
        )
        _log(f"CHILD {child.pid}")
    if args.setsid_child:  # the same, in a session of its own (out of the plugin's group)
        child = subprocess.Popen(
            [sys.executable, "-c", "import signal; signal.pause()"],
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        _log(f"CHILD {child.pid}")
    async with asyncio.TaskGroup() as tg:
        tasks = [tg.create_task(_watch_dir(resources, args))]
        tasks += [tg.create_task(r.supervise(first=True)) for r in resources]
        await stop.wait()
        STOPPING.set()
        if args.leave_socket:
            os._exit(0)
        for t in tasks:
            t.cancel()
    for res in resources:
        await res.stop_server()
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISSOCK(res.sock_path.lstat().st_mode):
                res.sock_path.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(_main(_parse(sys.argv[1:]))))

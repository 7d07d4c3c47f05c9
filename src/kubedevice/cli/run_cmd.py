"""``kubedevice run`` (the generic /dev plugin daemon) and ``kubedevice validate`` (check a config).

No logic here: options are parsed, :mod:`kubedevice.generic` does the work, and
:class:`~kubedevice.errors.ConfigError` becomes exit status 2 with the error on stderr.
"""

from __future__ import annotations

import asyncio
import sys
from importlib import import_module
from pathlib import Path
from typing import NoReturn

import click

from kubedevice.cli.dra_options import (
    PRINT_DEVICE_CLASSES,
    cleanup_only_driver,
    dra_options,
    driver_options,
    print_classes,
    refuse_with_dra,
    run_driver,
)
from kubedevice.cli.fastexit import end_process_after_stop
from kubedevice.cli.options import (
    DEFAULT_CDI_DIR,
    device_plugin_dir_option,
    metrics_address_option,
    root_options,
)
from kubedevice.errors import ConfigError, KubeDeviceError
from kubedevice.signals import stop_on_signals

__all__ = ["COMMANDS"]


def _fail(message: str) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    raise SystemExit(2) from None


def _need_generic(*, daemon: bool) -> None:
    """Exit 2 with one line when the generic plugin cannot run here (not Linux).

    Imports :mod:`kubedevice.generic` lazily: the other commands never load its modules.
    """
    if daemon and not sys.platform.startswith("linux"):
        _fail(f"kubedevice run needs Linux (inotify); this is {sys.platform}")
    try:
        import_module("kubedevice.generic.runner" if daemon else "kubedevice.generic.config")
    except ImportError as exc:
        _fail(f"the generic plugin cannot be loaded here: {exc}")


_CONFIG = click.option(
    "--config",
    "-c",
    "config",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="YAML config file (version: v1).",
)


@click.command("run")
@_CONFIG
@device_plugin_dir_option()
@metrics_address_option()
@root_options(lambda key: key, driver=False)
@click.option(
    "--dra",
    is_flag=True,
    help="Run as a DRA driver instead: the devices published as ResourceSlices of the "
    "driver --driver-name, prepared per ResourceClaim (Kubernetes 1.34+).",
)
@dra_options("dev.kubedevice.io", cdi_default=DEFAULT_CDI_DIR)
@PRINT_DEVICE_CLASSES
def run_command(
    config: Path,
    device_plugin_dir: str,
    metrics_address: str | None,
    dev_root: str | None,
    sys_root: str | None,
    dra: bool,
    driver_name: str,
    node_name: str | None,
    pod_uid: str | None,
    kubelet_dir: Path,
    cdi_dir: Path | None,
    kubeconfig: Path | None,
    api_timeout: float,
    stop_grace: float,
    no_health: bool,
    evict_on: tuple[str, ...],
    cleanup: bool,
    print_device_classes: bool,
) -> None:
    """Run the generic device plugin for every resource in a config file.

    Hot-plug is event-driven (inotify); SIGHUP or a change to the file reloads the config
    (an invalid new config is rejected and the old one keeps running); SIGTERM or SIGINT
    stops cleanly with status 0. With --dra, the same devices are served as a DRA driver
    (the --driver-name ... --cleanup options apply only then; --device-plugin-dir is
    refused): SIGHUP reloads the config all or nothing (a valid one
    restarts the driver in place; an invalid one is logged and the old one keeps running);
    --dra --print-device-classes prints the DeviceClasses that serve the config's resource
    names from the DRA driver, and exits.
    """
    if print_device_classes and not dra:
        _fail("--print-device-classes needs --dra (the classes serve the DRA driver's devices)")
    _need_generic(daemon=True)
    if dra:
        refuse_with_dra("device_plugin_dir")
        if cleanup and not print_device_classes:  # the name only: the config may be gone
            options = driver_options(
                driver_name, node_name, kubelet_dir, cdi_dir or Path(DEFAULT_CDI_DIR),
                kubeconfig, no_health, api_timeout=api_timeout, pod_uid=pod_uid,
            )  # fmt: skip
            run_driver(cleanup_only_driver(driver_name), options, cleanup=True)
            return
        from kubedevice.generic import load_config

        try:
            cfg = load_config(config).with_roots(dev_root, sys_root)
            from kubedevice.generic.dra import GenericDraDriver
        except ConfigError as exc:
            _fail(str(exc))
        except ImportError as exc:
            _fail(f"the DRA driver needs its extra: pip install 'kubedevice[generic,dra]' ({exc})")
        if print_device_classes:
            from kubedevice.generic.dra.classes import device_classes

            try:
                print_classes(device_classes(cfg, driver_name))
            except ConfigError as exc:
                _fail(str(exc))
            return
        options = driver_options(
            driver_name,
            node_name,
            kubelet_dir,
            cdi_dir or Path(DEFAULT_CDI_DIR),
            kubeconfig,
            no_health,
            tuple(cfg.evict_on) + tuple(evict_on),
            metrics_address,
            api_timeout,
            pod_uid=pod_uid,
            stop_grace=stop_grace,
        )
        run_driver(
            GenericDraDriver(cfg),
            options,
            cleanup=False,
            reload=lambda: load_config(config).with_roots(dev_root, sys_root),
        )
        return
    from kubedevice.generic import run_generic

    # run_generic reads the config and checks the metrics address before any socket.
    async def _main() -> None:
        stop = asyncio.Event()
        with stop_on_signals(stop):
            await run_generic(
                config,
                stop=stop,
                device_plugin_dir=device_plugin_dir,
                dev_root=dev_root,
                sys_root=sys_root,
                metrics_address=metrics_address,
                handle_sighup=True,
            )

    try:
        asyncio.run(_main())
    except KubeDeviceError as exc:
        _fail(str(exc))
    end_process_after_stop(0)


@click.command("validate")
@click.argument("config", type=click.Path(dir_okay=False, path_type=Path))
def validate_command(config: Path) -> None:
    """Check a generic plugin config file; print what is wrong (exit 2) or a summary."""
    _need_generic(daemon=False)
    from kubedevice.generic import load_config

    try:
        cfg = load_config(config)
    except ConfigError as exc:
        _fail(str(exc))
    click.echo(
        f"{config}: ok ({len(cfg.resources)} resource(s): "
        + ", ".join(r.name for r in cfg.resources)
        + ")"
    )


COMMANDS: list[click.Command] = [run_command, validate_command]

"""``kubedevice nvidia run`` (the GPU plugin daemon) and ``kubedevice nvidia info``.

No logic here: options are parsed, :mod:`kubedevice.nvidia` does the work. A bad config
or option exits 2 naming the field; NVML that cannot start exits 2 with one line (unless
``failOnInitError: false``, which serves zero GPUs).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import click

from kubedevice.cli.dra_options import (
    PRINT_DEVICE_CLASSES,
    cleanup_only_driver,
    dra_options,
    driver_options,
    print_classes,
    run_driver,
)
from kubedevice.cli.fastexit import end_process_after_stop
from kubedevice.cli.options import (
    DEFAULT_CDI_DIR,
    OUTPUT_HELP,
    device_plugin_dir_option,
    metrics_address_option,
    pod_resources_socket_option,
    root_options,
)
from kubedevice.errors import ConfigError, KubeDeviceError, NvmlError
from kubedevice.kubeconfig import check_kubeconfig_file
from kubedevice.signals import stop_on_signals

if TYPE_CHECKING:
    from kubedevice.nvidia.config import Config

__all__ = ["COMMANDS"]


def _flag(key: str) -> str:
    """A key of the GPU plugin's config file, as the options' defaults name it."""
    return f"flags.{key}"


_NVML = click.option(
    "--nvml",
    default="real",
    show_default=True,
    envvar="KUBEDEVICE_NVML",
    show_envvar=True,
    help="NVML backend: 'real' (nvidia-ml-py) or 'fake:FILE' (a machine file or a packaged "
    "machine name such as fake:dgx-8gpu).",
)
_CONFIG = click.option(
    "--config",
    "-c",
    "config_path",
    default=None,
    type=click.Path(dir_okay=False, path_type=Path),
    show_default="none: the built-in defaults",
    help="YAML config file (version: v1).",
)


def _fail(message: str) -> None:
    click.echo(f"error: {message}", err=True)
    raise SystemExit(2)


def _nvml_line(exc: NvmlError) -> str:
    hint = {
        "LibraryNotFound": "the NVIDIA driver library (libnvidia-ml.so.1) is not installed here",
        "DriverNotLoaded": "the NVIDIA kernel driver is not loaded on this node",
        "NoPermission": "no permission to open the NVIDIA device nodes",
    }.get(exc.code, "")
    extra = f" ({hint})" if hint and "pip install" not in str(exc) else ""
    return f"{exc}{extra}; set flags.failOnInitError: false to serve zero GPUs instead"


@click.group("nvidia")
def nvidia() -> None:
    """The NVIDIA GPU plugin: nvidia.com/gpu from NVML, with health, sharing, MIG and CDI."""


@nvidia.command("run")
@_CONFIG
@_NVML
@device_plugin_dir_option()
@metrics_address_option()
@root_options(_flag, driver=True)
@click.option(
    "--cdi-dir",
    default=None,
    show_default=f"the config's {_flag('cdiDir')}",
    type=click.Path(file_okay=False),
    help="Where the CDI specs are written.",
)
@click.option(
    "--features-dir",
    default=None,
    show_default=f"the config's {_flag('featuresDir')}",
    help="node-feature-discovery's local feature directory; '' writes no labels.",
)
@pod_resources_socket_option(f"the config's {_flag('podResourcesSocket')}")
def run_command(
    config_path: Path | None,
    nvml: str,
    device_plugin_dir: str,
    metrics_address: str | None,
    dev_root: str | None,
    sys_root: str | None,
    driver_root: str | None,
    host_driver_root: str | None,
    host_cgroup_root: str | None,
    cdi_dir: str | None,
    features_dir: str | None,
    pod_resources_socket: str | None,
) -> None:
    """Run the GPU device plugin.

    SIGHUP or a change to the config file reloads it (an invalid one is rejected and the
    old one keeps running); SIGTERM or SIGINT stops cleanly with status 0, within 100 ms
    (the NVML event wait is not waited for: nothing can wake it).
    """
    from kubedevice.nvidia.backends import open_backend
    from kubedevice.nvidia.config import load_config
    from kubedevice.nvidia.runner import run_gpu_plugin
    from kubedevice.plugin.filewatch import file_digest

    overrides: dict[str, str | None] = {
        "dev_root": dev_root,
        "sys_root": sys_root,
        "nvidia_driver_root": driver_root,
        "host_driver_root": host_driver_root,
        "host_cgroup_root": host_cgroup_root,
        "cdi_dir": cdi_dir,
        "features_dir": features_dir,
        "pod_resources_socket": pod_resources_socket,
    }
    # taken before the load: an edit made from here on is reloaded once the watch is set up
    digest = file_digest(config_path) if config_path is not None else None
    try:
        config = load_config(config_path).with_overrides(**overrides)
        backend = open_backend(nvml)
    except ConfigError as exc:
        _fail(str(exc))
        return

    async def _main() -> None:
        stop = asyncio.Event()
        with stop_on_signals(stop):
            await run_gpu_plugin(
                config,
                backend,
                stop=stop,
                config_path=config_path,
                config_digest=digest,
                device_plugin_dir=device_plugin_dir,
                overrides=overrides,
                metrics_address=metrics_address,
                handle_sighup=True,
                # both end a wait on interrupt (real NVML after its current 0.5 s slice);
                # the shorter real wait gives up sooner on a driver call that hangs
                wait_timeout_ms=60_000 if nvml.strip().startswith("fake:") else 5_000,
            )

    try:
        asyncio.run(_main())
    except NvmlError as exc:
        _fail(_nvml_line(exc))
    except KubeDeviceError as exc:
        _fail(str(exc))
    end_process_after_stop(0)


@nvidia.command("dra")
@_CONFIG
@_NVML
@dra_options("gpu.kubedevice.io", cdi_default=f"the config's {_flag('cdiDir')}")
@root_options(_flag, driver=True)
@click.option(
    "--mig-on-demand",
    is_flag=True,
    default=False,
    help="Offer every MIG placement of MIG-mode GPUs; make MIG devices per claim "
    "(dra.migOnDemand).",
)
@click.option(
    "--memory-shares",
    is_flag=True,
    help="Share whole GPUs by memory: claims ask for capacity.requests.memory "
    "(dra.memoryShares.enabled; accounted by the scheduler, not enforced).",
)
@click.option(
    "--mps",
    is_flag=True,
    help="Enforce memory shares with MPS: a control daemon per shared GPU, each share its "
    "client, limited to its memory and compute (dra.mps; turns --memory-shares on).",
)
@PRINT_DEVICE_CLASSES
@metrics_address_option()
def dra_command(
    config_path: Path | None,
    nvml: str,
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
    dev_root: str | None,
    sys_root: str | None,
    driver_root: str | None,
    host_driver_root: str | None,
    host_cgroup_root: str | None,
    mig_on_demand: bool,
    memory_shares: bool,
    mps: bool,
    print_device_classes: bool,
    metrics_address: str | None,
) -> None:
    """Run the GPU DRA driver: the GPUs as devices of ResourceSlices, prepared per claim.

    Reads the same config file as nvidia run (migStrategy, health policies, roots).
    SIGHUP reloads it all or nothing (a valid one restarts the driver in place; an invalid
    one is logged and the old one keeps running). SIGTERM or SIGINT stops cleanly with
    status 0. --cleanup needs no NVML, nor the config file once it is gone. With
    --print-device-classes, prints the DeviceClasses that serve the plugin's resource names
    from this driver (under a MIG strategy, this node's MIG profiles are read through
    --nvml) and exits.
    """
    from kubedevice.nvidia.backends import open_backend
    from kubedevice.nvidia.config import load_config

    def load() -> Config:
        config = load_config(config_path).with_overrides(
            dev_root=dev_root,
            sys_root=sys_root,
            nvidia_driver_root=driver_root,
            host_driver_root=host_driver_root,
            host_cgroup_root=host_cgroup_root,
            cdi_dir=None if cdi_dir is None else str(cdi_dir),
        )
        if mig_on_demand:
            config = replace(config, dra=replace(config.dra, mig_on_demand=True))
        if memory_shares:
            config = config.with_memory_shares()
        if mps:
            config = config.with_mps()
        return config

    if cleanup and not print_device_classes:  # the driver's name, and where its specs are
        if config_path is not None and not config_path.exists():
            # gone with the release: its flags.cdiDir is unknown, so --cdi-dir or the default
            cdi = cdi_dir or Path(DEFAULT_CDI_DIR)
        else:
            try:
                cdi = Path(load().flags.cdi_dir)
            except ConfigError as exc:
                _fail(str(exc))
                return
        options = driver_options(
            driver_name, node_name, kubelet_dir, cdi, kubeconfig, no_health,
            api_timeout=api_timeout, pod_uid=pod_uid,
        )  # fmt: skip
        run_driver(cleanup_only_driver(driver_name), options, cleanup=True)
        return

    try:
        config = load()
        backend = open_backend(nvml)
        from kubedevice.nvidia.dra import GpuDraDriver
    except ConfigError as exc:
        _fail(str(exc))
        return
    except ImportError as exc:
        _fail(f"the DRA driver needs its extra: pip install 'kubedevice[nvidia,dra]' ({exc})")
        return
    if print_device_classes:
        from kubedevice.nvidia.dra.classes import device_classes, node_mig_profiles

        try:
            profiles = node_mig_profiles(config, backend)
            print_classes(device_classes(config, driver_name, profiles))
        except NvmlError as exc:
            _fail(_nvml_line(exc))
        except KubeDeviceError as exc:
            _fail(str(exc))
        return
    driver = GpuDraDriver(
        config,
        backend,
        wait_timeout_ms=60_000 if nvml.strip().startswith("fake:") else 5_000,
        mps_root=kubelet_dir.absolute() / "plugins" / driver_name / "mps",
    )
    # without --cdi-dir, the config's flags.cdiDir (as for ``nvidia run``)
    cdi = Path(config.flags.cdi_dir)
    options = driver_options(
        driver_name,
        node_name,
        kubelet_dir,
        cdi,
        kubeconfig,
        no_health,
        tuple(config.health.evict_on) + tuple(evict_on),
        metrics_address,
        api_timeout,
        pod_uid=pod_uid,
        stop_grace=stop_grace,
    )
    try:
        options.resolved(driver)  # a bad name or no node name: before NVML starts
        check_kubeconfig_file(kubeconfig)  # and a kubeconfig kubectl would refuse
        driver.open()
    except NvmlError as exc:
        _fail(_nvml_line(exc))
    except KubeDeviceError as exc:
        _fail(str(exc))
    run_driver(driver, options, cleanup=False, reload=load)


@nvidia.command("info")
@_NVML
@_CONFIG
@click.option(
    "--sys-root",
    default=None,
    show_default=f"the config's {_flag('sysRoot')}",
    type=click.Path(file_okay=False),
    help="Where the host's /sys is.",
)
@click.option(
    "-o",
    "--output",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help=OUTPUT_HELP,
)
def info_command(nvml: str, config_path: Path | None, sys_root: str | None, output: str) -> None:
    """Show the GPUs, MIG devices, topology matrix and the node labels the plugin would write."""
    from kubedevice.nvidia.backends import open_backend
    from kubedevice.nvidia.config import load_config
    from kubedevice.nvidia.info import collect_info, format_info

    try:
        config = load_config(config_path).with_overrides(sys_root=sys_root)
        backend = open_backend(nvml)
    except ConfigError as exc:
        _fail(str(exc))
        return
    try:
        driver = backend.init()
        try:
            data = collect_info(backend, Path(config.flags.sys_root), driver=driver, config=config)
        finally:
            backend.shutdown()
    except NvmlError as exc:
        _fail(_nvml_line(exc).split("; set flags")[0])
        return
    except KubeDeviceError as exc:
        _fail(str(exc))
        return
    if output == "json":
        click.echo(json.dumps(data, indent=2, sort_keys=True))
    else:
        click.echo(format_info(data))


COMMANDS: list[click.Command] = [nvidia]

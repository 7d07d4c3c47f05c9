"""The options several ``kubedevice`` commands share, written once.

One concept, one flag: the same name, environment variable, help sentence and value type
wherever it appears (tests/test_cli_help.py walks every command and checks it). Each help
text is one sentence saying what the value is; click adds the ``[env var: ...; default:
...]`` bracket (``show_envvar``, ``show_default``), so every default and variable reads in
one style and one order. A default that depends on the command (a config file's key, a
path derived from another option) is a ``show_default`` string.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from kubedevice._api import DEFAULT_DEVICE_PLUGIN_DIR, ENV_DEVICE_PLUGIN_DIR

__all__ = [
    "DEFAULT_CDI_DIR",
    "OUTPUT_HELP",
    "POD_RESOURCES_BESIDE",
    "device_plugin_dir_option",
    "metrics_address_option",
    "pod_resources_socket_option",
    "root_options",
]

F = TypeVar("F", bound=Callable[..., Any])

#: Where CDI specs go unless a flag or a config says otherwise (the CDI default).
DEFAULT_CDI_DIR = "/var/run/cdi"

OUTPUT_HELP = "Output format."

#: Where the kubelet's PodResources socket is, relative to its device-plugin directory.
POD_RESOURCES_BESIDE = "pod-resources/kubelet.sock beside the device-plugin directory"


def device_plugin_dir_option(path_type: type[str] | type[Path] = str) -> Callable[[F], F]:
    """``--device-plugin-dir`` ($DP_DEVICE_PLUGIN_DIR): the kubelet's socket directory."""
    return click.option(
        "--device-plugin-dir",
        envvar=ENV_DEVICE_PLUGIN_DIR,
        show_envvar=True,
        default=DEFAULT_DEVICE_PLUGIN_DIR,
        show_default=True,
        type=click.Path(file_okay=False, path_type=path_type),
        help="The kubelet's device-plugin directory (kubelet.sock and the plugins' sockets).",
    )


def metrics_address_option() -> Callable[[F], F]:
    """``--metrics-address``: Prometheus metrics, off unless given."""
    return click.option(
        "--metrics-address",
        default=None,
        show_default="off",
        metavar="HOST:PORT",
        help="Serve Prometheus /metrics on this address (a DRA driver: /healthz and /readyz too).",
    )


def pod_resources_socket_option(
    default: str, path_type: type[str] | type[Path] = str
) -> Callable[[F], F]:
    """``--pod-resources-socket``; ``default`` says where it is when the flag is absent."""
    return click.option(
        "--pod-resources-socket",
        default=None,
        show_default=default,
        type=click.Path(dir_okay=False, path_type=path_type),
        help="The kubelet's PodResources socket.",
    )


def root_options(config_key: Callable[[str], str], *, driver: bool) -> Callable[[F], F]:
    """``--dev-root`` and ``--sys-root`` (and with ``driver``, ``--driver-root``,
    ``--host-driver-root`` and ``--host-cgroup-root``), each defaulting to the config key
    ``config_key(name)`` names.
    """
    specs = [
        ("--dev-root", "devRoot", "Where the host's /dev is."),
        ("--sys-root", "sysRoot", "Where the host's /sys is."),
    ]
    if driver:
        specs += [
            ("--driver-root", "nvidiaDriverRoot", "Where the NVIDIA driver's files are."),
            (
                "--host-driver-root",
                "hostDriverRoot",
                "The driver root as a path on the host, for CDI specs.",
            ),
            (
                "--host-cgroup-root",
                "hostCgroupRoot",
                "The host's cgroup file systems as mounted here: MPS daemons get a cgroup "
                "of their own there, to outlive this container ('' for none).",
            ),
        ]
    options = [
        click.option(
            flag,
            default=None,
            show_default=f"the config's {config_key(key)}",
            type=click.Path(file_okay=False),
            help=text,
        )
        for flag, key, text in specs
    ]

    def decorate(fn: F) -> F:
        for option in reversed(options):
            fn = option(fn)
        return fn

    return decorate

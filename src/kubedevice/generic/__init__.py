"""The generic, config-driven ``/dev`` device plugin, built on the SDK (:mod:`kubedevice.plugin`).

A YAML config (``version: v1``) declares resources made of device-node globs or USB
matches; :class:`GenericPlugins` serves them with inotify hot-plug, health checks and
hot reload. :class:`FakeHost` builds fake ``/dev`` and ``/sys`` trees for tests and demos.
Never imports the kubelet side (:mod:`kubedevice.kubelet`, :mod:`kubedevice.conformance`).
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kubedevice.generic.config import Config, load_config, parse_config
    from kubedevice.generic.fake import FakeHost
    from kubedevice.generic.resource import GenericResourcePlugin, Snapshot
    from kubedevice.generic.runner import GenericPlugins, run_generic

__all__ = [
    "Config",
    "FakeHost",
    "GenericPlugins",
    "GenericResourcePlugin",
    "Snapshot",
    "load_config",
    "parse_config",
    "run_generic",
]

# Loaded on first use, so that importing one module of the package does not build every
# model of the generic plugin.
_HOME = {
    "Config": "config",
    "load_config": "config",
    "parse_config": "config",
    "FakeHost": "fake",
    "GenericResourcePlugin": "resource",
    "Snapshot": "resource",
    "GenericPlugins": "runner",
    "run_generic": "runner",
}


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{home}"), name)

"""Which credentials a command that talks to the API server uses: one order everywhere.

``--kubeconfig`` (when given), else the first file of ``$KUBECONFIG``, else
``~/.kube/config`` when it exists, else the pod's in-cluster service account. kubectl and
the official client look in the same places. Every command that talks to the API server
(``advertise``, ``nvidia dra``, ``run --dra``, :mod:`kubedevice.dra`) resolves it here.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

from kubedevice.errors import ConfigError

__all__ = [
    "IN_CLUSTER_HOST_ENV",
    "KUBECONFIG_DEFAULT",
    "KUBECONFIG_HELP",
    "check_kubeconfig_file",
    "resolve_kubeconfig",
]

#: Set in every pod: where the in-cluster service account's API server is.
IN_CLUSTER_HOST_ENV: Final = "KUBERNETES_SERVICE_HOST"
#: What ``--help`` says of ``--kubeconfig`` and of its default (the same for every command).
KUBECONFIG_HELP: Final = "The kubeconfig file to reach the API server with."
KUBECONFIG_DEFAULT: Final = "$KUBECONFIG, then ~/.kube/config, then the in-cluster service account"


def resolve_kubeconfig(explicit: str | os.PathLike[str] | None) -> Path | None:
    """The kubeconfig file to load, or ``None`` for the in-cluster service account.

    Raises:
        ConfigError: The named file (``--kubeconfig`` or ``$KUBECONFIG``) does not exist,
            or there is no kubeconfig at all and this is not a pod.
    """
    if explicit is not None and str(explicit):
        path = Path(explicit)
        if not path.exists():
            raise ConfigError(f"kubeconfig {path} does not exist (--kubeconfig)")
        return path
    env = os.environ.get("KUBECONFIG", "")
    first = next((p for p in env.split(os.pathsep) if p), None)
    if first is not None:
        path = Path(first)
        if not path.exists():
            raise ConfigError(f"kubeconfig {path} does not exist ($KUBECONFIG)")
        return path
    default = Path(os.path.expanduser("~/.kube/config"))
    if default.exists():
        return default
    if os.environ.get(IN_CLUSTER_HOST_ENV):
        return None
    raise ConfigError(
        f"no kubeconfig: give --kubeconfig or set $KUBECONFIG ({default} does not exist "
        f"and ${IN_CLUSTER_HOST_ENV} is not set, so this is not a pod)"
    )


def check_kubeconfig_file(explicit: str | os.PathLike[str] | None) -> None:
    """Check the file :func:`resolve_kubeconfig` finds by kubectl's rules
    (:mod:`kubedevice.kubeconfig_rules`), for a command to refuse a bad kubeconfig before it
    starts anything else. No file found (or the in-cluster account): nothing to check here;
    the command says so where it needs one.

    Raises:
        ConfigError: kubectl would refuse the file.
    """
    from kubedevice.kubeconfig_rules import load_kubeconfig

    try:
        path = resolve_kubeconfig(explicit)
    except ConfigError:
        return
    if path is not None:
        load_kubeconfig(path)

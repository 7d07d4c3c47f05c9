"""Where ``advertise`` would send its request and how it would authenticate, read without
running anything: the kubeconfig is parsed as plain YAML, no credential plugin (``exec``,
``auth-provider``) is run and no file is written. A dry run needs only this.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from kubedevice.errors import ConfigError
from kubedevice.kubeconfig import resolve_kubeconfig
from kubedevice.yamlfile import read_yaml

__all__ = ["IN_CLUSTER_TOKEN", "NO_CLUSTER", "Target", "kubeconfig_path", "read_target"]

#: The service-account token file of a pod.
IN_CLUSTER_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"


@dataclass(frozen=True, slots=True)
class Target:
    """The API server and the kind of credentials a kubeconfig (or a pod) names."""

    server: str
    #: Where this came from: the kubeconfig path, or "in-cluster service account".
    source: str
    #: How the Authorization header would be made, in words ("" when none is sent).
    authorization: str


#: The target a dry run shows when there is no kubeconfig at all (and this is not a pod).
NO_CLUSTER = Target("https://<api-server>", "no kubeconfig", "")


def kubeconfig_path(kubeconfig: str | None) -> str | None:
    """The kubeconfig to use (:func:`kubedevice.kubeconfig.resolve_kubeconfig`: ``--kubeconfig``,
    ``$KUBECONFIG``, ``~/.kube/config``); ``None`` for in-cluster. ConfigError if none."""
    path = resolve_kubeconfig(kubeconfig)
    return None if path is None else str(path)


def _named(doc: dict[str, Any], key: str, name: str, path: str) -> dict[str, Any]:
    for entry in doc.get(key) or []:
        if isinstance(entry, dict) and entry.get("name") == name:
            inner = entry.get(key.rstrip("s"))
            return inner if isinstance(inner, dict) else {}
    raise ConfigError(f"kubeconfig {path}: no {key.rstrip('s')} named {name!r}")


def _auth_words(user: dict[str, Any], name: str) -> str:
    if user.get("token") or user.get("tokenFile"):
        return f"Bearer <the token of kubeconfig user {name!r}>"
    if isinstance(user.get("exec"), dict):
        command = str(user["exec"].get("command", "?"))
        return f"Bearer <a token from the exec plugin {command!r}, not run in a dry run>"
    if isinstance(user.get("auth-provider"), dict):
        provider = str(user["auth-provider"].get("name", "?"))
        return f"Bearer <a token from the {provider!r} auth provider, not refreshed in a dry run>"
    if user.get("username"):
        return f"Basic <the password of kubeconfig user {name!r}>"
    return ""


def read_target(kubeconfig: str | None, context: str | None, *, dry_run: bool = False) -> Target:
    """The API server and credential kind, from the kubeconfig or the pod's environment.

    Reads files only; ConfigError naming the file and field when something is missing.
    With ``dry_run``, no kubeconfig at all (none named, none at ``~/.kube/config``, not a
    pod) is :data:`NO_CLUSTER` instead of an error: a dry run needs no cluster.
    """
    if dry_run and not kubeconfig and not os.environ.get("KUBECONFIG"):
        try:
            resolve_kubeconfig(None)
        except ConfigError:
            return NO_CLUSTER
    path = kubeconfig_path(kubeconfig)
    if path is None:
        host = os.environ.get("KUBERNETES_SERVICE_HOST", "")
        port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        host = f"[{host}]" if ":" in host else host
        return Target(
            f"https://{host}:{port}",
            "in-cluster service account",
            f"Bearer <the token in {IN_CLUSTER_TOKEN}>",
        )
    try:
        doc = read_yaml(path)  # bounded: a FIFO, a huge file or an alias bomb is one line
    except ConfigError as exc:
        raise ConfigError(f"cannot read kubeconfig {exc}") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"kubeconfig {path}: not a kubeconfig (expected a map)")
    name = context or doc.get("current-context")
    if not name:
        raise ConfigError(f"kubeconfig {path}: no current-context; give --context")
    ctx = _named(doc, "contexts", str(name), path)
    cluster = _named(doc, "clusters", str(ctx.get("cluster", "")), path)
    server = cluster.get("server")
    if not isinstance(server, str) or not server:
        raise ConfigError(f"kubeconfig {path}: cluster {ctx.get('cluster')!r} has no server")
    user_name = str(ctx.get("user", ""))
    user = _named(doc, "users", user_name, path) if user_name else {}
    return Target(server, path, _auth_words(user, user_name))

"""Send the node-status patch with the official Kubernetes client; API errors as one line.

The ``kubernetes`` package is an optional extra (``pip install 'kubedevice[cluster]'``) and
is imported only here, only when needed.
"""

from __future__ import annotations

import json
import os
from typing import Any

from kubedevice.advertise.patch import PatchRequest
from kubedevice.errors import AdvertiseError, ConfigError

__all__ = ["api_host", "load_client", "send"]


def _kubernetes() -> Any:
    try:
        import kubernetes
    except ImportError:
        raise ConfigError(
            "the Kubernetes client is not installed: pip install 'kubedevice[cluster]'"
        ) from None
    return kubernetes


def load_client(kubeconfig: str | None, context: str | None) -> Any:
    """An ``ApiClient`` from a kubeconfig (``--kubeconfig``, ``$KUBECONFIG``, ``~/.kube/config``)
    or, when none exists and this runs in a pod, the in-cluster service account."""
    k8s = _kubernetes()
    cfg = k8s.client.Configuration()
    path = kubeconfig or os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or None
    default = os.path.expanduser("~/.kube/config")
    in_cluster = bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
    where = path or default
    if path is not None and not os.path.exists(path):
        raise ConfigError(f"kubeconfig {path} does not exist")
    if path is None and not os.path.exists(default) and not in_cluster:
        raise ConfigError(
            f"no kubeconfig ({default} does not exist): give --kubeconfig or set KUBECONFIG"
        )
    try:
        if path is not None or os.path.exists(default):
            k8s.config.load_kube_config(
                config_file=where, context=context, client_configuration=cfg
            )
        else:
            where = "in-cluster service account"
            k8s.config.load_incluster_config(client_configuration=cfg)
    except Exception as exc:  # the client's parser raises anything on a malformed file
        msg = str(exc).splitlines()[0].rstrip(".") if str(exc) else type(exc).__name__
        raise ConfigError(f"cannot load Kubernetes credentials ({where}): {msg}") from None
    cfg.retries = 0
    return k8s.client.ApiClient(cfg)


def api_host(client: Any) -> str:
    """The API server URL the client talks to."""
    return str(client.configuration.host)


def _status_message(body: Any) -> str:
    try:
        doc = json.loads(body)
        return str(doc.get("message") or "").splitlines()[0]
    except (ValueError, TypeError, AttributeError, IndexError):
        return ""


def _api_error(exc: Any, request: PatchRequest) -> AdvertiseError:
    status = int(getattr(exc, "status", 0) or 0)
    detail = _status_message(getattr(exc, "body", None))
    node = request.node
    if status == 401:
        text = "unauthorized (401): the API server refused these credentials"
    elif status == 403:
        text = f"forbidden (403): not allowed to patch nodes/status of {node}"
    elif status == 404:
        text = f"no such node: {node} (404)"
    elif status == 409:
        text = f"conflict (409) patching node {node}: the node changed meanwhile, try again"
    elif status == 422:
        text = f"the API server refused the patch for node {node} (422)"
    else:
        text = f"the API server answered {status} {getattr(exc, 'reason', '') or ''}".rstrip()
    if detail and status not in (401, 404):
        text += f": {detail}"
    return AdvertiseError(text)


def send(client: Any, request: PatchRequest, timeout: float = 30.0) -> dict[str, str]:
    """PATCH the node status; the node's resulting capacity. AdvertiseError on failure."""
    k8s = _kubernetes()
    api = k8s.client.CoreV1Api(client)
    try:
        node = api.patch_node_status(
            request.node,
            # a list body: the client sends it as application/json-patch+json (CONTENT_TYPE)
            list(request.operations),
            _request_timeout=timeout,
        )
    except k8s.client.ApiException as exc:
        raise _api_error(exc, request) from None
    except Exception as exc:  # urllib3 connection errors and the like, as one line
        reason = str(getattr(exc, "reason", "") or exc).splitlines()[0]
        raise AdvertiseError(
            f"cannot reach the API server at {api_host(client)}: {reason}"
        ) from None
    capacity = getattr(getattr(node, "status", None), "capacity", None) or {}
    return {str(k): str(v) for k, v in capacity.items()}

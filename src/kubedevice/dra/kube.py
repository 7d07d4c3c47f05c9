"""The kit's one door to the Kubernetes API: ResourceClaims (and their status), ResourceSlices,
the Node.

Uses the official ``kubernetes`` client (the ``dra`` extra), imported when a driver
connects, with plain JSON dicts in and out (no generated models: a field newer than the
client is never dropped). Blocking: callers run these in a thread. Every failure is a
:class:`~kubedevice.errors.KubeApiError` with the HTTP status (0: not reached).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Final

from kubedevice.errors import ConfigError, KubeApiError

__all__ = ["KubeClient"]

log = logging.getLogger(__name__)

_RESOURCE: Final = "/apis/resource.k8s.io/v1"
_TIMEOUT: Final = 30.0  # seconds per request (connect + read)


class KubeClient:
    """A small client for the calls a DRA driver makes. Build it with :meth:`connect`."""

    def __init__(self, api_client: Any) -> None:
        self._api = api_client

    @classmethod
    def connect(cls, kubeconfig: Path | None) -> KubeClient:
        """Load ``kubeconfig`` (or the in-cluster service account when ``None``).

        Raises:
            ConfigError: The client is not installed, or the kubeconfig/in-cluster
                configuration cannot be loaded.
        """
        try:
            import kubernetes.client
            import kubernetes.config
        except ImportError:
            raise ConfigError(
                "DRA drivers need the Kubernetes client: pip install 'kubedevice[dra]'"
            ) from None
        configuration = kubernetes.client.Configuration()
        try:
            if kubeconfig is not None:
                kubernetes.config.load_kube_config(  # type: ignore[no-untyped-call]
                    config_file=str(kubeconfig), client_configuration=configuration
                )
            else:
                kubernetes.config.load_incluster_config(  # type: ignore[no-untyped-call]
                    client_configuration=configuration
                )
        except (kubernetes.config.ConfigException, OSError, ValueError, TypeError) as exc:
            where = f"kubeconfig {kubeconfig}" if kubeconfig else "in-cluster configuration"
            raise ConfigError(f"cannot load the {where}: {exc}") from None
        return cls(kubernetes.client.ApiClient(configuration))

    def close(self) -> None:
        """Close the connection pool."""
        self._api.close()

    # ---- the calls -----------------------------------------------------------------

    def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        """The ResourceClaim ``namespace/name``."""
        return self._call("GET", f"{_RESOURCE}/namespaces/{namespace}/resourceclaims/{name}")

    def get_node(self, name: str) -> dict[str, Any]:
        """The Node ``name``."""
        return self._call("GET", f"/api/v1/nodes/{name}")

    def list_slices(self, driver: str, node: str) -> list[dict[str, Any]]:
        """This driver's ResourceSlices on ``node`` (field selectors on driver and node)."""
        answer = self._call(
            "GET",
            f"{_RESOURCE}/resourceslices",
            query=[("fieldSelector", f"spec.driver={driver},spec.nodeName={node}")],
        )
        items: list[dict[str, Any]] = answer.get("items") or []
        return items

    def create_slice(self, body: dict[str, Any]) -> dict[str, Any]:
        """Create a ResourceSlice."""
        return self._call("POST", f"{_RESOURCE}/resourceslices", body=body)

    def replace_slice(self, body: dict[str, Any]) -> dict[str, Any]:
        """Replace a ResourceSlice (its ``metadata.resourceVersion`` guards against races)."""
        name = body["metadata"]["name"]
        return self._call("PUT", f"{_RESOURCE}/resourceslices/{name}", body=body)

    def apply_claim_status(
        self, namespace: str, name: str, body: dict[str, Any], manager: str
    ) -> dict[str, Any]:
        """Server-side apply ``body`` to the ResourceClaim's status as field ``manager``
        (only that manager's fields change; ``status.devices`` entries of other drivers stay).
        """
        return self._call(
            "PATCH",
            f"{_RESOURCE}/namespaces/{namespace}/resourceclaims/{name}/status",
            query=[("fieldManager", manager), ("force", "true")],
            body=body,
            content_type="application/apply-patch+yaml",
        )

    def delete_slice(self, name: str, resource_version: str | None = None) -> None:
        """Delete a ResourceSlice (gone already is fine)."""
        body: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if resource_version:
            body["preconditions"] = {"resourceVersion": resource_version}
        try:
            self._call("DELETE", f"{_RESOURCE}/resourceslices/{name}", body=body)
        except KubeApiError as exc:
            if exc.status != 404:
                raise

    # ---- plumbing ------------------------------------------------------------------

    def _call(
        self,
        method: str,
        path: str,
        *,
        query: list[tuple[str, str]] | None = None,
        body: dict[str, Any] | None = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        try:
            request = self._api.param_serialize(
                method,
                path,
                query_params=query or [],
                header_params={"Accept": "application/json", "Content-Type": content_type},
                # JSON is YAML: an apply patch goes as JSON text
                body=body if content_type == "application/json" else json.dumps(body),
                auth_settings=["BearerToken"],
            )
            response = self._api.call_api(*request, _request_timeout=_TIMEOUT)
            response.read()
        except Exception as exc:  # urllib3/ssl/socket/auth errors: the server was not reached
            raise KubeApiError(f"{method} {path}: {type(exc).__name__}: {exc}") from None
        status = int(response.status)
        data = response.data
        if not 200 <= status <= 299:
            raise KubeApiError(f"{method} {path}: {status} {_reason(data)}", status=status)
        try:
            decoded = json.loads(data) if data else {}
        except ValueError as exc:
            raise KubeApiError(f"{method} {path}: the answer is not JSON: {exc}") from None
        if not isinstance(decoded, dict):
            raise KubeApiError(f"{method} {path}: the answer is not a JSON object")
        return decoded


def _reason(data: bytes | None) -> str:
    """The API server's ``Status.message`` of an error answer, else its start."""
    try:
        status = json.loads(data or b"")
        return str(status["message"])
    except (TypeError, ValueError, KeyError):
        return (data or b"").decode("utf-8", "replace")[:200]

"""The API objects of a run, made by the kit: Node, namespace, DeviceClass, ResourceClaims.

The kit is the scheduler too: :meth:`Fixtures.claim` makes a ResourceClaim and writes its
allocation into ``status`` (results naming the driver's published devices, the opaque
configs, a node selector for the run's node, and a pod in ``reservedFor``), as the
scheduler does before the kubelet calls the driver. :meth:`Fixtures.take` hands out each
published device once, so two claims share a device only when a case means it.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kubedevice.conformance.dra.kube import RESOURCE, ApiError, KubeClient
from kubedevice.conformance.dra.slices import PublishedDevice

__all__ = ["ADMIN_ACCESS_LABEL", "Fixtures", "Request"]

#: The namespace label the API server asks for before a claim may request admin access.
ADMIN_ACCESS_LABEL = "resource.kubernetes.io/admin-access"


@dataclass(frozen=True)
class Request:
    """One request of a claim and the device allocated to it.

    ``sub`` names the firstAvailable subrequest that was allocated (the claim then offers
    two subrequests, ``first`` and ``second``); ``config`` is an opaque config for it.
    """

    name: str
    device: PublishedDevice
    sub: str | None = None
    admin: bool = False
    config: tuple[tuple[str, dict[str, Any]], ...] = ()  # (driver, parameters)


@dataclass
class Fixtures:
    """The objects one run made (deleted again by :meth:`cleanup`)."""

    kube: KubeClient
    node: str
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    namespace: str = ""
    device_class: str = ""
    made_node: bool = False
    claims: list[str] = field(default_factory=list)
    used: set[tuple[str, str]] = field(default_factory=set)

    def setup_node(self) -> None:
        """The Node (unless it exists) and a namespace that allows admin access."""
        if self.kube.get_or_none(f"/api/v1/nodes/{self.node}") is None:
            self.kube.call("POST", "/api/v1/nodes", {"metadata": {"name": self.node}})
            self.made_node = True
        self.namespace = f"kd-conformance-{self.run_id}"
        self.kube.call("POST", "/api/v1/namespaces", {"metadata": {
            "name": self.namespace, "labels": {ADMIN_ACCESS_LABEL: "true"}}})  # fmt: skip

    def setup_class(self, driver: str) -> None:
        """A DeviceClass of ``driver``'s devices."""
        self.device_class = f"kd-conformance-{self.run_id}"
        self.kube.call("POST", f"{RESOURCE}/deviceclasses", {
            "metadata": {"name": self.device_class},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}]},
        })  # fmt: skip

    def take(self, devices: Sequence[PublishedDevice], n: int) -> list[PublishedDevice]:
        """``n`` published devices no claim of the run was given yet (fewer when short)."""
        free = [d for d in devices if (d.pool, d.name) not in self.used]
        chosen = free[:n]
        self.used.update((d.pool, d.name) for d in chosen)
        return chosen

    def claim(self, requests: Sequence[Request], *, allocate: bool = True) -> tuple[str, str, str]:
        """Make a claim with ``requests`` and (``allocate``) its allocation; its ref."""
        name = f"c{len(self.claims)}-{self.run_id}"
        spec_requests: list[dict[str, Any]] = []
        configs: list[dict[str, Any]] = []
        for r in requests:
            one: dict[str, Any] = {"deviceClassName": self.device_class}
            if r.sub is not None:
                spec_requests.append({"name": r.name, "firstAvailable": [
                    {"name": "first", **one}, {"name": "second", **one}]})  # fmt: skip
            else:
                spec_requests.append(
                    {"name": r.name, "exactly": {**one, "count": 1,
                                                 **({"adminAccess": True} if r.admin else {})}}
                )  # fmt: skip
            for driver, parameters in r.config:
                configs.append({"requests": [r.name], "opaque": {
                    "driver": driver, "parameters": parameters}})  # fmt: skip
        base = f"{RESOURCE}/namespaces/{self.namespace}/resourceclaims"
        claim = self.kube.call("POST", base, {
            "metadata": {"name": name, "namespace": self.namespace},
            "spec": {"devices": {"requests": spec_requests, "config": configs}},
        })  # fmt: skip
        self.claims.append(name)
        if allocate:
            claim["status"] = {
                "allocation": {
                    "devices": {
                        "results": [_result(r) for r in requests],
                        "config": [{"source": "FromClaim", **c} for c in configs],
                    },
                    "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                        {"key": "metadata.name", "operator": "In", "values": [self.node]}]}]},
                },
                "reservedFor": [{"resource": "pods", "name": f"pod-{name}",
                                 "uid": str(uuid.uuid4())}],
            }  # fmt: skip
            claim = self.kube.call("PUT", f"{base}/{name}/status", claim)
        return (self.namespace, name, str(claim["metadata"]["uid"]))

    def delete_claim(self, name: str) -> None:
        """Delete a claim (a finalizer-free claim goes at once)."""
        self.kube.delete(f"{RESOURCE}/namespaces/{self.namespace}/resourceclaims/{name}")

    def cleanup(self) -> None:
        """Delete what the run made (the Node and its ResourceSlices only if it made the Node)."""
        with contextlib.suppress(ApiError):
            for name in self.claims:
                self.delete_claim(name)
            if self.device_class:
                self.kube.delete(f"{RESOURCE}/deviceclasses/{self.device_class}")
            if self.namespace:
                self.kube.delete(f"/api/v1/namespaces/{self.namespace}")
            if self.made_node:  # and its slices, as the kubelet of a node that goes would
                self.kube.call("DELETE", f"{RESOURCE}/resourceslices",
                               fieldSelector=f"spec.nodeName={self.node}")  # fmt: skip
                self.kube.delete(f"/api/v1/nodes/{self.node}")


def _result(r: Request) -> dict[str, Any]:
    out: dict[str, Any] = {
        "request": r.name if r.sub is None else f"{r.name}/{r.sub}",
        "driver": r.device.driver,
        "pool": r.device.pool,
        "device": r.device.name,
    }
    if r.admin:
        out["adminAccess"] = True
    return out

"""What a DRA driver's credentials may write, on the real API server, with the chart's objects.

The chart's ServiceAccount, ClusterRole (+binding) and ValidatingAdmissionPolicy (+binding)
for the /dev driver are created as rendered; a pod of that ServiceAccount is bound to this
cluster's node (``kd-node``) and a token is requested for it (a pod-bound token: the API
server puts the pod's node into its user info). With that token: the node's own
ResourceSlice may be written, another node's is refused by the policy, and so is another
driver's (``gpu.kubedevice.io``) slice of its own node; a claim's
``status.devices`` may be written for a claim allocated on the node, and is refused for a
claim allocated on another node (Kubernetes 1.36: the chart grants ``associated-node``
patch/update on ``resourceclaims/driver``; another node's claim needs ``arbitrary-node``).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from deploy.render import ROOT, by_kind, render
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from .cluster import NODE, Cluster, poll_until

pytestmark = pytest.mark.timeout(180)

DRIVER = "dev.kubedevice.io"
GPU_DRIVER = "gpu.kubedevice.io"
OTHER = "other-node"


@contextlib.contextmanager
def _chart_access(cluster: Cluster, ns: str) -> Iterator[str]:
    """The chart's ServiceAccount, RBAC and admission policy of the /dev driver; its name."""
    docs = render(namespace=ns, release=f"acc-{ns[-5:]}", values={"dra.generic.enabled": "true"})
    with _access(cluster, docs, ns) as name:
        yield name


@contextlib.contextmanager
def _access(cluster: Cluster, docs: list[dict[str, Any]], ns: str) -> Iterator[str]:
    """The ServiceAccount (in ``ns``), RBAC and admission policy of ``docs``; its name."""
    rbac = client.RbacAuthorizationV1Api(cluster.api)
    admission = client.AdmissionregistrationV1Api(cluster.api)
    [sa] = by_kind(docs, "ServiceAccount")
    cluster.core.create_namespaced_service_account(ns, sa)
    made: list[tuple[Any, str]] = [
        (
            lambda name: cluster.core.delete_namespaced_service_account(name, ns),
            sa["metadata"]["name"],
        )
    ]
    try:
        for create, delete, kind in (
            (rbac.create_cluster_role, rbac.delete_cluster_role, "ClusterRole"),
            (
                rbac.create_cluster_role_binding,
                rbac.delete_cluster_role_binding,
                "ClusterRoleBinding",
            ),
            (
                admission.create_validating_admission_policy,
                admission.delete_validating_admission_policy,
                "ValidatingAdmissionPolicy",
            ),
            (
                admission.create_validating_admission_policy_binding,
                admission.delete_validating_admission_policy_binding,
                "ValidatingAdmissionPolicyBinding",
            ),
        ):
            for doc in by_kind(docs, kind):
                create(doc)
                made.append((delete, doc["metadata"]["name"]))
        yield sa["metadata"]["name"]
    finally:
        for delete, name in reversed(made):
            with contextlib.suppress(ApiException):
                delete(name)


def _pod_token(cluster: Cluster, ns: str, sa: str, pod_name: str = "driver") -> str:
    """A token of ``sa`` bound to a pod on ``NODE`` (as the kubelet mounts one)."""
    pod = cluster.core.create_namespaced_pod(
        ns,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": pod_name},
            "spec": {
                "nodeName": NODE,
                "serviceAccountName": sa,
                "automountServiceAccountToken": False,
                "terminationGracePeriodSeconds": 0,
                "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}],
            },
        },
    )
    answer = cluster.core.create_namespaced_service_account_token(
        sa,
        ns,
        {
            "spec": {
                "audiences": [],
                "expirationSeconds": 3600,
                "boundObjectRef": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": pod_name,
                    "uid": pod.metadata.uid,
                },
            }
        },
    )
    return str(answer.status.token)


def _slice(node: str, name: str, driver: str = DRIVER) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "d0"}],
        },
    }


def _claim(cluster: Cluster, ns: str, name: str, node: str) -> Any:
    """A claim allocated (as the scheduler would) device d0 of ``node``'s pool."""
    api = client.ResourceV1Api(cluster.api)
    claim = api.create_namespaced_resource_claim(
        ns,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name},
            "spec": {
                "devices": {"requests": [{"name": "dev", "exactly": {"deviceClassName": "x"}}]}
            },
        },
    )
    body = api.api_client.sanitize_for_serialization(claim)
    body["status"] = {
        "allocation": {
            "devices": {
                "results": [{"request": "dev", "driver": DRIVER, "pool": node, "device": "d0"}]
            },
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                ]
            },
        }
    }
    return api.replace_namespaced_resource_claim_status(name, ns, body)


def _apply_status(api: client.ApiClient, ns: str, name: str, node: str) -> tuple[int, str]:
    """Server-side apply of a status.devices entry, as the driver writes it: (status, body)."""
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": ns},
        "status": {"devices": [{"driver": DRIVER, "pool": node, "device": "d0"}]},
    }
    response = api.call_api(
        *api.param_serialize(
            "PATCH",
            f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{name}/status",
            query_params=[("fieldManager", f"{DRIVER}/{NODE}"), ("force", "true")],
            header_params={
                "Content-Type": "application/apply-patch+yaml",
                "Accept": "application/json",
            },
            body=json.dumps(body),
            auth_settings=["BearerToken"],
        )
    )
    response.read()
    return int(response.status), response.data.decode()


def test_a_drivers_credentials_write_only_their_own_nodes_slices_and_claims(
    cluster: Cluster, ns: str
) -> None:
    admin = client.ResourceV1Api(cluster.api)
    with _chart_access(cluster, ns) as sa:
        token = _pod_token(cluster, ns, sa)
        as_driver = cluster.client_for(token)
        slices = client.ResourceV1Api(as_driver)
        mine, theirs = f"{NODE}-{ns[-5:]}", f"{OTHER}-{ns[-5:]}"
        gpus = f"gpu-{NODE}-{ns[-5:]}"
        try:
            # the policy takes effect once the API server has loaded it: refused from then on
            refusal: list[ApiException] = []

            def refused() -> bool:
                try:
                    slices.create_resource_slice(_slice(OTHER, theirs))
                except ApiException as exc:
                    if exc.status == 403 and "ValidatingAdmissionPolicy" in str(exc.body):
                        refusal.append(exc)
                        return True
                    raise
                # created before the policy was active; the admin deletes it (the policy,
                # active by now, may refuse the driver's delete of another node's slice)
                admin.delete_resource_slice(theirs)
                return False

            poll_until("the own-node policy refuses another node's slice", refused, 30)
            message = json.loads(refusal[-1].body)["message"]
            assert f"the DRA driver on node {NODE} may write only that node's" in message
            assert f"node {OTHER}" in message
            # its own node's slice: created, updated and deleted
            created = slices.create_resource_slice(_slice(NODE, mine))
            created.spec.pool.generation = 2
            moved = slices.replace_resource_slice(mine, created)
            # moving it to another node is refused too (the role has no "get": reuse it)
            moved.spec.node_name = OTHER
            moved.spec.pool.name = OTHER
            with pytest.raises(ApiException) as exc:
                slices.replace_resource_slice(mine, moved)
            assert exc.value.status in (403, 422)  # the policy, or the immutable nodeName
            slices.delete_resource_slice(mine)
            # another node's slice, written by the admin: the driver may not delete it
            admin.create_resource_slice(_slice(OTHER, theirs))
            with pytest.raises(ApiException) as exc:
                slices.delete_resource_slice(theirs)
            assert exc.value.status == 403
            # another driver's slice of its own node: neither created nor deleted
            with pytest.raises(ApiException) as exc:
                slices.create_resource_slice(_slice(NODE, gpus, GPU_DRIVER))
            assert exc.value.status == 403
            message = json.loads(exc.value.body)["message"]
            assert f"the DRA driver {DRIVER} may write only its own ResourceSlices" in message
            assert f"driver {GPU_DRIVER}" in message
            admin.create_resource_slice(_slice(NODE, gpus, GPU_DRIVER))
            with pytest.raises(ApiException) as exc:
                slices.delete_resource_slice(gpus)
            assert exc.value.status == 403
            assert f"not those of driver {GPU_DRIVER}" in json.loads(exc.value.body)["message"]
            admin.read_resource_slice(gpus)  # still there

            # claim status: this node's claim yes, another node's claim no
            _claim(cluster, ns, "here", NODE)
            _claim(cluster, ns, "there", OTHER)
            status, text = _apply_status(as_driver, ns, "here", NODE)
            assert status == 200, text
            here = admin.read_namespaced_resource_claim("here", ns)
            assert [(d.driver, d.device) for d in here.status.devices] == [(DRIVER, "d0")]
            status, text = _apply_status(as_driver, ns, "there", OTHER)
            # v1.36.2 answers 422 (field status.devices Forbidden): another node's claim
            # needs arbitrary-node:patch, which the chart does not grant
            assert status == 422, text
            assert 'verb=\\"[arbitrary-node:patch]\\"' in text, text
            there = admin.read_namespaced_resource_claim("there", ns)
            assert not there.status.devices
        finally:
            with contextlib.suppress(ApiException):
                admin.delete_resource_slice(theirs)
            with contextlib.suppress(ApiException):
                admin.delete_resource_slice(mine)
            with contextlib.suppress(ApiException):
                admin.delete_resource_slice(gpus)
            as_driver.close()


def test_the_driver_templates_policy_keeps_its_token_to_its_node_and_driver_name(
    cluster: Cluster, ns: str
) -> None:
    """deploy/kubedevice-dra-driver.yaml's RBAC and policy, as shipped (kube-system)."""
    docs = [
        d for d in yaml.safe_load_all((ROOT / "deploy/kubedevice-dra-driver.yaml").read_text()) if d
    ]
    admin = client.ResourceV1Api(cluster.api)
    counter, pod = "counter.example.com", f"counter-{ns[-5:]}"
    mine, theirs, other = (f"{x}-{ns[-5:]}" for x in ("counter", "counter-there", "dev-here"))
    with _access(cluster, docs, "kube-system") as sa:
        as_driver = cluster.client_for(_pod_token(cluster, "kube-system", sa, pod))
        slices = client.ResourceV1Api(as_driver)
        try:

            def refused() -> bool:
                try:
                    slices.create_resource_slice(_slice(OTHER, theirs, counter))
                except ApiException as exc:
                    if exc.status == 403 and "ValidatingAdmissionPolicy" in str(exc.body):
                        return True
                    raise
                # created before the policy was active; the admin deletes it (the policy,
                # active by now, may refuse the driver's delete of another node's slice)
                admin.delete_resource_slice(theirs)
                return False

            poll_until("the template's policy refuses another node's slice", refused, 30)
            slices.create_resource_slice(_slice(NODE, mine, counter))
            slices.delete_resource_slice(mine)
            with pytest.raises(ApiException) as exc:
                slices.create_resource_slice(_slice(NODE, other, DRIVER))
            assert exc.value.status == 403
            message = json.loads(exc.value.body)["message"]
            assert f"counter.example.com on node {NODE} may write only its own" in message
            admin.create_resource_slice(_slice(NODE, other, DRIVER))
            with pytest.raises(ApiException) as exc:
                slices.delete_resource_slice(other)
            assert exc.value.status == 403
        finally:
            for name in (mine, theirs, other):
                with contextlib.suppress(ApiException):
                    admin.delete_resource_slice(name)
            with contextlib.suppress(ApiException):
                cluster.core.delete_namespaced_pod(pod, "kube-system", grace_period_seconds=0)
            as_driver.close()

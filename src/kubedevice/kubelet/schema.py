"""The Pod fields the API server knows, for its strict field validation (``unknown field``).

A deliberately partial schema of ``core/v1`` Pod: every field of Pod, ObjectMeta, PodSpec,
Container and the container sub-objects a device user writes (resources, env, ports,
mounts) is listed, so a typo there is refused with the API server's wording. Objects
further down (volume sources, probes, affinity, security contexts, ...) are accepted
without looking inside (``ANY``); docs/emulator.md says so.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["unknown_fields"]

#: accept anything here (a map with free keys, or an object not modelled)
ANY: dict[str, Any] = {}
_OPEN = "open"


def _obj(*names: str, **nested: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {n: ANY for n in names}
    fields.update(nested)
    return fields


class _List:
    def __init__(self, item: dict[str, Any]) -> None:
        self.item = item


_META = _obj(
    "name",
    "generateName",
    "namespace",
    "selfLink",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "labels",
    "annotations",
    "ownerReferences",
    "finalizers",
    "managedFields",
)
_RESOURCES = _obj("limits", "requests", "claims")
_ENV = _obj("name", "value", "valueFrom")
_ENV_FROM = _obj("prefix", "configMapRef", "secretRef")
_PORT = _obj("name", "hostPort", "containerPort", "protocol", "hostIP")
_MOUNT = _obj(
    "name",
    "readOnly",
    "recursiveReadOnly",
    "mountPath",
    "subPath",
    "mountPropagation",
    "subPathExpr",
)
_VOLUME_DEVICE = _obj("name", "devicePath")
_CONTAINER = _obj(
    "name",
    "image",
    "command",
    "args",
    "workingDir",
    "resizePolicy",
    "restartPolicy",
    "restartPolicyRules",
    "livenessProbe",
    "readinessProbe",
    "startupProbe",
    "lifecycle",
    "terminationMessagePath",
    "terminationMessagePolicy",
    "imagePullPolicy",
    "securityContext",
    "stdin",
    "stdinOnce",
    "tty",
    resources=_RESOURCES,
    env=_List(_ENV),
    envFrom=_List(_ENV_FROM),
    ports=_List(_PORT),
    volumeMounts=_List(_MOUNT),
    volumeDevices=_List(_VOLUME_DEVICE),
)
_SPEC = _obj(
    "volumes",
    "ephemeralContainers",
    "restartPolicy",
    "terminationGracePeriodSeconds",
    "activeDeadlineSeconds",
    "dnsPolicy",
    "nodeSelector",
    "serviceAccountName",
    "serviceAccount",
    "automountServiceAccountToken",
    "nodeName",
    "hostNetwork",
    "hostPID",
    "hostIPC",
    "shareProcessNamespace",
    "securityContext",
    "imagePullSecrets",
    "hostname",
    "hostnameOverride",
    "subdomain",
    "affinity",
    "schedulerName",
    "tolerations",
    "hostAliases",
    "priorityClassName",
    "priority",
    "dnsConfig",
    "readinessGates",
    "runtimeClassName",
    "enableServiceLinks",
    "preemptionPolicy",
    "overhead",
    "topologySpreadConstraints",
    "setHostnameAsFQDN",
    "os",
    "hostUsers",
    "schedulingGates",
    "resourceClaims",
    "resources",
    initContainers=_List(_CONTAINER),
    containers=_List(_CONTAINER),
)
POD = _obj("apiVersion", "kind", "status", metadata=_META, spec=_SPEC)


def _walk(value: Any, schema: Any, path: str, out: list[str]) -> None:
    if isinstance(schema, _List):
        if isinstance(value, list):
            for i, item in enumerate(value):
                _walk(item, schema.item, f"{path}[{i}]", out)
        return
    if schema is ANY or not isinstance(value, Mapping):
        return  # type errors are the validation's business
    for key, sub in value.items():
        name = str(key)
        where = f"{path}.{name}" if path else name
        if name not in schema:
            out.append(where)
        else:
            _walk(sub, schema[name], where, out)


def unknown_fields(manifest: Mapping[str, Any]) -> list[str]:
    """Paths of every field of ``manifest`` a Pod does not have, in document order."""
    out: list[str] = []
    _walk(manifest, POD, "", out)
    return out

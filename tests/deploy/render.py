"""Render the chart with the real helm and validate manifests against Kubernetes schemas."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import kubernetes_validate
import yaml

from deploy.helm import helm

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "kubedevice"
STATIC = [ROOT / "deploy" / "kubedevice.yaml", ROOT / "deploy" / "kubedevice-nvidia.yaml"]
#: The oldest Kubernetes the chart declares (Chart.yaml kubeVersion) and the newest schemas.
KUBE_VERSIONS = ("1.26.0", "1.37.0")
#: Kinds whose schema is not built into Kubernetes (CRDs); checked by the tests directly.
CRD_KINDS = {"PodMonitor"}
#: API groups newer than the oldest version: checked from the first version that has them
#: (resource.k8s.io/v1, DRA, is in Kubernetes 1.34+, as the DRA drivers need).
FIRST_VERSION = {"resource.k8s.io/v1": "1.34.0", "admissionregistration.k8s.io/v1": "1.30.0"}


def render(
    *,
    values: Mapping[str, str] | None = None,
    set_files: Mapping[str, Path] | None = None,
    release: str = "kubedevice",
    namespace: str = "kube-system",
) -> list[dict[str, Any]]:
    """``helm template`` the chart; every document as a dict."""
    args = ["template", release, str(CHART), "--namespace", namespace]
    for key, value in (values or {}).items():
        args += ["--set", f"{key}={value}"]
    for key, path in (set_files or {}).items():
        args += ["--set-file", f"{key}={path}"]
    out = helm(*args).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def load_static(path: Path) -> list[dict[str, Any]]:
    """The documents of a static manifest file."""
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def validate_all(docs: Iterable[dict[str, Any]]) -> int:
    """Validate every built-in kind strictly (unknown fields refused) for each version."""
    n = 0
    for doc in docs:
        if doc["kind"] in CRD_KINDS:
            continue
        first = FIRST_VERSION.get(doc["apiVersion"])
        for version in (first, KUBE_VERSIONS[-1]) if first else KUBE_VERSIONS:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                name = doc.get("metadata", {}).get("name")
                raise AssertionError(f"{doc['kind']} {name} invalid for {version}: {exc}") from exc
        n += 1
    return n


def by_kind(docs: Iterable[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    """Documents of one kind."""
    return [d for d in docs if d["kind"] == kind]


def daemonset(docs: Iterable[dict[str, Any]], component: str) -> dict[str, Any]:
    """The DaemonSet of ``component`` (label app.kubernetes.io/component)."""
    [ds] = [
        d
        for d in by_kind(docs, "DaemonSet")
        if d["metadata"]["labels"]["app.kubernetes.io/component"] == component
    ]
    return ds


def container(ds: dict[str, Any]) -> dict[str, Any]:
    """The one container of a DaemonSet's pod."""
    [c] = ds["spec"]["template"]["spec"]["containers"]
    return c


def dump(doc: Any) -> str:
    """YAML text of ``doc`` (for messages)."""
    return yaml.safe_dump(doc, sort_keys=False)

"""Shipped deployment files: their embedded configs load, and they stay least-privilege."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from kubedevice.generic import parse_config

ROOT = Path(__file__).resolve().parents[1]


def _docs() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((ROOT / "deploy/kubedevice.yaml").read_text()) if d]


def _by_kind(kind: str) -> dict[str, Any]:
    return next(d for d in _docs() if d["kind"] == kind)


def test_configmap_config_is_valid() -> None:
    text = _by_kind("ConfigMap")["data"]["config.yaml"]
    config = parse_config(yaml.safe_load(text), "deploy/kubedevice.yaml")
    assert [r.name for r in config.resources] == [
        "kubedevice.io/fuse",
        "kubedevice.io/kvm",
        "kubedevice.io/tun",
    ]


def test_helm_default_config_is_valid() -> None:
    values = yaml.safe_load((ROOT / "charts/kubedevice/values.yaml").read_text())
    config = parse_config(values["config"], "charts/kubedevice/values.yaml")
    assert config.resources


@pytest.mark.parametrize(
    "path", ["deploy/kubedevice.yaml", "charts/kubedevice/templates/daemonset.yaml"]
)
def test_daemonset_is_least_privilege(path: str) -> None:
    text = (ROOT / path).read_text()
    for needle in (
        "privileged: false",
        "allowPrivilegeEscalation: false",
        "readOnlyRootFilesystem: true",
        'drop: ["ALL"]',
        "automountServiceAccountToken: false",
        "maxSurge: 0",
    ):
        assert needle in text, f"{path} lacks {needle}"
    assert "hostNetwork" not in text
    assert "hostPID" not in text


def test_daemonset_mounts_dev_and_sys_read_only() -> None:
    spec = _by_kind("DaemonSet")["spec"]["template"]["spec"]
    mounts = {m["mountPath"]: m for m in spec["containers"][0]["volumeMounts"]}
    assert mounts["/dev"]["readOnly"] is True
    assert mounts["/sys"]["readOnly"] is True
    assert "readOnly" not in mounts["/var/lib/kubelet/device-plugins"]
    assert spec["containers"][0]["args"][:3] == ["run", "--config", "/etc/kubedevice/config.yaml"]

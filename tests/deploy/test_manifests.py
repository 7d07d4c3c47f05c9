"""Shipped deployment files: their embedded configs load, and they stay least-privilege."""

from __future__ import annotations

import functools
from typing import Any

import pytest
import yaml

from deploy.render import ROOT, STATIC, by_kind, load_static, render
from kubedevice.generic import parse_config
from kubedevice.nvidia.config import parse_config as parse_gpu_config


@functools.cache
def _pods() -> dict[str, dict[str, Any]]:
    """Every pod spec we ship: static manifests and the chart with both components on."""
    out = {}
    for path in STATIC:
        for ds in by_kind(load_static(path), "DaemonSet"):
            out[path.name] = ds["spec"]["template"]["spec"]
    for ds in by_kind(render(values={"nvidia.enabled": "true"}), "DaemonSet"):
        out[f"chart:{ds['metadata']['name']}"] = ds["spec"]["template"]["spec"]
    return out


def test_configmap_config_is_valid() -> None:
    [cm] = by_kind(load_static(ROOT / "deploy/kubedevice.yaml"), "ConfigMap")
    config = parse_config(yaml.safe_load(cm["data"]["config.yaml"]), "deploy/kubedevice.yaml")
    assert [r.name for r in config.resources] == [
        "kubedevice.io/fuse",
        "kubedevice.io/kvm",
        "kubedevice.io/tun",
    ]


def test_helm_default_config_is_valid() -> None:
    values = yaml.safe_load((ROOT / "charts/kubedevice/values.yaml").read_text())
    config = parse_config(
        yaml.safe_load(values["generic"]["config"]), "charts/kubedevice/values.yaml"
    )
    assert config.resources


SHIPPED = [
    "kubedevice.yaml",
    "kubedevice-nvidia.yaml",
    "chart:kubedevice",
    "chart:kubedevice-nvidia",
]


def test_every_shipped_pod_is_checked() -> None:
    assert sorted(_pods()) == sorted(SHIPPED)


@pytest.mark.parametrize("where", SHIPPED)
def test_pods_are_least_privilege(where: str) -> None:
    pod = _pods()[where]
    assert pod["automountServiceAccountToken"] is False
    assert pod["priorityClassName"] == "system-node-critical"
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        assert not pod.get(key), f"{where}: {key}"
    [c] = pod["containers"]
    sc = c["securityContext"]
    assert sc["privileged"] is False
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    # The container's own /dev stays (the runtime writes /dev/termination-log there).
    assert "/dev" not in mounts, where
    assert "/sys" not in mounts, where
    assert mounts["/host/dev"]["readOnly"] is True
    assert mounts["/host/sys"]["readOnly"] is True
    assert "readOnly" not in mounts["/var/lib/kubelet/device-plugins"]
    plugin_dir = c["args"][c["args"].index("--device-plugin-dir") + 1]
    assert plugin_dir == "/var/lib/kubelet/device-plugins"
    assert mounts[plugin_dir]["name"] == "device-plugins"
    assert c["args"][c["args"].index("--dev-root") + 1] == "/host/dev"
    assert c["args"][c["args"].index("--sys-root") + 1] == "/host/sys"
    # never "tolerate everything": each toleration names its taint
    assert all(t.get("key") for t in pod["tolerations"]), where
    assert pod["nodeSelector"]["kubernetes.io/os"] == "linux", where
    limits = c["resources"]["limits"]
    assert "memory" in limits


def test_rolling_update_never_surges() -> None:
    for path in STATIC:
        for ds in by_kind(load_static(path), "DaemonSet"):
            assert ds["spec"]["updateStrategy"]["rollingUpdate"]["maxSurge"] == 0


@pytest.mark.parametrize("source", ["chart", "static"])
def test_gpu_config_is_valid(source: str) -> None:
    if source == "chart":
        docs = render(values={"nvidia.enabled": "true"})
        [cm] = [
            d for d in by_kind(docs, "ConfigMap") if d["metadata"]["name"].endswith("nvidia-config")
        ]
    else:
        [cm] = by_kind(load_static(ROOT / "deploy/kubedevice-nvidia.yaml"), "ConfigMap")
    config = parse_gpu_config(yaml.safe_load(cm["data"]["config.yaml"]), source)
    assert config.flags.mig_strategy == "none"

"""The Helm chart, rendered by a real helm and validated against Kubernetes schemas."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from deploy.helm import helm
from deploy.render import (
    CHART,
    STATIC,
    by_kind,
    container,
    daemonset,
    load_static,
    render,
    validate_all,
)
from kubedevice.generic import parse_config

GPU_ARGS = [
    "nvidia", "run",
    "--config", "/etc/kubedevice/nvidia/config.yaml",
    "--device-plugin-dir", "/var/lib/kubelet/device-plugins",
    "--metrics-address", "0.0.0.0:9401",
    "--dev-root", "/host/dev",
    "--sys-root", "/host/sys",
    "--driver-root", "/host/driver",
    "--host-driver-root", "/",
    "--cdi-dir", "/var/run/cdi",
    "--features-dir", "/etc/kubernetes/node-feature-discovery/features.d",
    "--pod-resources-socket", "/var/lib/kubelet/pod-resources/kubelet.sock",
]  # fmt: skip


def _mounts(ds: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["mountPath"]: m for m in container(ds)["volumeMounts"]}


def _host_path(ds: dict[str, Any], mount_path: str) -> str:
    name = _mounts(ds)[mount_path]["name"]
    vols = {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}
    return str(vols[name]["hostPath"]["path"])


def _config_text(docs: list[dict[str, Any]], name: str) -> str:
    [cm] = [d for d in by_kind(docs, "ConfigMap") if d["metadata"]["name"] == name]
    return str(cm["data"]["config.yaml"])


@pytest.mark.parametrize(
    "values",
    [{}, {"nvidia.enabled": "true"}, {"nvidia.enabled": "true", "generic.enabled": "false"}],
    ids=["default", "gpu-on", "gpu-only"],
)
def test_lint_strict(values: dict[str, str]) -> None:
    args = [f"{k}={v}" for k, v in values.items()]
    proc = helm("lint", "--strict", str(CHART), *(a for s in args for a in ("--set", s)))
    assert "0 chart(s) failed" in proc.stdout


def test_default_render_is_the_generic_plugin_only_and_valid() -> None:
    docs = render()
    assert validate_all(docs) == 2
    assert sorted(d["kind"] for d in docs) == ["ConfigMap", "DaemonSet"]
    ds = daemonset(docs, "generic")
    assert ds["metadata"]["namespace"] == "kube-system"
    assert ds["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
    pod = ds["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == "system-node-critical"
    c = container(ds)
    assert c["image"] == "kubedevice:0.1.0"
    assert c["command"] == ["dumb-init", "--", "kubedevice"]
    assert c["args"] == [
        "run", "--config", "/etc/kubedevice/config.yaml",
        "--device-plugin-dir", "/var/lib/kubelet/device-plugins",
        "--dev-root", "/host/dev", "--sys-root", "/host/sys",
        "--metrics-address", "0.0.0.0:9400",
    ]  # fmt: skip
    config = parse_config(yaml.safe_load(_config_text(docs, "kubedevice-config")), "chart")
    assert [r.name for r in config.resources] == ["kubedevice.io/fuse"]


def test_gpu_component_renders_and_validates() -> None:
    docs = render(values={"nvidia.enabled": "true", "nvidia.driverRoot": "/run/nvidia/driver"})
    assert validate_all(docs) == 4
    ds = daemonset(docs, "nvidia")
    assert ds["metadata"]["name"] == "kubedevice-nvidia"
    pod = ds["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"feature.node.kubernetes.io/pci-10de.present": "true"}
    assert pod["runtimeClassName"] == "nvidia"
    gpu_tolerations = {
        (t["key"], t["effect"]) for t in pod["tolerations"] if t.get("key") == "nvidia.com/gpu"
    }
    assert gpu_tolerations == {("nvidia.com/gpu", "NoSchedule"), ("nvidia.com/gpu", "NoExecute")}
    c = container(ds)
    want = list(GPU_ARGS)
    want[want.index("--host-driver-root") + 1] = "/run/nvidia/driver"
    assert c["args"] == want
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    mounts = _mounts(ds)
    read_only = {p for p, m in mounts.items() if m.get("readOnly")}
    assert read_only == {
        "/var/lib/kubelet/pod-resources",
        "/host/dev",
        "/host/sys",
        "/host/driver",
        "/etc/kubedevice/nvidia",
    }
    assert _host_path(ds, "/host/driver") == "/run/nvidia/driver"
    assert _host_path(ds, "/var/run/cdi") == "/var/run/cdi"
    assert _host_path(ds, "/host/dev") == "/dev"
    assert _host_path(ds, "/etc/kubernetes/node-feature-discovery/features.d") == (
        "/etc/kubernetes/node-feature-discovery/features.d"
    )
    cfg = yaml.safe_load(_config_text(docs, "kubedevice-nvidia-config"))
    assert cfg["version"] == "v1"
    assert cfg["flags"] == {
        "migStrategy": "none",
        "failOnInitError": True,
        "deviceListStrategy": "envvar",
        "deviceIDStrategy": "uuid",
    }
    assert cfg["sharing"]["timeSlicing"]["resources"] == []


def test_gpu_runtime_class_and_security_context_overrides() -> None:
    docs = render(
        values={
            "nvidia.enabled": "true",
            "nvidia.runtimeClassName": "",
            # the API server refuses privileged without privilege escalation: both are needed
            "nvidia.securityContext.privileged": "true",
            "nvidia.securityContext.allowPrivilegeEscalation": "true",
        }
    )
    validate_all(docs)
    gpu = daemonset(docs, "nvidia")
    assert "runtimeClassName" not in gpu["spec"]["template"]["spec"]
    sc = container(gpu)["securityContext"]
    assert sc["privileged"] is True
    assert sc["allowPrivilegeEscalation"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]}  # the rest of the shared context stays
    assert container(daemonset(docs, "generic"))["securityContext"]["privileged"] is False


def test_set_file_config_is_kept_verbatim(tmp_path: Path) -> None:
    text = (
        "# my devices: comments and key order survive\n"
        "version: v1\n"
        "resources:\n"
        "  - name: example.com/serial\n"
        "    groups:\n"
        "      - name: usb-serial\n"
        "        paths:\n"
        "          - path: /dev/ttyUSB*\n"
        "        envs:\n"
        '          SERIAL_PORTS: "{paths}"\n'
    )
    (tmp_path / "devices.yaml").write_text(text)
    (tmp_path / "gpu.yaml").write_text("version: v1\nflags: {migStrategy: single}\n")
    docs = render(
        values={"nvidia.enabled": "true"},
        set_files={
            "generic.config": tmp_path / "devices.yaml",
            "nvidia.config": tmp_path / "gpu.yaml",
        },
    )
    validate_all(docs)
    assert _config_text(docs, "kubedevice-config") == text
    config = parse_config(yaml.safe_load(_config_text(docs, "kubedevice-config")), "set-file")
    assert [r.name for r in config.resources] == ["example.com/serial"]
    assert yaml.safe_load(_config_text(docs, "kubedevice-nvidia-config"))["flags"] == {
        "migStrategy": "single"
    }


def test_existing_configmaps_are_used_and_none_rendered() -> None:
    docs = render(
        values={
            "nvidia.enabled": "true",
            "generic.existingConfigMap": "my-devices",
            "nvidia.existingConfigMap": "my-gpus",
        }
    )
    validate_all(docs)
    assert by_kind(docs, "ConfigMap") == []
    for component, name in (("generic", "my-devices"), ("nvidia", "my-gpus")):
        vols = daemonset(docs, component)["spec"]["template"]["spec"]["volumes"]
        assert {"name": "config", "configMap": {"name": name, "items": [
            {"key": "config.yaml", "path": "config.yaml"}]}} in vols  # fmt: skip


def test_usual_values(tmp_path: Path) -> None:
    docs = render(
        release="edge",
        namespace="kube-system",
        values={
            "fullnameOverride": "dp",
            "image.repository": "registry.example.com/kubedevice",
            "image.tag": "1.2.3",
            "imagePullSecrets[0].name": "regcred",
            "podAnnotations.team": "infra",
            "podLabels.tier": "node",
            "generic.resources.limits.memory": "128Mi",
            "updateStrategy.rollingUpdate.maxUnavailable": "25%",
            "securityContext.runAsUser": "0",
            "generic.nodeSelector.kubernetes\\.io/os": "linux",
        },
    )
    validate_all(docs)
    ds = daemonset(docs, "generic")
    assert ds["metadata"]["name"] == "dp"
    tmpl = ds["spec"]["template"]
    assert tmpl["metadata"]["annotations"]["team"] == "infra"
    assert tmpl["metadata"]["labels"]["tier"] == "node"
    assert ds["spec"]["selector"]["matchLabels"]["app.kubernetes.io/instance"] == "edge"
    assert tmpl["spec"]["imagePullSecrets"] == [{"name": "regcred"}]
    assert tmpl["spec"]["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert ds["spec"]["updateStrategy"]["rollingUpdate"] == {"maxUnavailable": "25%", "maxSurge": 0}
    c = container(ds)
    assert c["image"] == "registry.example.com/kubedevice:1.2.3"
    assert c["resources"]["limits"]["memory"] == "128Mi"
    digest = "sha256:" + "ab" * 32
    docs = render(values={"image.digest": digest, "nameOverride": "devs"})
    ds = daemonset(docs, "generic")
    assert container(ds)["image"] == f"kubedevice@{digest}"
    assert ds["metadata"]["name"] == "kubedevice-devs"


def test_metrics_service_and_pod_monitor() -> None:
    docs = render(
        values={
            "nvidia.enabled": "true",
            "metrics.service.enabled": "true",
            "metrics.podMonitor.enabled": "true",
            "metrics.podMonitor.additionalLabels.release": "prom",
        }
    )
    assert validate_all(docs) == 6  # 2 ConfigMaps, 2 DaemonSets, 2 Services
    services = {s["metadata"]["name"]: s for s in by_kind(docs, "Service")}
    monitors = {m["metadata"]["name"]: m for m in by_kind(docs, "PodMonitor")}
    assert set(monitors) == {"kubedevice", "kubedevice-nvidia"}
    for component, svc_name, port in (
        ("generic", "kubedevice-metrics", 9400),
        ("nvidia", "kubedevice-nvidia-metrics", 9401),
    ):
        ds = daemonset(docs, component)
        pod_labels = ds["spec"]["template"]["metadata"]["labels"]
        ports = {p["name"]: p["containerPort"] for p in container(ds)["ports"]}
        svc = services[svc_name]
        assert svc["spec"]["clusterIP"] == "None"
        assert svc["spec"]["selector"].items() <= pod_labels.items()
        assert svc["spec"]["ports"] == [
            {"name": "metrics", "port": port, "targetPort": "metrics", "protocol": "TCP"}
        ]
        assert ports == {"metrics": port}
        mon = monitors[ds["metadata"]["name"]]
        assert mon["apiVersion"] == "monitoring.coreos.com/v1"
        assert mon["metadata"]["labels"]["release"] == "prom"
        assert mon["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
        assert [e["port"] for e in mon["spec"]["podMetricsEndpoints"]] == ["metrics"]
        # the two components' selectors never pick each other's pods
        other = daemonset(docs, "nvidia" if component == "generic" else "generic")
        other_labels = other["spec"]["template"]["metadata"]["labels"]
        assert not svc["spec"]["selector"].items() <= other_labels.items()


@pytest.mark.parametrize(
    ("setting", "needle"),
    [
        ("config.version=v1", "config"),  # the generic config lives under generic.config
        ("generic.metrics.port=0", "port"),
        ("image.pullPolicy=Sometimes", "pullPolicy"),
        ("nvidia.driverRoot=relative/dir", "driverRoot"),
        ("logLevel=loud", "logLevel"),
    ],
)
def test_schema_refuses_bad_values(setting: str, needle: str) -> None:
    proc = helm("template", "x", str(CHART), "--set", setting, check=False)
    assert proc.returncode != 0
    assert "values don't meet the specifications of the schema" in proc.stderr
    assert needle in proc.stderr


def test_static_manifests_validate_and_match_the_chart() -> None:
    chart = render(values={"nvidia.enabled": "true"})
    for path in STATIC:
        docs = load_static(path)
        assert validate_all(docs) == len(docs) == 2, path
        for ds in by_kind(docs, "DaemonSet"):
            component = ds["metadata"]["labels"]["app.kubernetes.io/component"]
            rendered = daemonset(chart, component)
            assert ds["metadata"]["namespace"] == "kube-system"
            assert ds["metadata"]["name"] == rendered["metadata"]["name"]
            assert ds["spec"]["updateStrategy"] == rendered["spec"]["updateStrategy"]
            # same pod spec as `helm install kubedevice charts/kubedevice -n kube-system`
            assert ds["spec"]["template"]["spec"] == rendered["spec"]["template"]["spec"], path
            # what the pod spec cannot show: its selector picks its pods, its ConfigMap exists
            selector = ds["spec"]["selector"]["matchLabels"]
            assert selector.items() <= ds["spec"]["template"]["metadata"]["labels"].items()
            [cm] = by_kind(docs, "ConfigMap")
            volumes = {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}
            assert volumes["config"]["configMap"]["name"] == cm["metadata"]["name"], path


def test_validation_is_strict() -> None:
    """The negative control: an unknown field or a wrong type fails validation."""
    [ds] = by_kind(render(), "DaemonSet")
    bad = copy.deepcopy(ds)
    bad["spec"]["template"]["spec"]["containers"][0]["resources"]["request"] = {"cpu": "1"}
    with pytest.raises(AssertionError, match="request"):
        validate_all([bad])
    bad = copy.deepcopy(ds)
    bad["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "9400"
    with pytest.raises(AssertionError):
        validate_all([bad])


def test_kube_version_floor() -> None:
    proc = helm("template", "x", str(CHART), "--kube-version", "1.25.0", check=False)
    assert proc.returncode != 0
    assert "kubeVersion" in proc.stderr
    helm("template", "x", str(CHART), "--kube-version", "1.26.0")

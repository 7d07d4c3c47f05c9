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


GPU_AFFINITY = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": key, "operator": "In", "values": ["true"]}]}
                for key in ("feature.node.kubernetes.io/pci-10de.present", "nvidia.com/gpu.present")
            ]
        }
    }
}


def test_gpu_component_renders_and_validates() -> None:
    docs = render(values={"nvidia.enabled": "true", "nvidia.driverRoot": "/run/nvidia/driver"})
    assert validate_all(docs) == 4
    ds = daemonset(docs, "nvidia")
    assert ds["metadata"]["name"] == "kubedevice-nvidia"
    pod = ds["spec"]["template"]["spec"]
    # NFD's PCI label OR nvidia.com/gpu.present, on Linux nodes (as NVIDIA's chart)
    assert pod["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert pod["affinity"] == GPU_AFFINITY
    # no RuntimeClass by default: clusters with only the container toolkit have none
    assert "runtimeClassName" not in pod
    gpu_tolerations = {
        (t["key"], t["effect"]) for t in pod["tolerations"] if t.get("key") == "nvidia.com/gpu"
    }
    assert gpu_tolerations == {("nvidia.com/gpu", "NoSchedule"), ("nvidia.com/gpu", "NoExecute")}
    c = container(ds)
    assert c["args"] == GPU_ARGS  # no CDI strategy: no driver root
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    assert "NVIDIA_MIG_MONITOR_DEVICES" not in env
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    mounts = _mounts(ds)
    read_only = {p for p, m in mounts.items() if m.get("readOnly")}
    assert read_only == {
        "/var/lib/kubelet/pod-resources",
        "/host/dev",
        "/host/sys",
        "/etc/kubedevice/nvidia",
    }
    volumes = {v["name"] for v in pod["volumes"]}
    assert "driver" not in volumes
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


def test_both_daemonsets_run_on_linux_only_and_generic_tolerates_no_taint_by_default() -> None:
    docs = render(values={"nvidia.enabled": "true"})
    for component in ("generic", "nvidia"):
        pod = daemonset(docs, component)["spec"]["template"]["spec"]
        assert pod["nodeSelector"]["kubernetes.io/os"] == "linux", component
    generic = daemonset(docs, "generic")["spec"]["template"]["spec"]
    # not "every taint": a toleration without a key tolerates everything
    assert all(t.get("key") for t in generic["tolerations"]), generic["tolerations"]
    assert generic["tolerations"] == [{"key": "CriticalAddonsOnly", "operator": "Exists"}]


def _gpu_render(tmp_path: Path, flags: str, **values: str) -> dict[str, Any]:
    (tmp_path / "gpu.yaml").write_text(f"version: v1\nflags:\n{flags}")
    docs = render(
        values={"nvidia.enabled": "true", **values},
        set_files={"nvidia.config": tmp_path / "gpu.yaml"},
    )
    validate_all(docs)
    return daemonset(docs, "nvidia")


@pytest.mark.parametrize("strategy", ["single", "mixed"])
def test_gpu_mig_adds_monitor_devices_and_sys_admin(tmp_path: Path, strategy: str) -> None:
    ds = _gpu_render(tmp_path, f"  migStrategy: {strategy}\n")
    c = container(ds)
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["NVIDIA_MIG_MONITOR_DEVICES"] == "all"
    caps = c["securityContext"]["capabilities"]
    assert caps == {"drop": ["ALL"], "add": ["SYS_ADMIN"]}
    assert c["securityContext"]["privileged"] is False
    assert "driver" not in {v["name"] for v in ds["spec"]["template"]["spec"]["volumes"]}


@pytest.mark.parametrize(
    ("driver_root", "host_path", "mount_path"),
    [
        ("/", "/usr", "/host/driver/usr"),
        ("/run/nvidia/driver", "/run/nvidia/driver", "/host/driver"),
    ],
)
def test_gpu_cdi_mounts_only_the_driver_root(
    tmp_path: Path, driver_root: str, host_path: str, mount_path: str
) -> None:
    ds = _gpu_render(
        tmp_path, "  deviceListStrategy: [envvar, cdi-cri]\n", **{"nvidia.driverRoot": driver_root}
    )
    c = container(ds)
    args = c["args"]
    assert args[args.index("--driver-root") + 1] == "/host/driver"
    assert args[args.index("--host-driver-root") + 1] == driver_root
    assert _mounts(ds)[mount_path] == {
        "name": "driver",
        "mountPath": mount_path,
        "readOnly": True,
        "mountPropagation": "HostToContainer",
    }
    assert _host_path(ds, mount_path) == host_path  # never the host's /
    paths = [
        v["hostPath"]["path"] for v in ds["spec"]["template"]["spec"]["volumes"] if "hostPath" in v
    ]
    assert "/" not in paths
    env = {e["name"] for e in c["env"]}
    assert "NVIDIA_MIG_MONITOR_DEVICES" not in env


def test_gpu_existing_configmap_assumes_mig_and_cdi() -> None:
    docs = render(values={"nvidia.enabled": "true", "nvidia.existingConfigMap": "my-gpus"})
    validate_all(docs)
    c = container(daemonset(docs, "nvidia"))
    assert {"name": "NVIDIA_MIG_MONITOR_DEVICES", "value": "all"} in c["env"]
    assert "--driver-root" in c["args"]


def test_default_configs_are_text_that_set_file_replaces_without_a_warning(
    tmp_path: Path,
) -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert isinstance(values["generic"]["config"], str)
    assert isinstance(values["nvidia"]["config"], str)
    (tmp_path / "d.yaml").write_text("version: v1\nresources: []\n")
    proc = helm(
        "template", "x", str(CHART), "--set", "nvidia.enabled=true",
        "--set-file", f"generic.config={tmp_path / 'd.yaml'}",
        "--set-file", f"nvidia.config={tmp_path / 'd.yaml'}",
    )  # fmt: skip
    assert proc.stderr == ""


def test_runtime_class_is_set_only_when_asked_and_notes_say_what_to_set() -> None:
    docs = render(values={"nvidia.enabled": "true", "nvidia.runtimeClassName": "nvidia"})
    validate_all(docs)
    assert daemonset(docs, "nvidia")["spec"]["template"]["spec"]["runtimeClassName"] == "nvidia"
    notes = helm(
        "install", "x", str(CHART), "--dry-run", "--set", "nvidia.enabled=true"
    ).stdout.split("NOTES:", 1)[1]
    assert "No runtimeClassName" in notes
    assert "--set nvidia.runtimeClassName=nvidia" in notes
    notes = helm(
        "install", "x", str(CHART), "--dry-run", "--set", "nvidia.enabled=true",
        "--set", "nvidia.runtimeClassName=nvidia",
    ).stdout.split("NOTES:", 1)[1]  # fmt: skip
    assert "kubectl get runtimeclass nvidia" in notes


def test_gpu_runtime_class_and_security_context_overrides() -> None:
    docs = render(
        values={
            "nvidia.enabled": "true",
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
        # 16.12: what would render invalid or unsafe objects
        ("fullnameOverride=" + "a" * 49, "fullnameOverride"),  # + "-nvidia-metrics" > 63
        ("nameOverride=" + "a" * 64, "nameOverride"),
        ("fullnameOverride=1kd", "fullnameOverride"),
        ("nameOverride=Kube_Device", "nameOverride"),
        ("podLabels.app\\.kubernetes\\.io/component=x", "app.kubernetes.io/component"),
        ("podLabels.app\\.kubernetes\\.io/instance=x", "app.kubernetes.io/instance"),
        ("podLabels.tier=not a label", "podLabels"),
        ("updateStrategy.type=OnDelete", "updateStrategy"),  # with the default rollingUpdate
        ("updateStrategy.rollingUpdate.maxSurge=1", "maxSurge"),
        ("updateStrategy.rollingUpdate.maxSurge=10%", "maxSurge"),
        ("updateStrategy.rollingUpdate.maxUnavailable=0", "maxUnavailable"),
        ("image.repository=Registry.io/Kubedevice", "repository"),
        ("image.repository=kubedevice:1.0", "repository"),
        ("image.tag=1.0 beta", "tag"),
        ("devicePluginDir=/", "devicePluginDir"),
        ("devicePluginDir=//", "devicePluginDir"),
        ("podResourcesDir=/", "podResourcesDir"),
        ("nvidia.featuresDir=/", "featuresDir"),
        ("nvidia.cdiDir=/", "cdiDir"),
        ("nvidia.cdiDir=/var/../etc", "cdiDir"),
        ("generic.config=", "generic/config"),
        ("generic.config=  ", "generic/config"),
        ("nvidia.config=", "nvidia/config"),
        ("generic.existingConfigMap=My_Config", "existingConfigMap"),
        ("nvidia.runtimeClassName=Nvidia Runtime", "runtimeClassName"),
    ],
)
def test_schema_refuses_bad_values(setting: str, needle: str) -> None:
    proc = helm("template", "x", str(CHART), "--set", setting, check=False)
    assert proc.returncode != 0
    assert "values don't meet the specifications of the schema" in proc.stderr
    assert needle in proc.stderr


@pytest.mark.parametrize("key", ["devicePluginDir", "podResourcesDir", "nvidia.cdiDir",
                                 "nvidia.featuresDir", "nvidia.driverRoot"])  # fmt: skip
def test_schema_refuses_host_paths_with_newlines(key: str) -> None:
    proc = helm("template", "x", str(CHART), "--set-string", f"{key}=/var/lib/x\n  evil: 1",
                check=False)  # fmt: skip
    assert proc.returncode != 0
    assert key.split(".")[-1] in proc.stderr


@pytest.mark.parametrize(
    "settings",
    [
        ["updateStrategy.type=OnDelete", "updateStrategy.rollingUpdate=null"],
        ["updateStrategy.rollingUpdate.maxUnavailable=25%"],
        ["fullnameOverride=" + "a" * 48, "metrics.service.enabled=true", "nvidia.enabled=true"],
        ["podLabels.tier=node", "podLabels.example\\.com/team=infra"],
        ["image.repository=registry.example.com:5000/infra/kube-device", "image.tag=v1.2.3_rc.1"],
        ["nvidia.driverRoot=/", "devicePluginDir=/var/lib/kubelet/device-plugins"],
    ],
    ids=["on-delete", "percent", "longest-name", "labels", "image", "paths"],
)
def test_schema_accepts_valid_values(settings: list[str]) -> None:
    docs = render(values=dict(s.split("=", 1) for s in settings))
    validate_all(docs)


def test_interpolated_host_paths_are_quoted() -> None:
    """A path YAML would read as something else (here a number-like or ``:``-bearing
    one) stays the string given."""
    docs = render(
        values={
            "nvidia.enabled": "true",
            "nvidia.cdiDir": "/var/run/cdi: x",
            "nvidia.featuresDir": "/etc/nfd #features",
            "podResourcesDir": "/var/lib/kubelet/pod-resources",
            "devicePluginDir": "/var/lib/kubelet/device-plugins",
        }
    )
    ds = daemonset(docs, "nvidia")
    assert _host_path(ds, "/var/run/cdi") == "/var/run/cdi: x"
    assert _host_path(ds, "/etc/kubernetes/node-feature-discovery/features.d") == (
        "/etc/nfd #features"
    )


def test_release_name_starting_with_a_digit_is_refused_for_services() -> None:
    proc = helm("template", "1x", str(CHART), "--set", "metrics.service.enabled=true",
                check=False)  # fmt: skip
    assert proc.returncode != 0
    assert "must start with a letter" in proc.stderr


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


def test_gpu_sharing_mps_adds_host_pid_compute_and_the_mps_dirs(tmp_path: Path) -> None:
    """sharing.mps in nvidia.config: the plugin runs MPS daemons, so its pod gets host PID,
    the compute capability and flags.mpsRoot (with its shm dir as /dev/shm); not without."""
    plain = _gpu_render(tmp_path, "  migStrategy: none\n")
    assert "hostPID" not in plain["spec"]["template"]["spec"]
    assert "/dev/shm" not in _mounts(plain)
    assert "/host/sys/fs/cgroup" not in _mounts(plain)
    assert "--host-cgroup-root" not in container(plain)["args"]
    assert "add" not in container(plain)["securityContext"]["capabilities"]
    sharing = "sharing:\n  mps:\n    resources: [{name: nvidia.com/gpu, replicas: 4}]\n"
    ds = _gpu_render(tmp_path, f"  mpsRoot: /run/mps\n{sharing}")
    assert ds["spec"]["template"]["spec"]["hostPID"] is True
    env = {e["name"]: e["value"] for e in container(ds)["env"]}
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "utility,compute"
    assert _host_path(ds, "/run/mps") == "/run/mps"
    assert _host_path(ds, "/dev/shm") == "/run/mps/shm"
    assert container(ds)["securityContext"]["privileged"] is False
    # the daemons in cgroups of their own, through the host's cgroup tree, outlive the pod
    args = container(ds)["args"]
    assert args[args.index("--host-cgroup-root") + 1] == "/host/sys/fs/cgroup"
    assert _host_path(ds, "/host/sys/fs/cgroup") == "/sys/fs/cgroup"
    assert not _mounts(ds)["/host/sys/fs/cgroup"].get("readOnly")
    # uid 0 makes their parent cgroup at each hierarchy's root (mode 0555); with MIG too
    assert container(ds)["securityContext"]["capabilities"]["add"] == ["DAC_OVERRIDE"]
    mig = _gpu_render(tmp_path, f"  migStrategy: single\n{sharing}")
    assert container(mig)["securityContext"]["capabilities"]["add"] == ["SYS_ADMIN", "DAC_OVERRIDE"]
    off = _gpu_render(
        tmp_path, f"  mpsRoot: /run/mps\n{sharing}", **{"nvidia.mpsOutlivesPod": "false"}
    )
    assert off["spec"]["template"]["spec"]["hostPID"] is True
    assert "/host/sys/fs/cgroup" not in _mounts(off)
    assert "--host-cgroup-root" not in container(off)["args"]
    assert "add" not in container(off)["securityContext"]["capabilities"]
    hashes = {d["spec"]["template"]["metadata"]["annotations"]["kubedevice.io/args-hash"]
              for d in (ds, off)}  # fmt: skip
    assert len(hashes) == 2  # switching it rolls the pods

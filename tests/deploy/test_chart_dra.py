"""The chart's DRA drivers (values ``dra.*``): rendered by a real helm, schema-validated."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from deploy.helm import helm
from deploy.render import CHART, by_kind, container, daemonset, render, validate_all

DRA_ON = {"dra.nvidia.enabled": "true", "dra.generic.enabled": "true"}
#: The GPU plugin on too, its nodes split from the GPU DRA driver's (the chart refuses both
#: on the same nodes): the driver on nodes labelled for it.
GPU_SPLIT = {
    "nvidia.enabled": "true",
    "dra.nvidia.nodeSelector.example\\.com/gpu-mode": "dra",
}


def _named(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    [doc] = [d for d in by_kind(docs, kind) if d["metadata"]["name"] == name]
    return doc


def _volumes(ds: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}


def _host_path(ds: dict[str, Any], mount_path: str) -> str:
    [mount] = [m for m in container(ds)["volumeMounts"] if m["mountPath"] == mount_path]
    return str(_volumes(ds)[mount["name"]]["hostPath"]["path"])


def test_off_by_default() -> None:
    docs = render()
    assert not [d for d in docs if "dra" in d["metadata"]["name"]]


def test_lint_strict_with_both_drivers() -> None:
    args = [a for k, v in DRA_ON.items() for a in ("--set", f"{k}={v}")]
    proc = helm("lint", "--strict", str(CHART), *args)
    assert "0 chart(s) failed" in proc.stdout


def test_both_drivers_render_and_validate() -> None:
    docs = render(values=DRA_ON)
    # generic plugin DaemonSet + its ConfigMap, the GPU config for the DRA driver, per driver
    # (ServiceAccount, ClusterRole, ClusterRoleBinding, DaemonSet, ValidatingAdmissionPolicy
    # and its binding), and the DeviceClasses of nvidia.com/gpu and kubedevice.io/fuse
    assert validate_all(docs) == 2 + 1 + 2 * 6 + 2
    gpu = daemonset(docs, "dra-nvidia")
    gen = daemonset(docs, "dra-generic")
    assert gpu["metadata"]["name"] == "kubedevice-dra-nvidia"
    assert container(gpu)["args"] == [
        "nvidia", "dra", "--config", "/etc/kubedevice/nvidia/config.yaml",
        "--driver-name", "gpu.kubedevice.io", "--kubelet-dir", "/var/lib/kubelet",
        "--cdi-dir", "/var/run/cdi", "--dev-root", "/host/dev", "--sys-root", "/host/sys",
        "--metrics-address", "0.0.0.0:9402",
        "--driver-root", "/host/driver", "--host-driver-root", "/",
    ]  # fmt: skip
    assert container(gen)["args"] == [
        "run", "--dra", "--config", "/etc/kubedevice/config.yaml",
        "--driver-name", "dev.kubedevice.io", "--kubelet-dir", "/var/lib/kubelet",
        "--cdi-dir", "/var/run/cdi", "--dev-root", "/host/dev", "--sys-root", "/host/sys",
        "--metrics-address", "0.0.0.0:9403",
    ]  # fmt: skip
    for ds in (gpu, gen):
        pod = ds["spec"]["template"]["spec"]
        assert pod["automountServiceAccountToken"] is True
        assert pod["serviceAccountName"] == ds["metadata"]["name"]
        env = {e["name"]: e for e in container(ds)["env"]}
        assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
        assert _host_path(ds, "/var/lib/kubelet/plugins_registry") == (
            "/var/lib/kubelet/plugins_registry"
        )
        assert _host_path(ds, "/var/lib/kubelet/plugins") == "/var/lib/kubelet/plugins"
        assert _host_path(ds, "/var/run/cdi") == "/var/run/cdi"
        assert _host_path(ds, "/host/dev") == "/dev"
        # a DRA driver has no business in the device-plugin directory
        assert "/var/lib/kubelet/device-plugins" not in {
            m["mountPath"] for m in container(ds)["volumeMounts"]
        }
    assert "runtimeClassName" not in gpu["spec"]["template"]["spec"]  # unset by default
    # the GPU driver reads the GPU plugin's config (rendered for it: the plugin is off)
    cm = _named(docs, "ConfigMap", "kubedevice-nvidia-config")
    assert "migStrategy: none" in cm["data"]["config.yaml"]
    assert _volumes(gpu)["config"]["configMap"]["name"] == "kubedevice-nvidia-config"
    assert _volumes(gen)["config"]["configMap"]["name"] == "kubedevice-config"


@pytest.mark.parametrize("component", ["nvidia", "generic"])
def test_rbac_is_exactly_what_a_driver_needs(component: str) -> None:
    docs = render(values=DRA_ON)
    name = f"kubedevice-dra-{component}"
    role = _named(docs, "ClusterRole", name)
    rules = {
        (g, r): sorted(rule["verbs"])
        for rule in role["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
    }
    assert rules == {
        ("resource.k8s.io", "resourceclaims"): ["get"],
        ("resource.k8s.io", "resourceclaims/status"): ["get", "patch", "update"],
        # Kubernetes 1.36: status.devices of claims on the driver's own node only
        ("resource.k8s.io", "resourceclaims/driver"): [
            "associated-node:patch",
            "associated-node:update",
        ],
        ("resource.k8s.io", "resourceslices"): sorted(
            ["list", "watch", "create", "update", "delete"]
        ),
        ("", "nodes"): ["get"],
    }
    [driver_rule] = [r for r in role["rules"] if r["resources"] == ["resourceclaims/driver"]]
    driver = {"nvidia": "gpu.kubedevice.io", "generic": "dev.kubedevice.io"}[component]
    assert driver_rule["resourceNames"] == [driver]  # this driver's claims' status only
    binding = _named(docs, "ClusterRoleBinding", name)
    assert binding["roleRef"]["name"] == name
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": name, "namespace": "kube-system"}
    ]
    assert _named(docs, "ServiceAccount", name)["metadata"]["namespace"] == "kube-system"


def test_values_follow_through() -> None:
    docs = render(
        values={
            **DRA_ON,
            "dra.kubeletDir": "/data/kubelet",
            "dra.cdiDir": "/etc/cdi",
            "dra.nvidia.driverName": "gpu.nvidia.com",
            "dra.nvidia.driverRoot": "/run/nvidia/driver",
            "dra.nvidia.runtimeClassName": "",
            **GPU_SPLIT,
        }
    )
    validate_all(docs)
    gpu = daemonset(docs, "dra-nvidia")
    args = container(gpu)["args"]
    assert args[args.index("--driver-name") + 1] == "gpu.nvidia.com"
    assert args[args.index("--kubelet-dir") + 1] == "/data/kubelet"
    assert args[args.index("--host-driver-root") + 1] == "/run/nvidia/driver"
    assert _host_path(gpu, "/data/kubelet/plugins") == "/data/kubelet/plugins"
    assert _host_path(gpu, "/var/run/cdi") == "/etc/cdi"
    assert _host_path(gpu, "/host/driver") == "/run/nvidia/driver"
    assert "runtimeClassName" not in gpu["spec"]["template"]["spec"]
    # with the GPU plugin on, its ConfigMap is the one rendered (once)
    assert len([d for d in by_kind(docs, "ConfigMap") if "nvidia" in d["metadata"]["name"]]) == 1


@pytest.mark.parametrize(
    ("setting", "needle"),
    [
        ("dra.nvidia.driverName=Not_A_Name", "driverName"),
        ("dra.generic.bogus=1", "bogus"),
        ("dra.kubeletDir=relative/dir", "kubeletDir"),
        ("dra.updateStrategy.type=Recreate", "updateStrategy"),
        ("dra.updateStrategy.rollingUpdate.maxSurge=-1", "maxSurge"),
        ("dra.updateStrategy.rollingUpdate.bogus=1", "bogus"),
    ],
    ids=["driver-name", "unknown-key", "relative-dir", "strategy", "surge", "rolling-key"],
)
def test_schema_refuses_bad_dra_values(setting: str, needle: str) -> None:
    proc = helm("template", "x", str(CHART), "--set", setting, check=False)
    assert proc.returncode != 0
    assert needle in proc.stderr


def test_dra_drivers_roll_with_a_surge_and_name_their_sockets_by_the_pod_uid() -> None:
    """A new driver pod starts beside the old one (maxSurge 1, maxUnavailable 0) with the
    pod UID from the downward API; the device plugins keep maxSurge 0 (the kubelet cannot
    run two device plugins for one resource)."""
    docs = render(values={**DRA_ON, **GPU_SPLIT})
    for component in ("dra-nvidia", "dra-generic"):
        ds = daemonset(docs, component)
        assert ds["spec"]["updateStrategy"] == {
            "type": "RollingUpdate",
            "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
        }
        env = {e["name"]: e for e in container(ds)["env"]}
        assert env["POD_UID"] == {
            "name": "POD_UID",
            "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}},
        }
    for component in ("nvidia", "generic"):
        rolling = daemonset(docs, component)["spec"]["updateStrategy"]["rollingUpdate"]
        assert rolling["maxSurge"] == 0
        assert "POD_UID" not in {e["name"] for e in container(daemonset(docs, component))["env"]}
    on_delete = render(
        values={**DRA_ON, "dra.updateStrategy.type": "OnDelete",
                "dra.updateStrategy.rollingUpdate": "null"}
    )  # fmt: skip
    validate_all(on_delete)
    assert daemonset(on_delete, "dra-generic")["spec"]["updateStrategy"] == {"type": "OnDelete"}


def test_a_sigterm_waits_for_the_calls_in_flight_a_little_under_the_pods_grace() -> None:
    """The pod's terminationGracePeriodSeconds and the driver's stop grace come from one
    value, the driver's 2 s under it (the rest of its stop fits before the SIGKILL)."""
    key = "dra.terminationGracePeriodSeconds"
    for values, pod, driver in (({}, 30, "28"), ({key: "90"}, 90, "88"), ({key: "1"}, 1, "0")):
        docs = render(values={**DRA_ON, **values})
        for component in ("dra-nvidia", "dra-generic"):
            ds = daemonset(docs, component)
            assert ds["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == pod
            env = {e["name"]: e.get("value") for e in container(ds)["env"]}
            assert env["KUBEDEVICE_STOP_GRACE"] == driver
    proc = helm("template", "x", str(CHART), "--set", "dra.terminationGracePeriodSeconds=0",
                check=False)  # fmt: skip
    assert proc.returncode != 0
    assert "terminationGracePeriodSeconds" in proc.stderr


@pytest.mark.parametrize(
    ("component", "depth"), [("dra-generic", 1), ("dra-nvidia", 2)], ids=["generic", "nvidia"]
)
def test_rendered_dra_options_exist(component: str, depth: int) -> None:
    import click

    from kubedevice.cli.main import cli

    args = container(daemonset(render(values=DRA_ON), component))["args"]
    ctx = click.Context(cli)
    cmd: click.Command = cli
    for name in args[:depth]:
        assert isinstance(cmd, click.Group)
        sub = cmd.get_command(ctx, name)
        assert sub is not None, name
        cmd = sub
    known = {opt for p in cmd.params for opt in p.opts if opt.startswith("--")}
    passed = [a for a in args[depth:] if a.startswith("--")]
    assert "--driver-name" in passed
    assert sorted(set(passed) - known) == []


# ---------------------------------------------------------------- hardening (audits 14-16)

# the kit's guide (a driver of your own) and the drivers' guide (the chart's DaemonSets)
DOCS_DRA = [CHART.parents[1] / "docs" / name for name in ("dra.md", "dra-drivers.md")]


def _pod(ds: dict[str, Any]) -> dict[str, Any]:
    return dict(ds["spec"]["template"]["spec"])


def _notes(*settings: str) -> str:
    args = [a for s in settings for a in ("--set", s)]
    out = helm("install", "x", str(CHART), "--dry-run", *args).stdout
    return out.split("NOTES:", 1)[1]


def test_gpu_driver_runtime_class_is_set_only_when_asked_and_notes_say_what_to_set() -> None:
    gpu = daemonset(render(values={"dra.nvidia.enabled": "true"}), "dra-nvidia")
    # unset by default, as for the GPU plugin: clusters with only the toolkit have no RuntimeClass
    assert "runtimeClassName" not in _pod(gpu)
    docs = render(values={"dra.nvidia.enabled": "true", "dra.nvidia.runtimeClassName": "nvidia"})
    validate_all(docs)
    assert _pod(daemonset(docs, "dra-nvidia"))["runtimeClassName"] == "nvidia"
    notes = _notes("dra.nvidia.enabled=true")
    assert "DaemonSet x-kubedevice-dra-nvidia" in notes
    assert "--set dra.nvidia.runtimeClassName=nvidia" in notes
    notes = _notes("dra.nvidia.enabled=true", "dra.nvidia.runtimeClassName=nvidia")
    assert "kubectl get runtimeclass nvidia" in notes


@pytest.mark.parametrize(
    ("driver_root", "host_path", "mount_path"),
    [
        ("/", "/usr", "/host/driver/usr"),
        ("/run/nvidia/driver", "/run/nvidia/driver", "/host/driver"),
    ],
    ids=["host-install", "driver-container"],
)
def test_gpu_driver_mounts_only_the_driver_root(
    driver_root: str, host_path: str, mount_path: str
) -> None:
    """The claims' CDI specs list the driver's files (found under --driver-root): the driver
    root is mounted, and for a host install only its /usr, never the host's /."""
    docs = render(values={"dra.nvidia.enabled": "true", "dra.nvidia.driverRoot": driver_root})
    validate_all(docs)
    gpu = daemonset(docs, "dra-nvidia")
    args = container(gpu)["args"]
    assert args[args.index("--driver-root") + 1] == "/host/driver"
    assert args[args.index("--host-driver-root") + 1] == driver_root
    [mount] = [m for m in container(gpu)["volumeMounts"] if m["name"] == "driver"]
    assert mount == {
        "name": "driver",
        "mountPath": mount_path,
        "readOnly": True,
        "mountPropagation": "HostToContainer",
    }
    assert _host_path(gpu, mount_path) == host_path
    paths = [v["hostPath"]["path"] for v in _pod(gpu)["volumes"] if "hostPath" in v]
    assert "/" not in paths


def _gpu_config(tmp_path: Path, mig: str) -> dict[str, Path]:
    (tmp_path / "gpu.yaml").write_text(f"version: v1\nflags:\n  migStrategy: {mig}\n")
    return {"nvidia.config": tmp_path / "gpu.yaml"}


@pytest.mark.parametrize("strategy", ["single", "mixed"])
def test_gpu_driver_mig_adds_monitor_devices_and_sys_admin(tmp_path: Path, strategy: str) -> None:
    """The DRA driver reads migStrategy from nvidia.config, as the GPU plugin does: its pod
    gets what the GPU plugin's gets for MIG."""
    docs = render(values={"dra.nvidia.enabled": "true"}, set_files=_gpu_config(tmp_path, strategy))
    validate_all(docs)
    c = container(daemonset(docs, "dra-nvidia"))
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["NVIDIA_MIG_MONITOR_DEVICES"] == "all"
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["SYS_ADMIN"]}
    assert c["securityContext"]["privileged"] is False
    # an existing ConfigMap cannot be read: MIG is assumed, as for the GPU plugin
    docs = render(values={"dra.nvidia.enabled": "true", "nvidia.existingConfigMap": "my-gpus"})
    env = {e["name"]: e.get("value") for e in container(daemonset(docs, "dra-nvidia"))["env"]}
    assert env["NVIDIA_MIG_MONITOR_DEVICES"] == "all"


def test_gpu_driver_without_mig_gets_neither(tmp_path: Path) -> None:
    docs = render(values={"dra.nvidia.enabled": "true"}, set_files=_gpu_config(tmp_path, "none"))
    c = container(daemonset(docs, "dra-nvidia"))
    assert "NVIDIA_MIG_MONITOR_DEVICES" not in {e["name"] for e in c["env"]}
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_drivers_schedule_as_the_device_plugins_do() -> None:
    """Linux nodes only; the GPU driver on the GPU plugin's GPU nodes (NFD's PCI label OR
    nvidia.com/gpu.present) with its tolerations; the /dev driver tolerates no taint by
    default."""
    docs = render(values=DRA_ON)
    plugins = render(values={"nvidia.enabled": "true"})
    plugin = {c: _pod(daemonset(plugins, c)) for c in ("nvidia", "generic")}
    for component in ("dra-nvidia", "dra-generic"):
        assert _pod(daemonset(docs, component))["nodeSelector"] == {"kubernetes.io/os": "linux"}
    gpu = _pod(daemonset(docs, "dra-nvidia"))
    terms = gpu["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert [t["matchExpressions"] for t in terms["nodeSelectorTerms"]] == [
        [{"key": key, "operator": "In", "values": ["true"]}]
        for key in ("feature.node.kubernetes.io/pci-10de.present", "nvidia.com/gpu.present")
    ]
    assert gpu["affinity"] == plugin["nvidia"]["affinity"]
    assert gpu["tolerations"] == plugin["nvidia"]["tolerations"]
    gen = _pod(daemonset(docs, "dra-generic"))
    # a toleration without a key tolerates every taint
    assert all(t.get("key") for t in gen["tolerations"]), gen["tolerations"]
    assert gen["tolerations"] == plugin["generic"]["tolerations"]
    assert "affinity" not in gen


def test_gpu_driver_follows_the_gpu_plugins_affinity_unless_given_its_own() -> None:
    key = "nvidia\\.com/gpu\\.present"
    own = "example\\.com/gpu"
    term = "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
    changed = {
        "dra.nvidia.enabled": "true",
        f"nvidia.{term}.nodeSelectorTerms[0].matchExpressions[0].key": key.replace("\\", ""),
    }
    gpu = _pod(daemonset(render(values=changed), "dra-nvidia"))
    terms = gpu["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"][0]["matchExpressions"][0]["key"] == "nvidia.com/gpu.present"
    docs = render(
        values={
            "dra.nvidia.enabled": "true",
            f"dra.nvidia.{term}.nodeSelectorTerms[0].matchExpressions[0].key": own,
            f"dra.nvidia.{term}.nodeSelectorTerms[0].matchExpressions[0].operator": "Exists",
        }
    )
    validate_all(docs)
    gpu = _pod(daemonset(docs, "dra-nvidia"))
    assert gpu["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == {
        "nodeSelectorTerms": [
            {"matchExpressions": [{"key": "example.com/gpu", "operator": "Exists"}]}
        ]
    }


def test_interpolated_dra_host_paths_are_quoted() -> None:
    """A path YAML would read as something else (a ``: `` or `` #``) stays the string given."""
    docs = render(
        values={
            **DRA_ON,
            "dra.cdiDir": "/var/run/cdi: x",
            "dra.kubeletDir": "/data/kubelet #k",
            "dra.nvidia.driverRoot": "/run/nvidia #driver",
        }
    )
    validate_all(docs)
    for component in ("dra-nvidia", "dra-generic"):
        ds = daemonset(docs, component)
        assert _host_path(ds, "/var/run/cdi") == "/var/run/cdi: x"
        assert _host_path(ds, "/data/kubelet #k/plugins") == "/data/kubelet #k/plugins"
        assert _host_path(ds, "/data/kubelet #k/plugins_registry") == (
            "/data/kubelet #k/plugins_registry"
        )
        args = container(ds)["args"]
        assert args[args.index("--kubelet-dir") + 1] == "/data/kubelet #k"
    gpu = daemonset(docs, "dra-nvidia")
    assert _host_path(gpu, "/host/driver") == "/run/nvidia #driver"
    args = container(gpu)["args"]
    assert args[args.index("--host-driver-root") + 1] == "/run/nvidia #driver"


@pytest.mark.parametrize(
    ("setting", "needle"),
    [
        ("dra.cdiDir=/", "cdiDir"),
        ("dra.cdiDir=//", "cdiDir"),
        ("dra.cdiDir=/var/../etc", "cdiDir"),
        ("dra.cdiDir=var/run/cdi", "cdiDir"),
        ("dra.kubeletDir=/", "kubeletDir"),
        ("dra.kubeletDir=/var/lib/kubelet/..", "kubeletDir"),
        ("dra.nvidia.driverRoot=/run/../", "driverRoot"),
        ("dra.nvidia.driverRoot=run/nvidia", "driverRoot"),
        ("dra.nvidia.runtimeClassName=Nvidia Runtime", "runtimeClassName"),
    ],
)
def test_schema_refuses_unsafe_dra_paths(setting: str, needle: str) -> None:
    proc = helm("template", "x", str(CHART), "--set", "dra.nvidia.enabled=true",
                "--set", setting, check=False)  # fmt: skip
    assert proc.returncode != 0
    assert "values don't meet the specifications of the schema" in proc.stderr
    assert needle in proc.stderr


@pytest.mark.parametrize("key", ["dra.cdiDir", "dra.kubeletDir", "dra.nvidia.driverRoot"])
def test_schema_refuses_dra_host_paths_with_newlines(key: str) -> None:
    proc = helm("template", "x", str(CHART), "--set", "dra.nvidia.enabled=true",
                "--set-string", f"{key}=/var/lib/x\n  evil: 1", check=False)  # fmt: skip
    assert proc.returncode != 0
    assert "values don't meet the specifications of the schema" in proc.stderr
    assert key.split(".")[-1] in proc.stderr


@pytest.mark.parametrize("component", ["generic", "nvidia"])
def test_schema_refuses_a_null_config(component: str, tmp_path: Path) -> None:
    values = {"dra.nvidia.enabled": "true", "dra.generic.enabled": "true"}
    sets = [a for k, v in values.items() for a in ("--set", f"{k}={v}")]
    proc = helm("template", "x", str(CHART), *sets, "--set", f"{component}.config=null",
                check=False)  # fmt: skip
    assert proc.returncode != 0
    assert "values don't meet the specifications of the schema" in proc.stderr
    assert f"at '/{component}': missing property 'config'" in proc.stderr
    assert f"at '/{component}/existingConfigMap'" in proc.stderr  # or give that instead
    (tmp_path / "v.yaml").write_text(f"{component}:\n  config: ~\n")
    proc = helm("template", "x", str(CHART), *sets, "-f", str(tmp_path / "v.yaml"), check=False)
    assert proc.returncode != 0
    assert f"at '/{component}': missing property 'config'" in proc.stderr
    # with an existing ConfigMap the chart renders no config: none needed
    render(values={**values, f"{component}.config": "null",
                   f"{component}.existingConfigMap": "mine"})  # fmt: skip


def test_docs_state_the_charts_rbac_and_no_uninstall_hook() -> None:
    """docs/dra.md and docs/dra-drivers.md say exactly the verbs the chart grants on
    resourceslices, and promise no uninstall hook the chart does not have."""
    import re

    text = "\n".join(doc.read_text() for doc in DOCS_DRA)
    role = _named(render(values=DRA_ON), "ClusterRole", "kubedevice-dra-nvidia")
    [granted] = [sorted(r["verbs"]) for r in role["rules"] if r["resources"] == ["resourceslices"]]
    stated = re.findall(r"((?:`[a-z]+`(?:,\s+|\s+and\s+)?)+)\s+on\s+`resourceslices`", text)
    assert len(stated) >= 2, stated
    for verbs in stated:
        assert sorted(re.findall(r"`([a-z]+)`", verbs)) == granted, verbs
    hooks = helm("template", "x", str(CHART), *(a for k, v in DRA_ON.items()
                                               for a in ("--set", f"{k}={v}"))).stdout  # fmt: skip
    if "helm.sh/hook" not in hooks:
        assert "pre-delete" not in text
        assert "no uninstall hook" in text


# ---------------------------------------------------------------- health, probes, admission


@pytest.mark.parametrize(("component", "port"), [("nvidia", 9402), ("generic", 9403)])
def test_probes_are_http_on_the_metrics_port_with_no_shell(component: str, port: int) -> None:
    c = container(daemonset(render(values=DRA_ON), f"dra-{component}"))
    assert c["ports"] == [{"name": "metrics", "containerPort": port, "protocol": "TCP"}]
    assert f"0.0.0.0:{port}" in c["args"]
    for probe, path in (
        ("startupProbe", "/healthz"),
        ("livenessProbe", "/healthz"),
        ("readinessProbe", "/readyz"),
    ):
        assert c[probe]["httpGet"] == {"path": path, "port": "metrics"}
        assert "exec" not in c[probe]


def test_evict_on_becomes_flags_and_the_schema_refuses_a_bad_fault() -> None:
    docs = render(values={**DRA_ON, "dra.nvidia.evictOn": "{xid=79,gpu-lost}"})
    args = container(daemonset(docs, "dra-nvidia"))["args"]
    at = args.index("--evict-on")
    assert args[at : at + 4] == ["--evict-on", "xid=79", "--evict-on", "gpu-lost"]
    assert "--evict-on" not in container(daemonset(docs, "dra-generic"))["args"]
    proc = helm(
        "template", "x", str(CHART), "--set", "dra.nvidia.enabled=true",
        "--set", "dra.nvidia.evictOn={xid=}", check=False,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "evictOn" in proc.stderr


def test_each_drivers_service_account_may_write_only_its_own_slices_of_its_own_node() -> None:
    docs = render(values=DRA_ON)
    for component in ("nvidia", "generic"):
        name = f"kubedevice-dra-{component}"
        policy = _named(docs, "ValidatingAdmissionPolicy", f"{name}-own-node")
        spec = policy["spec"]
        assert spec["failurePolicy"] == "Fail"
        [rule] = spec["matchConstraints"]["resourceRules"]
        assert rule["resources"] == ["resourceslices"]
        assert sorted(rule["operations"]) == ["CREATE", "DELETE", "UPDATE"]
        [match] = spec["matchConditions"]
        assert f'"system:serviceaccount:kube-system:{name}"' in match["expression"]
        variables = {v["name"]: v["expression"] for v in spec["variables"]}
        assert "authentication.kubernetes.io/node-name" in variables["node"]
        assert "object.spec.?driver" in variables["sliceDrivers"]
        assert "oldObject.spec.?driver" in variables["sliceDrivers"]  # UPDATE and DELETE
        driver = f"{component.replace('nvidia', 'gpu').replace('generic', 'dev')}.kubedevice.io"
        own = [v["expression"] for v in spec["validations"] if "sliceDrivers" in v["expression"]]
        assert own == [f"variables.sliceDrivers.all(d, d == '{driver}')"]
        binding = _named(docs, "ValidatingAdmissionPolicyBinding", f"{name}-own-node")
        assert binding["spec"] == {"policyName": f"{name}-own-node", "validationActions": ["Deny"]}
    off = render(values={**DRA_ON, "dra.nodeRestriction": "false"})
    assert not by_kind(off, "ValidatingAdmissionPolicy")


def _pod_annotations(docs: list[dict[str, Any]], component: str) -> dict[str, str]:
    return dict(daemonset(docs, component)["spec"]["template"]["metadata"]["annotations"])


@pytest.mark.parametrize(
    ("component", "values_key"), [("dra-generic", "generic"), ("dra-nvidia", "nvidia")]
)
def test_a_config_change_rolls_the_dra_driver(
    tmp_path: Path, component: str, values_key: str
) -> None:
    """The DRA drivers read their config at start: a change of it changes the pod template
    (a checksum annotation), so the DaemonSet rolls; the same config leaves it as it is."""
    one, two = tmp_path / "one.yaml", tmp_path / "two.yaml"
    if values_key == "nvidia":
        one.write_text("version: v1\nflags:\n  migStrategy: none\n")
        two.write_text("version: v1\nflags:\n  migStrategy: none\n  failOnInitError: false\n")
    else:
        one.write_text("version: v1\nresources:\n  - name: example.com/a\n    groups:\n"
                       "      - name: a\n        paths:\n          - path: /dev/a*\n")  # fmt: skip
        two.write_text(one.read_text().replace("/dev/a*", "/dev/b*"))
    key = f"{values_key}.config"
    first = _pod_annotations(render(values=DRA_ON, set_files={key: one}), component)
    again = _pod_annotations(render(values=DRA_ON, set_files={key: one}), component)
    changed = _pod_annotations(render(values=DRA_ON, set_files={key: two}), component)
    assert first["kubedevice.io/config-hash"] == again["kubedevice.io/config-hash"]
    assert first["kubedevice.io/config-hash"] != changed["kubedevice.io/config-hash"]
    # an existing ConfigMap is not the chart's to read: no hash (docs: restart or SIGHUP)
    own = render(values={**DRA_ON, f"{values_key}.existingConfigMap": "mine"})
    assert "kubedevice.io/config-hash" not in _pod_annotations(own, component)


def test_gpu_plugin_and_gpu_dra_driver_on_the_same_nodes_is_refused() -> None:
    """Nothing tells DRA which GPUs the plugin handed out: the chart does not render both on
    the same nodes; once the values split the nodes (nodeSelector or affinity), it does."""
    proc = helm(
        "template", "x", str(CHART), "--set", "nvidia.enabled=true",
        "--set", "dra.nvidia.enabled=true", check=False,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "put the GPU plugin and the GPU DRA driver on the same nodes" in proc.stderr
    assert "dra.nvidia.affinity (or dra.nvidia.nodeSelector)" in proc.stderr
    docs = render(values={**GPU_SPLIT, "dra.nvidia.enabled": "true"})
    selector = _pod(daemonset(docs, "dra-nvidia"))["nodeSelector"]
    assert selector == {"kubernetes.io/os": "linux", "example.com/gpu-mode": "dra"}
    key = "dra.nvidia.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
    render(
        values={
            "nvidia.enabled": "true",
            "dra.nvidia.enabled": "true",
            f"{key}.nodeSelectorTerms[0].matchExpressions[0].key": "dra",
            f"{key}.nodeSelectorTerms[0].matchExpressions[0].operator": "Exists",
        }
    )
    # the same affinity written out again is no split
    same = helm(
        "template", "x", str(CHART), "--set", "nvidia.enabled=true",
        "--set", "dra.nvidia.enabled=true", "--set-json",
        "dra.nvidia.affinity=" + json.dumps(
            yaml.safe_load((CHART / "values.yaml").read_text())["nvidia"]["affinity"]
        ),
        check=False,
    )  # fmt: skip
    assert same.returncode != 0


def test_gpu_driver_mps_adds_host_pid_compute_and_a_shared_dev_shm_only_when_asked() -> None:
    """dra.nvidia.mps: --mps, host PID (the MPS server sees its clients in other pods by host
    PID), the compute capability (libcuda, nvidia-cuda-mps-control) and /dev/shm from the
    host dir the shares' containers get; nothing of it without."""
    plain = daemonset(render(values={"dra.nvidia.enabled": "true"}), "dra-nvidia")
    assert "hostPID" not in _pod(plain)
    assert "--mps" not in container(plain)["args"]
    env = {e["name"]: e.get("value") for e in container(plain)["env"]}
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    assert "/dev/shm" not in [m["mountPath"] for m in container(plain)["volumeMounts"]]
    assert "/host/sys/fs/cgroup" not in [m["mountPath"] for m in container(plain)["volumeMounts"]]
    assert "--host-cgroup-root" not in container(plain)["args"]
    assert "add" not in container(plain)["securityContext"]["capabilities"]
    docs = render(values={"dra.nvidia.enabled": "true", "dra.nvidia.mps": "true"})
    validate_all(docs)
    gpu = daemonset(docs, "dra-nvidia")
    assert _pod(gpu)["hostPID"] is True
    assert "--mps" in container(gpu)["args"]
    env = {e["name"]: e.get("value") for e in container(gpu)["env"]}
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "utility,compute"
    assert _host_path(gpu, "/dev/shm") == "/var/lib/kubelet/plugins/gpu.kubedevice.io/mps/shm"
    assert container(gpu)["securityContext"]["privileged"] is False
    # the daemons in cgroups of their own, through the host's cgroup tree, outlive the pod
    args = container(gpu)["args"]
    assert args[args.index("--host-cgroup-root") + 1] == "/host/sys/fs/cgroup"
    assert _host_path(gpu, "/host/sys/fs/cgroup") == "/sys/fs/cgroup"
    [mount] = [m for m in container(gpu)["volumeMounts"] if m["mountPath"] == "/host/sys/fs/cgroup"]
    assert not mount.get("readOnly")
    assert _volumes(gpu)[mount["name"]]["hostPath"]["type"] == "Directory"
    # uid 0 makes their parent cgroup at each hierarchy's root (mode 0555)
    caps = container(gpu)["securityContext"]["capabilities"]
    assert caps == {"drop": ["ALL"], "add": ["DAC_OVERRIDE"]}


def test_gpu_driver_mps_daemons_can_be_left_in_the_pod() -> None:
    """dra.nvidia.mpsOutlivesPod=false: MPS without the host's cgroup tree (the daemons end
    with the driver's container); a change of it rolls the pods."""
    on = {"dra.nvidia.enabled": "true", "dra.nvidia.mps": "true"}
    docs = render(values={**on, "dra.nvidia.mpsOutlivesPod": "false"})
    validate_all(docs)
    gpu = daemonset(docs, "dra-nvidia")
    assert "--mps" in container(gpu)["args"]
    assert "--host-cgroup-root" not in container(gpu)["args"]
    assert "/host/sys/fs/cgroup" not in [m["mountPath"] for m in container(gpu)["volumeMounts"]]
    assert "host-cgroup" not in _volumes(gpu)
    assert "add" not in container(gpu)["securityContext"]["capabilities"]
    before = daemonset(render(values=on), "dra-nvidia")
    hash_key = "kubedevice.io/args-hash"
    assert (
        gpu["spec"]["template"]["metadata"]["annotations"][hash_key]
        != before["spec"]["template"]["metadata"]["annotations"][hash_key]
    )

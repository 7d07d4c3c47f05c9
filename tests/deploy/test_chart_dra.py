"""The chart's DRA drivers (values ``dra.*``): rendered by a real helm, schema-validated."""

from __future__ import annotations

from typing import Any

import pytest

from deploy.helm import helm
from deploy.render import CHART, by_kind, container, daemonset, render, validate_all

DRA_ON = {"dra.nvidia.enabled": "true", "dra.generic.enabled": "true"}


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
    # generic plugin DaemonSet + its ConfigMap, the GPU config for the DRA driver, and per
    # driver a DaemonSet, a ServiceAccount, a ClusterRole and a ClusterRoleBinding
    assert validate_all(docs) == 2 + 1 + 2 * 4
    gpu = daemonset(docs, "dra-nvidia")
    gen = daemonset(docs, "dra-generic")
    assert gpu["metadata"]["name"] == "kubedevice-dra-nvidia"
    assert container(gpu)["args"] == [
        "nvidia", "dra", "--config", "/etc/kubedevice/nvidia/config.yaml",
        "--driver-name", "gpu.kubedevice.io", "--kubelet-dir", "/var/lib/kubelet",
        "--cdi-dir", "/var/run/cdi", "--dev-root", "/host/dev", "--sys-root", "/host/sys",
        "--driver-root", "/host/driver", "--host-driver-root", "/",
    ]  # fmt: skip
    assert container(gen)["args"] == [
        "run", "--dra", "--config", "/etc/kubedevice/config.yaml",
        "--driver-name", "dev.kubedevice.io", "--kubelet-dir", "/var/lib/kubelet",
        "--cdi-dir", "/var/run/cdi", "--dev-root", "/host/dev", "--sys-root", "/host/sys",
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
    assert gpu["spec"]["template"]["spec"]["runtimeClassName"] == "nvidia"
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
        ("resource.k8s.io", "resourceslices"): sorted(["list", "create", "update", "delete"]),
        ("", "nodes"): ["get"],
    }
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
            "nvidia.enabled": "true",
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
    ],
    ids=["driver-name", "unknown-key", "relative-dir"],
)
def test_schema_refuses_bad_dra_values(setting: str, needle: str) -> None:
    proc = helm("template", "x", str(CHART), "--set", setting, check=False)
    assert proc.returncode != 0
    assert needle in proc.stderr


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

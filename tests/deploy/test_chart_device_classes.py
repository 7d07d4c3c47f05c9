"""The chart's DeviceClasses for extended resources agree with ``--print-device-classes``.

(And so do the examples of docs/nvidia-dra.md and docs/generic-dra.md.)

The chart computes the classes in templates (helm cannot run kubedevice); the drivers compute
them from the device plugin's own naming code. Each case renders the chart with the real helm
and runs the real CLI (a process) on the same config: the same classes must come out.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from deploy.helm import helm
from deploy.render import CHART, by_kind, render, validate_all

KUBEDEVICE = str(Path(sys.executable).with_name("kubedevice"))
DRA_ON = {"dra.nvidia.enabled": "true", "dra.generic.enabled": "true"}
#: the MIG profiles of the fake machine mig-mixed, in NVML order
MIG_MIXED_PROFILES = ["3g.71gb", "2g.35gb", "1g.18gb", "4g.71gb", "1g.35gb"]


def _values() -> dict[str, Any]:
    return dict(yaml.safe_load((CHART / "values.yaml").read_text()))


def _cli(*args: str) -> list[dict[str, Any]]:
    proc = subprocess.run(
        [KUBEDEVICE, *args, "--print-device-classes"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def _classes(docs: list[dict[str, Any]], component: str) -> list[dict[str, Any]]:
    """The rendered classes of one driver, as the CLI prints them (no labels)."""
    out = []
    for d in by_kind(docs, "DeviceClass"):
        if d["metadata"]["labels"]["app.kubernetes.io/component"] == f"dra-{component}":
            out.append({**d, "metadata": {"name": d["metadata"]["name"]}})
    return out


def test_default_configs_agree(tmp_path: Path) -> None:
    docs = render(values=DRA_ON)
    values = _values()
    (tmp_path / "gpu.yaml").write_text(values["nvidia"]["config"])
    (tmp_path / "dev.yaml").write_text(values["generic"]["config"])
    gpu = _cli("nvidia", "dra", "--config", str(tmp_path / "gpu.yaml"))
    dev = _cli("run", "--dra", "--config", str(tmp_path / "dev.yaml"))
    assert [c["spec"]["extendedResourceName"] for c in gpu] == ["nvidia.com/gpu"]
    assert [c["spec"]["extendedResourceName"] for c in dev] == ["kubedevice.io/fuse"]
    assert _classes(docs, "nvidia") == gpu
    assert _classes(docs, "generic") == dev
    assert validate_all(by_kind(docs, "DeviceClass")) == 2


GPU_CONFIGS = {
    "mixed, time-sliced and renamed": """\
version: v1
flags: {migStrategy: mixed}
sharing:
  timeSlicing:
    renameByDefault: true
    resources:
      - {name: nvidia.com/gpu, replicas: 4}
      - {name: nvidia.com/mig-1g.18gb, replicas: 2, rename: nvidia.com/small}
""",
    "single, time-sliced": """\
version: v1
flags: {migStrategy: single}
sharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 3}]}}
""",
    "none, MIG ignored": "version: v1\nflags: {migStrategy: none}\n",
}


@pytest.mark.parametrize("name", sorted(GPU_CONFIGS))
def test_gpu_configs_agree_with_the_nodes_mig_profiles(name: str, tmp_path: Path) -> None:
    config = tmp_path / "gpu.yaml"
    config.write_text(GPU_CONFIGS[name])
    # single: one profile on every GPU; the fake machine with one profile everywhere is h200
    # without MIG, so the CLI reads mig-mixed's profiles only for mixed
    machine = "mig-mixed" if "mixed" in name else "h200"
    profiles = MIG_MIXED_PROFILES if "mixed" in name else []
    cli = _cli("nvidia", "dra", "--config", str(config), "--nvml", f"fake:{machine}",
               "--driver-name", "gpu.example.com")  # fmt: skip
    args = ["template", "k", str(CHART), "--set", "dra.nvidia.enabled=true",
            "--set", "dra.nvidia.driverName=gpu.example.com",
            "--set-file", f"nvidia.config={config}"]  # fmt: skip
    if profiles:
        args += ["--set", "dra.nvidia.deviceClasses.migProfiles={" + ",".join(profiles) + "}"]
    docs = [d for d in yaml.safe_load_all(helm(*args).stdout) if d]
    assert _classes(docs, "nvidia") == cli
    validate_all(by_kind(docs, "DeviceClass"))
    if "mixed" in name:
        names = [c["spec"]["extendedResourceName"] for c in cli]
        assert names == [
            "nvidia.com/gpu.shared",
            "nvidia.com/mig-3g.71gb",
            "nvidia.com/mig-2g.35gb",
            "nvidia.com/small",
            "nvidia.com/mig-4g.71gb",
            "nvidia.com/mig-1g.35gb",
        ]
        kinds = {
            c["spec"]["extendedResourceName"]: c["spec"]["config"][0]["opaque"]["parameters"]
            for c in cli
            if "config" in c["spec"]
        }
        assert kinds["nvidia.com/gpu.shared"]["kind"] == "GpuConfig"
        assert kinds["nvidia.com/small"]["kind"] == "MigDeviceConfig"
        assert len(kinds) == 2


def test_generic_config_with_odd_names_agrees(tmp_path: Path) -> None:
    long_name = "example.com/" + "x" * 60 + "-a"
    config = tmp_path / "dev.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "version": "v1",
                "resources": [
                    {"name": n, "groups": [{"paths": [{"path": p}]}]}
                    for n, p in (
                        ("example.com/Serial_Port", "/dev/ttyUSB*"),
                        ("example.com/kvm", "/dev/kvm"),
                        (long_name, "/dev/long"),
                    )
                ],
            }
        )
    )
    cli = _cli("run", "--dra", "--config", str(config))
    docs = render(values={"dra.generic.enabled": "true"}, set_files={"generic.config": config})
    assert _classes(docs, "generic") == cli
    assert [c["metadata"]["name"] for c in cli][1] == "example.com-kvm"
    assert cli[0]["metadata"]["name"].startswith("example.com-serial-port-")
    # the devices' resource attribute holds 64 characters: the selector compares those
    assert '"' + long_name[:64] + '"' in cli[2]["spec"]["selectors"][0]["cel"]["expression"]
    validate_all(by_kind(docs, "DeviceClass"))


@pytest.mark.parametrize(
    "values",
    [
        {"dra.nvidia.deviceClasses.enabled": "false", "dra.generic.deviceClasses.enabled": "false"},
        {"nvidia.existingConfigMap": "mine", "generic.existingConfigMap": "mine"},
    ],
)
def test_no_classes_when_off_or_the_config_is_not_the_charts(values: dict[str, str]) -> None:
    docs = render(values={**DRA_ON, **values})
    assert not by_kind(docs, "DeviceClass")
    assert len(by_kind(docs, "DaemonSet")) == 3  # the generic plugin and both DRA drivers


def test_schema_refuses_a_bad_mig_profile() -> None:
    proc = helm(
        "template", "k", str(CHART), "--set", "dra.nvidia.enabled=true",
        "--set", "dra.nvidia.deviceClasses.migProfiles={1g 10gb}", check=False,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "migProfiles" in proc.stderr


def test_print_device_classes_needs_dra(tmp_path: Path) -> None:
    config = tmp_path / "dev.yaml"
    config.write_text(_values()["generic"]["config"])
    proc = subprocess.run(
        [KUBEDEVICE, "run", "--config", str(config), "--print-device-classes"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert "--print-device-classes needs --dra" in proc.stderr


def _doc_classes(doc: str) -> list[dict[str, Any]]:
    text = (CHART.parents[1] / "docs" / doc).read_text()
    heading = "## Moving from the device plugin to DRA with unchanged pod specs"
    section = text[text.index(heading) :]
    end = section.find("\n## ", 1)
    section = section if end < 0 else section[:end]
    blocks = [b.split("```", 1)[0] for b in section.split("```yaml\n")[1:]]
    return [d for b in blocks for d in yaml.safe_load_all(b) if d]


def test_the_docs_examples_are_what_the_cli_prints(tmp_path: Path) -> None:
    assert _doc_classes("nvidia-dra.md") == _cli("nvidia", "dra")
    config = tmp_path / "dev.yaml"
    config.write_text(
        "version: v1\nresources:\n  - name: example.com/serial\n"
        "    groups: [{paths: [{path: /dev/ttyUSB*}]}]\n"
    )
    assert _doc_classes("generic-dra.md") == _cli("run", "--dra", "--config", str(config))


def _notes(*settings: str) -> str:
    args = [a for s in settings for a in ("--set", s)]
    out = helm("install", "--dry-run", "k", str(CHART), *args).stdout
    return out[out.index("NOTES:") :]


def test_notes_warn_when_a_plugin_and_its_dra_driver_share_nodes() -> None:
    # the GPU pair on the same nodes does not render at all (test_chart_dra.py)
    both = _notes(
        "nvidia.enabled=true",
        "dra.nvidia.enabled=true",
        "dra.nvidia.nodeSelector.example\\.com/gpu-mode=dra",
        "dra.generic.enabled=true",
    )
    assert "GPU plugin and the GPU DRA driver" not in both
    assert "generic plugin and the /dev DRA driver run on the same nodes" in both
    assert "kubectl get deviceclasses -l app.kubernetes.io/instance=k" in both
    apart = _notes(
        "nvidia.enabled=true",
        "dra.nvidia.enabled=true",
        "dra.nvidia.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
        ".nodeSelectorTerms[0].matchExpressions[0].key=dra",
        "dra.nvidia.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
        ".nodeSelectorTerms[0].matchExpressions[0].operator=Exists",
        "generic.enabled=false",
        "dra.nvidia.deviceClasses.enabled=false",
    )
    assert "WARNING: the" not in apart
    assert "deviceclasses" not in apart

"""The example files shipped in the package (``kubedevice examples``) are the repository's own:
the plain manifests in deploy/ and the generic plugin's configs in examples/."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from deploy.render import ROOT
from kubedevice.cli.examples_cmd import shipped
from kubedevice.generic import parse_config

SOURCES = {
    "kubedevice.yaml": ROOT / "deploy" / "kubedevice.yaml",
    "kubedevice-nvidia.yaml": ROOT / "deploy" / "kubedevice-nvidia.yaml",
    "kubedevice-dra-driver.yaml": ROOT / "deploy" / "kubedevice-dra-driver.yaml",
    **{
        p.name: p
        for p in sorted((ROOT / "examples").glob("*.yaml"))
        if p.name != "pod-counter.yaml"
    },
}


def test_every_shipped_file_is_its_source_byte_for_byte() -> None:
    files = shipped()
    assert sorted(files) == sorted(SOURCES)
    for name, source in SOURCES.items():
        assert files[name] == source.read_text(), (
            f"src/kubedevice/examples/{name} differs from {source.relative_to(ROOT)}: copy it"
        )


@pytest.mark.parametrize("name", sorted(n for n in SOURCES if not n.startswith("kubedevice")))
def test_shipped_configs_are_valid(name: str) -> None:
    parse_config(yaml.safe_load(shipped()[name]), name)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kubedevice", "examples", *args],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_command_lists_and_prints() -> None:
    proc = _cli()
    assert proc.returncode == 0, proc.stderr
    assert [line.split()[0] for line in proc.stdout.splitlines()] == sorted(SOURCES)
    proc = _cli("kubedevice.yaml")
    assert proc.returncode == 0
    assert proc.stdout == SOURCES["kubedevice.yaml"].read_text()
    proc = _cli("nope.yaml")
    assert proc.returncode == 2
    [line] = proc.stderr.splitlines()
    assert line.startswith("error: no example named 'nope.yaml'; one of: ")


def test_the_dra_driver_template_is_valid_kubernetes() -> None:
    """The DaemonSet template docs/dra.md shows, against the API's schemas."""
    import kubernetes_validate

    docs = [d for d in yaml.safe_load_all(shipped()["kubedevice-dra-driver.yaml"]) if d]
    assert [d["kind"] for d in docs] == [
        "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "DaemonSet",
        "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
    ]  # fmt: skip
    for doc in docs:
        kubernetes_validate.validate(doc, "1.34", strict=True)
    # it rolls with a surge, each pod's sockets named by its UID (docs/dra.md, "Upgrades")
    [ds] = [d for d in docs if d["kind"] == "DaemonSet"]
    assert ds["spec"]["updateStrategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    [driver] = ds["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("valueFrom") for e in driver["env"]}
    assert env["POD_UID"] == {"fieldRef": {"fieldPath": "metadata.uid"}}
    # a SIGTERM waits for the calls in flight a little under the pod's grace period
    grace = ds["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    [stop] = [e["value"] for e in driver["env"] if e["name"] == "KUBEDEVICE_STOP_GRACE"]
    assert 0 < float(stop) < grace


def test_the_upgrade_manifest_in_the_docs_is_valid_and_rolls_as_the_template_does() -> None:
    """docs/dra.md, "Upgrades": its DaemonSet validates, surges and passes the pod UID, as
    the shipped template does."""
    import kubernetes_validate

    text = (ROOT / "docs" / "dra.md").read_text()
    section = text[text.index("## Upgrades") :]
    section = section[: section.index("\n## ", 1)]
    [block] = [b.split("```", 1)[0] for b in section.split("```yaml\n")[1:]]
    [ds] = [d for d in yaml.safe_load_all(block) if d]
    kubernetes_validate.validate(ds, "1.34", strict=True)
    [template] = [
        d
        for d in yaml.safe_load_all(shipped()["kubedevice-dra-driver.yaml"])
        if d and d["kind"] == "DaemonSet"
    ]
    assert ds["spec"]["updateStrategy"] == template["spec"]["updateStrategy"]
    [ours] = ds["spec"]["template"]["spec"]["containers"]
    [theirs] = template["spec"]["template"]["spec"]["containers"]
    assert ours["env"] == theirs["env"]
    assert ours["volumeMounts"] == theirs["volumeMounts"]


def test_the_dra_driver_templates_rbac_is_the_charts() -> None:
    """The chart is the one source of a DRA driver's RBAC: the template's ClusterRole has the
    rules the chart renders for a driver of the template's name (claims and their status,
    the slice watch ...), so "exactly what the kit uses" holds for both."""
    from deploy.render import by_kind, render

    docs = [d for d in yaml.safe_load_all(shipped()["kubedevice-dra-driver.yaml"]) if d]
    [template_role] = by_kind(docs, "ClusterRole")
    chart = render(
        values={"dra.generic.enabled": "true", "dra.generic.driverName": "counter.example.com"}
    )
    [chart_role] = [
        r
        for r in by_kind(chart, "ClusterRole")
        if r["metadata"]["name"] == "kubedevice-dra-generic"
    ]
    assert template_role["rules"] == chart_role["rules"], (
        "deploy/kubedevice-dra-driver.yaml: copy the ClusterRole's rules from "
        "charts/kubedevice/templates/dra-rbac.yaml"
    )

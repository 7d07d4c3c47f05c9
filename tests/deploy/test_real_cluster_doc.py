"""docs/real-cluster.md's helm commands, as the guide writes them, render what it says: the
generic plugin alone first (step 2), then, after ``helm upgrade --reuse-values``, the DRA
driver alone in its place with the DeviceClass for ``example.com/fuse`` (step 4). The
DaemonSets themselves run on the real components in tests/e2e/test_chart_real.py."""

from __future__ import annotations

import itertools
import re
import shlex
from pathlib import Path

import yaml

from deploy.render import ROOT, by_kind, container, render, validate_all

DOC = ROOT / "docs" / "real-cluster.md"


def _helm(verb: str) -> tuple[dict[str, str], dict[str, Path]]:
    """The ``--set`` values and ``--set-file`` files of the guide's ``helm VERB`` command."""
    [command] = re.findall(rf"^helm {verb} (?:.*\\\n)*.*$", DOC.read_text(), re.M)
    argv = shlex.split(command.replace("\\\n", " "))
    values: dict[str, str] = {}
    files: dict[str, Path] = {}
    for flag, arg in itertools.pairwise(argv):
        if flag == "--set":
            key, value = arg.split("=", 1)
            values[key] = value
        elif flag == "--set-file":
            key, name = arg.split("=", 1)
            files[key] = ROOT / "examples" / name  # `kubedevice examples fuse.yaml > fuse.yaml`
    assert "kubedevice examples fuse.yaml > fuse.yaml" in DOC.read_text()
    return values, files


def _images(docs: list[dict[str, object]]) -> set[str]:
    return {container(ds)["image"] for ds in by_kind(docs, "DaemonSet")}


def test_step_2_installs_the_generic_plugin_alone() -> None:
    values, files = _helm("install")
    docs = render(values=values, set_files=files)
    assert [ds["metadata"]["name"] for ds in by_kind(docs, "DaemonSet")] == ["kubedevice"]
    assert _images(docs) == {"kubedevice:0.1.0"}
    [cm] = by_kind(docs, "ConfigMap")
    config = yaml.safe_load(cm["data"]["config.yaml"])
    assert [r["name"] for r in config["resources"]] == ["example.com/fuse"]
    validate_all(docs)


def test_step_4_puts_the_dra_driver_in_the_plugin_s_place() -> None:
    values, files = _helm("install")
    upgrade, more_files = _helm("upgrade")
    assert "--reuse-values" in DOC.read_text().split("helm upgrade", 1)[1].split("\n", 1)[0]
    docs = render(values={**values, **upgrade}, set_files={**files, **more_files})
    names = [ds["metadata"]["name"] for ds in by_kind(docs, "DaemonSet")]
    assert names == ["kubedevice-dra-generic"]  # never both on one node
    assert _images(docs) == {"kubedevice:0.1.0"}
    [cls] = by_kind(docs, "DeviceClass")
    assert cls["metadata"]["name"] == "example.com-fuse"  # the name the guide gives
    assert cls["spec"]["extendedResourceName"] == "example.com/fuse"
    validate_all(docs)

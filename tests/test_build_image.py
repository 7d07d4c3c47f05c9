"""scripts/build-image follows the Dockerfile (it reads it): the plan it reads from the real
Dockerfile is the image the Dockerfile describes, and a step it does not know stops it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _module() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "build_image", ROOT / "scripts" / "build_image.py"
    )
    assert spec is not None
    assert spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["build_image"] = mod
    spec.loader.exec_module(mod)
    return mod


bi = _module()


def test_the_plan_of_the_real_dockerfile() -> None:
    p = bi.plan(ROOT / "Dockerfile")
    assert (p.base, p.suite, p.python) == ("python:3.11-slim-bookworm", "bookworm", "3.11")
    # the build stage's wheels and the final stage's install name the same extras, pinned
    assert "-c" in p.wheel_args
    assert p.wheel_args[p.wheel_args.index("-c") + 1] == "constraints.txt"
    assert ".[generic,nvidia,dra]" in p.wheel_args
    assert "dumb-init" in p.wheel_args
    assert p.install_args[p.install_args.index("--find-links") + 1] == "/wheels"
    assert "--no-index" in p.install_args
    assert "kubedevice[generic,nvidia,dra]" in p.install_args
    assert "dumb-init" in p.install_args
    assert p.env["KUBEDEVICE_LOG_FORMAT"] == "json"
    assert p.env["PYTHONDONTWRITEBYTECODE"] == "1"
    assert p.entrypoint == ["dumb-init", "--", "kubedevice"]
    assert p.cmd[0] == "run"
    assert p.user == "0:0"


def _dockerfile(tmp_path: Path, extra: str = "", base: str = "python:3.11-slim-bookworm") -> Path:
    text = (ROOT / "Dockerfile").read_text().replace("python:3.11-slim-bookworm", base) + extra
    f = tmp_path / "Dockerfile"
    f.write_text(text)
    return f


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("VOLUME /data\n", "VOLUME is not followed by this build"),
        ("RUN apt-get install -y curl\n", "RUN 'apt-get install -y curl' is not followed"),
        ("HEALTHCHECK CMD true\n", "HEALTHCHECK is not followed"),
    ],
)
def test_a_step_the_build_does_not_follow_stops_it(
    tmp_path: Path, extra: str, message: str
) -> None:
    with pytest.raises(bi.PlanError, match=message):
        bi.plan(_dockerfile(tmp_path, extra))


def test_a_base_whose_python_is_not_debians_stops_it(tmp_path: Path) -> None:
    with pytest.raises(bi.PlanError, match=r"Debian bookworm's Python is 3\.11, not 3\.12"):
        bi.plan(_dockerfile(tmp_path, base="python:3.12-slim-bookworm"))
    assert bi.plan(_dockerfile(tmp_path, base="python:3.13-slim-trixie")).suite == "trixie"


def test_a_new_env_or_command_in_the_dockerfile_reaches_the_plan(tmp_path: Path) -> None:
    p = bi.plan(_dockerfile(tmp_path, 'ENV EXTRA=1\nCMD ["nvidia", "run"]\n'))
    assert p.env["EXTRA"] == "1"
    assert p.cmd == ["nvidia", "run"]


def test_make_image_tar_installs_only_the_runtime(tmp_path: Path) -> None:
    """``make image-tar`` on a fresh clone needs a Python with pip, not the dev toolchain
    (ruff, mypy, pytest, the API client, helm: about 900 MB). ``make -n`` prints the
    commands without running them."""
    import shutil
    import subprocess

    make = shutil.which("make")
    if make is None:
        pytest.skip("no make here")
    venv = tmp_path / "venv"
    proc = subprocess.run(
        [make, "-n", "--no-print-directory", "image-tar", f"VENV={venv}"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    lines = proc.stdout.splitlines()
    assert not [line for line in lines if "[dev]" in line], proc.stdout
    assert f"{venv}/bin/pip install --quiet --disable-pip-version-check -e ." in lines
    assert lines[-1].startswith(f"PYTHON={venv}/bin/python scripts/build-image --out ")

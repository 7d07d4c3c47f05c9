"""Packaging: declared floors match the generated code, one version, LICENSE, no inotify at import.

The generated ``*_pb2.py`` files check the protobuf runtime at import and the
``*_pb2_grpc.py`` files check grpcio; a floor in pyproject.toml below what they check lets
``pip check`` pass and the command crash. ``import kubedevice`` must work where inotify does
not exist (macOS): the emulator and the conformance kit run there; only plugin daemons need it.
"""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

import kubedevice

ROOT = Path(__file__).resolve().parents[1]
API = ROOT / "src/kubedevice/_api"


def _pyproject() -> dict[str, object]:
    with (ROOT / "pyproject.toml").open("rb") as f:
        return tomllib.load(f)


def _floor(requirement_name: str) -> tuple[int, ...]:
    project = _pyproject()["project"]
    assert isinstance(project, dict)
    for req in project["dependencies"]:
        name = re.split(r"[<>=!~;\[ ]", req, maxsplit=1)[0]
        if name.lower() == requirement_name:
            match = re.search(r">=\s*([0-9.]+)", req)
            assert match, f"{req!r} declares no floor"
            return tuple(int(p) for p in match.group(1).split("."))
    raise AssertionError(f"{requirement_name} is not a dependency")


def _generated_protobuf_minimum(path: Path) -> tuple[int, int, int]:
    text = path.read_text()
    match = re.search(
        r"ValidateProtobufRuntimeVersion\(\s*_runtime_version\.Domain\.PUBLIC,\s*(\d+),\s*(\d+),"
        r"\s*(\d+),",
        text,
    )
    assert match, f"no runtime version check found in {path}"
    major, minor, patch = (int(g) for g in match.groups())
    return major, minor, patch


def _generated_grpc_minimum(path: Path) -> tuple[int, ...]:
    match = re.search(r"GRPC_GENERATED_VERSION = '([0-9.]+)'", path.read_text())
    assert match, f"no GRPC_GENERATED_VERSION in {path}"
    return tuple(int(p) for p in match.group(1).split("."))


def _pad(version: tuple[int, ...]) -> tuple[int, ...]:
    return (*version, 0, 0, 0)[:3]


@pytest.mark.parametrize("path", sorted(API.rglob("*_pb2.py")), ids=lambda p: p.parent.name)
def test_protobuf_floor_covers_the_generated_code(path: Path) -> None:
    needed = _generated_protobuf_minimum(path)
    declared = _pad(_floor("protobuf"))
    assert declared >= needed, (
        f"{path.relative_to(ROOT)} needs protobuf>={'.'.join(map(str, needed))}, "
        f"pyproject.toml declares >={'.'.join(map(str, declared))}"
    )
    # protobuf refuses gencode from a newer major; the cap must stay below the next major
    project = _pyproject()["project"]
    assert isinstance(project, dict)
    spec = next(r for r in project["dependencies"] if r.startswith("protobuf"))
    assert f"<{needed[0] + 1}" in spec, spec


@pytest.mark.parametrize("path", sorted(API.rglob("*_pb2_grpc.py")), ids=lambda p: p.parent.name)
def test_grpcio_floor_covers_the_generated_code(path: Path) -> None:
    assert _pad(_floor("grpcio")) >= _pad(_generated_grpc_minimum(path))


def test_setuptools_floor_supports_the_spdx_license_syntax() -> None:
    data = _pyproject()
    project = data["project"]
    assert isinstance(project, dict)
    assert isinstance(project["license"], str)  # PEP 639 expression: setuptools >= 77
    build = data["build-system"]
    assert isinstance(build, dict)
    setuptools = next(r for r in build["requires"] if r.startswith("setuptools"))
    match = re.search(r">=\s*(\d+)", setuptools)
    assert match, setuptools
    assert int(match.group(1)) >= 77, setuptools
    assert not any(c.startswith("License ::") for c in project["classifiers"])


def test_license_file_is_the_apache_2_text() -> None:
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text
    assert "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
    assert _pyproject()["project"]["license"] == "Apache-2.0"  # type: ignore[index]


def test_metadata_classifiers_and_urls() -> None:
    meta = importlib.metadata.metadata("kubedevice")
    classifiers = meta.get_all("Classifier") or []
    assert "Typing :: Typed" in classifiers
    assert "Operating System :: POSIX :: Linux" in classifiers
    assert meta.get_all("Project-URL"), "no project URLs"
    assert (ROOT / "src/kubedevice/py.typed").exists()


def test_one_version_everywhere() -> None:
    project = _pyproject()["project"]
    assert isinstance(project, dict)
    assert "version" not in project
    assert "version" in project["dynamic"]
    installed = importlib.metadata.version("kubedevice")
    assert kubedevice.__version__ == installed
    out = subprocess.run(
        [sys.executable, "-m", "kubedevice", "--version"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.strip() == f"kubedevice, version {installed}"


def test_sdk_does_not_need_the_generic_plugins_dependencies() -> None:
    requires = importlib.metadata.requires("kubedevice") or []
    core = [r for r in requires if "extra ==" not in r]
    assert not any(r.startswith("pydantic") for r in requires), requires  # in no extra either
    inotify = next(r for r in core if r.startswith("asyncinotify"))
    assert "sys_platform == 'linux'" in inotify.replace('"', "'")
    code = (
        "import sys, kubedevice; print(sorted(m for m in ('pydantic', 'yaml') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


# A meta-path finder that refuses asyncinotify, as on macOS where it cannot be installed.
_BLOCK = textwrap.dedent(
    """
    import importlib.abc, sys

    class _NoInotify(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in ("asyncinotify", *BLOCKED):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, _NoInotify())
    """
)


def _run_blocked(
    body: str, *args: str, also: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", f"BLOCKED = {also!r}\n" + _BLOCK + textwrap.dedent(body), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_import_and_emulator_work_without_inotify(sock_dir: Path) -> None:
    result = _run_blocked(
        """
        import asyncio, sys
        from pathlib import Path
        import kubedevice, kubedevice.conformance, kubedevice.conformance.runner
        from kubedevice.cli.main import cli
        from kubedevice.kubelet import Emulator

        async def main(directory):
            async with Emulator(directory, control_socket=False) as emu:
                assert (directory / "kubelet.sock").is_socket()
            print("emulator ran")

        asyncio.run(main(Path(sys.argv[1])))
        assert "asyncinotify" not in sys.modules
        print("no inotify")
        """,
        str(sock_dir / "dp"),
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["emulator", "ran", "no", "inotify"]


def test_plugin_daemon_without_inotify_says_so_in_one_line(sock_dir: Path) -> None:
    (sock_dir / "dp").mkdir()
    result = _run_blocked(
        """
        import runpy, sys
        sys.argv = sys.argv[1:]
        runpy.run_path(sys.argv[0], run_name="__main__")
        """,
        str(ROOT / "examples/minimal.py"),
        "--device-plugin-dir",
        str(sock_dir / "dp"),
    )
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if "asyncinotify" in line]
    assert len(errors) == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert "device plugin daemons need asyncinotify" in errors[0]


def test_configs_validate_without_any_validation_library(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("version: v1\nresources: []\n")
    gpu = tmp_path / "gpu.yaml"
    gpu.write_text("version: v1\nhealth: {quietPeriod: 0}\n")
    result = _run_blocked(
        """
        import sys
        from kubedevice.errors import ConfigError
        from kubedevice.cli.main import cli
        from kubedevice.nvidia.config import load_config
        from kubedevice.nvidia.fake import FakeNvml
        FakeNvml.from_file("mig-mixed")
        try:
            load_config(sys.argv[2])
        except ConfigError as exc:
            print(exc)
        cli(["validate", sys.argv[1]])
        """,
        str(config),
        str(gpu),
        also=("pydantic", "pydantic_core", "msgspec"),
    )
    assert result.returncode == 2, result.stderr
    assert result.stdout.strip() == (f"{gpu}: health.quietPeriod: must be >= 0.01 (got 0)")
    assert result.stderr.strip() == (
        f"error: {config}: resources: must have at least 1 item(s) (got 0)"
    )


def test_validate_works_without_inotify_and_run_says_so_in_one_line(
    tmp_path: Path, sock_dir: Path
) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(
        "version: v1\nresources:\n- name: example.com/x\n  groups:\n"
        "  - paths: [{path: /dev/null}]\n"
    )
    body = """
        import sys
        from kubedevice.cli.main import cli
        cli(sys.argv[1:])
        """
    checked = _run_blocked(body, "validate", str(config))
    assert checked.returncode == 0, checked.stderr
    assert checked.stdout.strip().endswith("ok (1 resource(s): example.com/x)")
    ran = _run_blocked(
        body, "run", "--config", str(config), "--device-plugin-dir", str(sock_dir / "dp")
    )
    assert ran.returncode == 2, ran.stderr
    lines = ran.stderr.strip().splitlines()
    assert len(lines) == 1, ran.stderr
    assert "asyncinotify" in lines[0]

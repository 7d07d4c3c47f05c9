"""The README and the guides show the tested examples verbatim, the README names the two
set-up commands, and the emulator walkthrough runs as a user pastes it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("doc", "name"),
    [
        ("README.md", "minimal.py"),
        ("README.md", "dra_minimal.py"),
        ("docs/sdk.md", "minimal.py"),
        ("docs/sdk.md", "all_hooks.py"),
        ("docs/sdk.md", "plain_hooks.py"),
    ],
)
def test_the_docs_embed_the_examples_verbatim(doc: str, name: str) -> None:
    text = (ROOT / doc).read_text()
    example = (ROOT / "examples" / name).read_text()
    code = example.split('"""', 2)[2].strip()  # the example without its docstring
    assert f"```python\n# examples/{name}: python examples/{name} " in text
    assert code in text


def test_readme_quick_start_commands_exist_in_the_makefile() -> None:
    readme = (ROOT / "README.md").read_text()
    makefile = (ROOT / "Makefile").read_text()
    for target in ("demo", "test"):
        assert f"make {target}" in readme
        assert f"\n{target}:" in makefile
    assert "make test" in (ROOT / ".ci/run").read_text()


def _planned(target: str, tmp_path: Path) -> list[str]:
    """The commands ``make TARGET`` would run on a fresh clone (no venv yet)."""
    proc = subprocess.run(
        [
            "make",
            "-n",
            "--no-print-directory",
            "-C",
            str(ROOT),
            f"VENV={tmp_path / 'venv'}",
            target,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return proc.stdout.splitlines()


def test_make_demo_installs_only_the_runtime(tmp_path: Path) -> None:
    plan = _planned("demo", tmp_path)
    installs = [line for line in plan if " install " in line]
    assert installs, plan
    assert all("[" not in line for line in installs), (
        installs
    )  # no extra: what pip install kubedevice installs
    assert any(
        line.endswith("install --quiet --disable-pip-version-check -e .") for line in installs
    )
    assert plan[-1].endswith("/bin/kubedevice demo")


def test_make_test_adds_the_dev_extra(tmp_path: Path) -> None:
    plan = _planned("test", tmp_path)
    assert any(line.endswith("install --quiet -e '.[dev]'") for line in plan), plan
    # the same venv as make demo's, filled in two steps
    runtime = [line for line in plan if line.endswith("-e .")]
    assert len(runtime) == 1, plan


def _shell_block_after(heading: str) -> str:
    doc = (ROOT / "docs" / "emulator.md").read_text()
    section = doc[doc.index(heading) :]
    return section.split("```sh\n", 1)[1].split("```", 1)[0]


def test_the_emulator_walkthrough_runs_without_a_race(tmp_path: Path) -> None:
    # the block as a user pastes it, in a fresh directory that has the examples
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    script = "set -e\n" + _shell_block_after("## A walkthrough") + "wait\n"
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "TMPDIR": "/tmp",  # short socket paths
    }
    proc = subprocess.run(
        ["bash", "-c", script],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "COUNTER" in proc.stdout  # `pod get` shows the container's env
    assert "example.com/counter" in proc.stdout
    # Started together, the emulator's start-up clean-up spares the plugin's fresh socket:
    # neither side logs a warning before the first registration (the simulated restart later
    # in the block does remove the plugin's socket, on purpose).
    for log in ("emulator.log", "plugin.log"):
        lines = (tmp_path / log).read_text().splitlines()
        first = next(i for i, line in enumerate(lines) if "registered" in line)
        assert not [line for line in lines[:first] if "WARNING" in line], (log, lines)

"""The README shows the tested example plugins verbatim, and names the two set-up commands."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", ["minimal.py", "all_hooks.py", "plain_hooks.py"])
def test_readme_embeds_the_sdk_examples_verbatim(name: str) -> None:
    readme = (ROOT / "README.md").read_text()
    example = (ROOT / "examples" / name).read_text()
    code = example.split('"""', 2)[2].strip()  # the example without its docstring
    assert f"```python\n# examples/{name}: python examples/{name} " in readme
    assert code in readme


def test_readme_quick_start_commands_exist_in_the_makefile() -> None:
    readme = (ROOT / "README.md").read_text()
    makefile = (ROOT / "Makefile").read_text()
    for target in ("demo", "test"):
        assert f"make {target}" in readme
        assert f"\n{target}:" in makefile
    assert "make test" in (ROOT / ".ci/run").read_text()


def _shell_block_after(heading: str) -> str:
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index(heading) :]
    return section.split("```sh\n", 1)[1].split("```", 1)[0]


def test_readme_emulator_walkthrough_runs_without_a_race(tmp_path: Path) -> None:
    # the block as a user pastes it, in a fresh directory that has the examples
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    script = "set -e\n" + _shell_block_after("## The kubelet emulator") + "wait\n"
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

"""The README shows the tested example plugins verbatim, and names the two set-up commands."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", ["minimal.py", "all_hooks.py"])
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

"""docs/architecture.md's tree names every module of src/kubedevice, and only modules that exist.

The tree is the first code block that starts with ``src/kubedevice/``: an entry is a line whose
first word ends in ``.py`` or ``/``, indented two spaces per level; deeper-indented lines carry
on the entry above. A directory's description may name its small modules inline (``fake/``:
"nvml.py (FakeNvml), machine.py ..."). The generated ``_api/`` code is named as one entry.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "kubedevice"
DOC = ROOT / "docs" / "architecture.md"
ENTRY = re.compile(r"( *)([\w.]+(?:/|\.py))(?:\s|$)")
INLINE = re.compile(r"(?<![\w/.])(\w+\.py)\b")


def _tree(text: str) -> str:
    for block in re.findall(r"```\n(.*?)```", text, flags=re.S):
        if block.startswith("src/kubedevice/\n"):
            return str(block)
    raise AssertionError("docs/architecture.md has no tree starting with src/kubedevice/")


def named(text: str) -> set[str]:
    """Paths relative to src/kubedevice the tree names (a directory with its trailing /)."""
    found: set[str] = set()
    stack: list[tuple[int, str]] = []  # (indent, "dir/") of the open directories
    last_indent = 0
    owner = ""  # the directory whose description the following lines continue
    for line in _tree(text).splitlines()[1:]:
        m = ENTRY.match(line)
        indent = len(m.group(1)) if m else -1
        if m and indent % 2 == 0 and 2 <= indent <= last_indent + 2:
            while stack and stack[-1][0] >= indent:
                stack.pop()
            path = "".join(name for _, name in stack) + m.group(2)
            found.add(path)
            last_indent = indent
            owner = path if path.endswith("/") else ""
            if owner:
                stack.append((indent, m.group(2)))
            description = line[m.end() :]
        else:
            description = line
        if owner:
            found.update(owner + name for name in INLINE.findall(description))
    return found


def modules() -> set[str]:
    """Every module and package of src/kubedevice, outside the generated _api/."""
    found: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE)
        if rel.parts[0] == "_api":
            continue
        if rel.name == "__init__.py" and len(rel.parts) > 1:
            found.add(rel.parent.as_posix() + "/")  # a package is named by its directory
        else:
            found.add(rel.as_posix())
    return found


def test_every_module_is_in_the_architecture_tree() -> None:
    missing = sorted(modules() - named(DOC.read_text()))
    assert not missing, f"modules not named in docs/architecture.md: {missing}"


def test_the_tree_names_nothing_that_is_gone() -> None:
    gone = sorted(p for p in named(DOC.read_text()) if not (PACKAGE / p).exists())
    assert not gone, f"docs/architecture.md names what src/kubedevice does not have: {gone}"


def test_the_parser_sees_nesting_and_inline_names() -> None:
    tree = (
        "```\nsrc/kubedevice/\n  top.py           a leaf\n  pkg/             a room: small.py and"
        "\n                   other.py inline\n    inner.py       in pkg\n    sub/\n"
        "      deep.py        in pkg/sub\n  after.py         back at the top\n```\n"
    )
    assert named(tree) == {
        "top.py", "pkg/", "pkg/small.py", "pkg/other.py", "pkg/inner.py", "pkg/sub/",
        "pkg/sub/deep.py", "after.py",
    }  # fmt: skip

"""The image recipe: pinned dependencies, OCI labels, an init, a tight build context.

No container engine runs here, so the Dockerfile is checked as text against the files it uses.
"""

from __future__ import annotations

import fnmatch
import importlib.metadata
import json
import re
import tomllib

from dependencies import closure
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from deploy.render import ROOT


def _pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"constraints.txt: {line!r} is not an exact pin"
            pins[canonicalize_name(name)] = version
    return pins


def _dockerfile() -> str:
    return (ROOT / "Dockerfile").read_text()


def _image_extras() -> list[str]:
    """The extras the Dockerfile installs (``".[a,b]"``)."""
    m = re.search(r'"\.\[([a-z0-9_,-]+)\]"', _dockerfile())
    assert m is not None, "the Dockerfile installs the project with its extras"
    return m.group(1).split(",")


def test_every_runtime_dependency_is_pinned_within_its_range() -> None:
    pins = _pins()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    for extra in _image_extras():
        reqs += [Requirement(r) for r in project["optional-dependencies"][extra]]
    for req in reqs:
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} is not pinned in constraints.txt"
        assert req.specifier.contains(pins[name], prereleases=True), (req, pins[name])


def test_pins_are_closed_under_dependencies() -> None:
    """Every dependency of a pinned package (as installed here) is pinned too."""
    pins = _pins()
    for name in pins:
        try:
            requires = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:
            continue  # e.g. nvidia-ml-py on a machine without the extra: it has no deps
        for raw in requires:
            req = Requirement(raw)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            assert canonicalize_name(req.name) in pins, f"{name} needs {req.name}: not pinned"


def test_every_pin_is_installed_in_the_image() -> None:
    """No stale pin: constraints.txt holds what the image installs (the project with the
    Dockerfile's extras, and dumb-init) and what those need, nothing more; so the official
    Kubernetes client (the ``kube-client`` extra) stays out of the image."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = [*project["dependencies"], "dumb-init"]
    for extra in _image_extras():
        wanted += project["optional-dependencies"][extra]
    needed = closure(wanted)
    assert sorted(_pins()) == sorted(needed)
    assert "kubernetes" not in needed


def test_dockerfile_uses_the_constraints_labels_and_an_init() -> None:
    text = _dockerfile()
    assert text.count("-c constraints.txt") + text.count("-c /tmp/constraints.txt") == 2
    for label in ("title", "description", "version", "revision", "source", "licenses"):
        assert f"org.opencontainers.image.{label}=" in text, label
    entry = re.search(r"^ENTRYPOINT (.+)$", text, re.M)
    assert entry is not None
    assert json.loads(entry.group(1)) == ["dumb-init", "--", "kubedevice"]
    assert "dumb-init" in _pins()


def _ignored(path: str) -> bool:
    """Docker's rule: the last matching pattern wins; ``!`` re-includes."""
    ignored = False
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = line.lstrip("!").rstrip("/")
        regex = fnmatch.translate(pattern).replace(".*", "(.*)")
        if pattern == "**" or re.match(regex, path) or path.startswith(pattern + "/"):
            ignored = not negate
    return ignored


def test_build_context_has_what_the_build_copies_and_nothing_else() -> None:
    copied = re.findall(r"^COPY (?!--from)(.+) \S+$", _dockerfile(), re.M)
    sources = [s for line in copied for s in line.split()]
    assert {"constraints.txt", "pyproject.toml", "src"} <= set(sources)
    for src in sources:
        assert not _ignored(src), src
    assert not _ignored("src/kubedevice/cli/main.py")
    for junk in (".git", ".venv", "tests/conftest.py", "bench", "charts", ".ci/run"):
        assert _ignored(junk), junk

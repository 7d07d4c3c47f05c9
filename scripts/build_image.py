"""Build the project's container image without Docker or a registry; the Dockerfile is the plan.

    scripts/build-image [--out kubedevice.tar] [--tag localhost/kubedevice:dev] [--import SOCKET]

The Dockerfile is read, not copied: its base (``ARG PYTHON_IMAGE``: a Python on Debian
bookworm), its ``pip wheel`` and ``pip install`` lines, its ``ENV``, ``USER``,
``ENTRYPOINT`` and ``CMD`` drive the steps below, and an instruction or ``RUN`` line this
script does not know stops the build (so the two cannot drift apart silently):

1. the base: Debian's release of the base image (``mmdebstrap``) with ``python3`` and
   ``python3-pip``; cached under ``~/.cache/kubedevice-image/base-<key>.tar``;
2. the Dockerfile's ``pip wheel`` line, run here on the checkout (wheels of kubedevice and
   every pinned dependency, constraints.txt);
3. the dependencies installed into the base once per constraints.txt (cached as
   ``deps-<key>.tar``), then the Dockerfile's ``pip install`` line in the root file system
   (``chroot``), which adds kubedevice itself;
4. packed as a one-layer image with the Dockerfile's env, entrypoint (dumb-init as pid 1)
   and command (``runtime/mkimage.py`` format: ``docker save``), and with ``--import``
   loaded into a containerd (``ctr -n k8s.io images import``).

Needs root (mmdebstrap, chroot) and Debian's ``mmdebstrap``. Prints the tar's path.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "kubedevice-image"
MIRROR = os.environ.get("DEBIAN_MIRROR", "http://deb.debian.org/debian")
#: the Debian packages that stand for the base image's Python (python:3.11-slim-bookworm:
#: CPython 3.11 and pip on Debian bookworm)
BASE_PACKAGES = ("python3", "python3-pip", "ca-certificates", "libstdc++6")
#: each Debian release's own Python: the base image's must be the same
DEBIAN_PYTHON = {"bookworm": "3.11", "trixie": "3.13"}
#: the instructions this build understands; any other stops it
KNOWN = {"ARG", "FROM", "WORKDIR", "COPY", "RUN", "LABEL", "USER", "ENV", "ENTRYPOINT", "CMD"}


class PlanError(Exception):
    """The Dockerfile has a step this build does not know how to follow."""


@dataclass
class Plan:
    """What the Dockerfile says to do, as this build follows it."""

    base: str  # the base image (ARG PYTHON_IMAGE), e.g. python:3.11-slim-bookworm
    suite: str  # its Debian release, e.g. bookworm
    python: str  # its Python, e.g. 3.11
    wheel_args: list[str]  # pip wheel ... (the build stage)
    install_args: list[str]  # pip install ... (the final stage)
    env: dict[str, str] = field(default_factory=dict)
    user: str = ""
    entrypoint: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)


def _instructions(text: str) -> list[tuple[str, str]]:
    """``(INSTRUCTION, rest)`` for each logical line (continuations joined, comments out)."""
    out: list[tuple[str, str]] = []
    buf = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        word, _, rest = buf.partition(" ")
        out.append((word.upper(), rest.strip()))
        buf = ""
    return out


def _pip_args(run: str, verb: str) -> list[str]:
    """The arguments of the ``pip <verb>`` command of a RUN line (up to ``&&``)."""
    words = shlex.split(run)
    i = words.index("pip")
    if words[i + 1] != verb:
        raise PlanError(f"RUN {run!r}: expected pip {verb}")
    args = []
    for w in words[i + 2 :]:
        if w == "&&":
            break
        args.append(w)
    return args


def plan(dockerfile: Path = ROOT / "Dockerfile") -> Plan:
    """Read the Dockerfile into a :class:`Plan`; :class:`PlanError` on a step not followed."""
    args: dict[str, str] = {}
    wheel: list[str] | None = None
    install: list[str] | None = None
    p = Plan("", "", "", [], [])
    for word, rest in _instructions(dockerfile.read_text()):
        if word not in KNOWN:
            raise PlanError(f"{dockerfile.name}: {word} is not followed by this build")
        if word == "ARG":
            name, _, default = rest.partition("=")
            args[name] = default
        elif word == "RUN":
            if rest.startswith("pip wheel "):
                wheel = _pip_args(rest, "wheel")
            elif rest.startswith("pip install "):
                install = _pip_args(rest, "install")
                tail = rest.split("&&", 1)[1].strip() if "&&" in rest else ""
                if tail and not tail.startswith("rm -rf "):
                    raise PlanError(f"RUN {rest!r}: only a clean-up may follow pip install")
            else:
                raise PlanError(f"RUN {rest!r} is not followed by this build")
        elif word == "ENV":
            p.env.update(dict(kv.split("=", 1) for kv in shlex.split(rest)))
        elif word == "USER":
            p.user = rest
        elif word == "ENTRYPOINT":
            p.entrypoint = json.loads(rest)
        elif word == "CMD":
            p.cmd = json.loads(rest)
    base = args.get("PYTHON_IMAGE", "")
    m = re.fullmatch(r"python:(\d+\.\d+)-slim-(\w+)", base)
    if not m:
        raise PlanError(f"base image {base!r}: expected python:X.Y-slim-<debian release>")
    if DEBIAN_PYTHON.get(m.group(2)) != m.group(1):
        raise PlanError(
            f"base image {base!r}: Debian {m.group(2)}'s Python is "
            f"{DEBIAN_PYTHON.get(m.group(2), 'unknown here')}, not {m.group(1)}"
        )
    if wheel is None or install is None:
        raise PlanError("the Dockerfile has no pip wheel or no pip install line")
    p.base, p.python, p.suite = base, m.group(1), m.group(2)
    p.wheel_args, p.install_args = wheel, install
    return p


def _key(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def _run(argv: list[str], **kw: object) -> None:
    subprocess.run(argv, check=True, **kw)  # type: ignore[call-overload]


def _log(msg: str) -> None:
    print(f"build-image: {msg}", file=sys.stderr, flush=True)


def base_tar(p: Plan) -> Path:
    """The Debian base with the base image's Python (mmdebstrap), cached."""
    tar = CACHE / f"base-{_key(p.suite, *BASE_PACKAGES, MIRROR)}.tar"
    if tar.exists():
        return tar
    if shutil.which("mmdebstrap") is None:
        raise PlanError("mmdebstrap is missing: apt-get install mmdebstrap")
    CACHE.mkdir(parents=True, exist_ok=True)
    tmp = tar.with_suffix(f".tmp{os.getpid()}.tar")  # mmdebstrap: a tar by its name
    t0 = time.monotonic()
    try:
        _run(
            ["mmdebstrap", "--quiet", "--variant=essential", f"--include={','.join(BASE_PACKAGES)}",
             "--mode=root", p.suite, str(tmp), MIRROR]
        )  # fmt: skip
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    tmp.rename(tar)
    _log(f"base {p.suite} + {' '.join(BASE_PACKAGES)}: {time.monotonic() - t0:.0f} s -> {tar}")
    return tar


def _extract(tar: Path, dest: Path) -> None:
    _run(["tar", "-C", str(dest), "--numeric-owner", "-xpf", str(tar)])


def _pip_in(rootfs: Path, args: list[str]) -> None:
    """``pip install ARGS`` in the root file system (Debian's pip: into /usr/local)."""
    _run(
        [shutil.which("chroot") or "/usr/sbin/chroot", str(rootfs),
         "/usr/bin/python3", "-m", "pip", "install", "--quiet",
         "--break-system-packages", "--root-user-action=ignore", "--disable-pip-version-check",
         *args],
        env={"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/root"},
    )  # fmt: skip


def build(out: Path, tag: str, workdir: Path) -> Path:
    p = plan()
    _log(f"plan from the Dockerfile: {p.base} -> Debian {p.suite}, Python {p.python}")
    base = base_tar(p)
    wheels = workdir / "wheels"
    # the build stage: pip wheel as the Dockerfile runs it, on this checkout, into ``wheels``
    args = list(p.wheel_args)
    args[args.index("--wheel-dir") + 1] = str(wheels)
    _run([sys.executable, "-m", "pip", "wheel", "--quiet", *args], cwd=workdir / "src")
    rootfs = workdir / "rootfs"
    rootfs.mkdir()
    constraints = (ROOT / "constraints.txt").read_bytes()
    deps = CACHE / f"deps-{_key(base.name, hashlib.sha256(constraints).hexdigest())}.tar"
    if deps.exists():
        _extract(deps, rootfs)
    else:
        _extract(base, rootfs)
        (rootfs / "wheels").mkdir(exist_ok=True)
        for w in wheels.iterdir():
            if not w.name.startswith("kubedevice-"):
                shutil.copy2(w, rootfs / "wheels" / w.name)
        (rootfs / "tmp" / "constraints.txt").write_bytes(constraints)
        deps_only = [f"/wheels/{w.name}" for w in sorted((rootfs / "wheels").iterdir())]
        _pip_in(rootfs, ["--no-index", "-c", "/tmp/constraints.txt", *deps_only])
        shutil.rmtree(rootfs / "wheels")
        (rootfs / "tmp" / "constraints.txt").unlink()
        tmp = deps.with_suffix(f".tmp{os.getpid()}")
        _run(["tar", "-C", str(rootfs), "--numeric-owner", "-cpf", str(tmp), "."])
        tmp.rename(deps)
    rootfs_wheels = rootfs / "wheels"
    rootfs_wheels.mkdir(exist_ok=True)
    for w in wheels.iterdir():
        shutil.copy2(w, rootfs_wheels / w.name)
    (rootfs / "tmp" / "constraints.txt").write_bytes(constraints)
    # the final stage: the Dockerfile's pip install line, then its clean-up
    _pip_in(rootfs, p.install_args)
    shutil.rmtree(rootfs_wheels)
    (rootfs / "tmp" / "constraints.txt").unlink()
    for d in ("var/cache/apt/archives", "var/lib/apt/lists"):
        shutil.rmtree(rootfs / d, ignore_errors=True)
    env = dict(os.environ)
    env["IMAGE_ENV"] = " ".join(f"{k}={v}" for k, v in p.env.items())
    env["IMAGE_ENTRYPOINT"] = " ".join(p.entrypoint)
    _run([sys.executable, str(mkimage()), str(rootfs), tag, str(out), *p.cmd], env=env)
    return out


def mkimage() -> Path:
    """The image packer (``mkimage.py``: a root file system as a ``docker save`` tar), from
    ``$KUBEDEVICE_MKIMAGE`` (``make image-tar`` and the tests set it)."""
    env = os.environ.get("KUBEDEVICE_MKIMAGE")
    if env and Path(env).is_file():
        return Path(env)
    raise PlanError("no image packer: set KUBEDEVICE_MKIMAGE to a mkimage.py (tests/e2e/README.md)")


def _stage_source(dest: Path) -> None:
    """What the Dockerfile's build stage COPYs: constraints, pyproject, README, LICENSE, src."""
    dest.mkdir()
    for name in ("constraints.txt", "pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, dest / name)
    shutil.copytree(ROOT / "src", dest / "src", ignore=shutil.ignore_patterns("__pycache__"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("kubedevice-image.tar"))
    ap.add_argument("--tag", default="localhost/kubedevice:dev")
    ap.add_argument("--import", dest="socket", help="containerd socket to import the image into")
    ap.add_argument("--ctr", default="ctr", help="the ctr binary (with --import)")
    a = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("build-image: needs root (mmdebstrap, chroot)", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kd-image-") as tmp:
        work = Path(tmp)
        _stage_source(work / "src")
        try:
            out = build(a.out.resolve(), a.tag, work)
        except PlanError as e:
            print(f"build-image: {e}", file=sys.stderr)
            return 1
    if a.socket:
        _run([a.ctr, "-a", a.socket, "-n", "k8s.io", "images", "import", str(out)],
             stdout=subprocess.DEVNULL)  # fmt: skip
    with tarfile.open(out) as t:
        size = sum(m.size for m in t.getmembers())
    _log(f"{a.tag}: {size / 1e6:.0f} MB in {time.monotonic() - t0:.0f} s")
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

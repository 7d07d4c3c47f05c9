"""The real container runtime for the tier: containerd 2.4 + runc + CNI (``../shared/k8s/runtime``).

``Containerd(scripts, state).up()`` runs ``runtime/up.sh STATE`` (containerd with its CRI plugin,
CDI on, reading ``STATE/cdi``; the images ``localhost/busybox:1`` and ``localhost/pause:1``) and
returns the CRI endpoint for the kubelet; ``down()`` runs ``runtime/down.sh STATE``: every
container, shim, overlay mount and the bridge it made. Both run in the test process's mount
namespace, the kubelet's and the plugins' (the runtime resolves every host path there).

A real runtime ``lstat``s every device node it is handed: ``private_dev()`` puts a tmpfs on
``/dev`` of this (private) mount namespace holding the host's nodes, so a test can ``mknod``
``/dev/nvidia0`` or ``/dev/kde2e/...`` without touching the machine's ``/dev``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
import subprocess
import zlib
from collections.abc import Iterator
from pathlib import Path

POD_LOGS = Path("/var/log/pods")
HOW_TO_GET_RUNTIME = (
    "no container runtime: set KUBEDEVICE_RUNTIME_DIR to a directory with up.sh, down.sh and "
    "unpack.sh (containerd 2.4 + runc + CNI), or put ../shared/k8s/runtime beside the checkout "
    "(tests/e2e/README.md)"
)
BUSYBOX = "localhost/busybox:1"
PAUSE = "localhost/pause:1"
#: the image kd-fakecri is handed (never pulled) and what stands for it on the real runtime
FAKE_PAUSE = "registry.k8s.io/pause:3.10"


class ContainerdError(Exception):
    """runtime/up.sh or down.sh failed."""


def find_runtime(repo_root: Path) -> Path | None:
    """``$KUBEDEVICE_RUNTIME_DIR``, else ``shared/k8s/runtime`` beside the checkout; the runtime
    binaries unpack there (``unpack.sh``). ``None`` when absent."""
    env = os.environ.get("KUBEDEVICE_RUNTIME_DIR")
    candidates = (
        [Path(env)]
        if env
        else [repo_root.parent / "shared" / "k8s" / "runtime",
              repo_root.parent.parent / "shared" / "k8s" / "runtime"]
    )  # fmt: skip
    for d in candidates:
        if all((d / s).is_file() for s in ("up.sh", "down.sh", "unpack.sh")):
            out = subprocess.run(
                [str(d / "unpack.sh")], capture_output=True, text=True, check=False, timeout=300
            )
            if out.returncode == 0:
                return d
    return None


def runtime_bin(scripts: Path) -> Path:
    """The directory of the unpacked runtime binaries (``ctr``, ``runc``, ...)."""
    out = subprocess.run(
        [str(scripts / "unpack.sh")], capture_output=True, text=True, check=True, timeout=300
    )
    return Path(out.stdout.strip().splitlines()[-1])


class Containerd:
    """One containerd for one kubelet; its state, log and CDI dir are under ``state``."""

    def __init__(self, scripts: Path, state: Path) -> None:
        self.scripts = scripts
        self.state = state
        self.bin = runtime_bin(scripts)
        self.endpoint = ""
        #: an argv prefix for up.sh and down.sh (``nsenter --mount=...``): the runtime then
        #: runs in that mount namespace (its kubelet's) and resolves host paths there
        self.prefix: list[str] = []
        # a pod subnet of this run's own: another run's bridge on the machine keeps its own
        octet = zlib.crc32(str(state).encode()) % 200 + 20
        self.env = {
            **os.environ,
            "CDI_DIR": str(self.cdi_dir),
            "KD_POD_SUBNET": f"10.88.{octet}.0/24",
            "RUNTIME_BIN": str(self.bin),
        }

    @property
    def cdi_dir(self) -> Path:
        """The CDI spec directory containerd reads (a DRA driver's ``--cdi-dir``)."""
        return self.state / "cdi"

    @property
    def log(self) -> Path:
        return self.state / "logs" / "containerd.log"

    @property
    def socket(self) -> Path:
        return self.state / "containerd" / "containerd.sock"

    def up(self) -> str:
        """Start containerd and load the images; return the CRI endpoint (``unix://...``)."""
        self.state.mkdir(parents=True, exist_ok=True)
        out = subprocess.run(
            [*self.prefix, str(self.scripts / "up.sh"), str(self.state)],
            capture_output=True, text=True, env=self.env, check=False, timeout=180,
        )  # fmt: skip
        if out.returncode != 0:
            raise ContainerdError(f"runtime/up.sh failed: {out.stderr.strip()}")
        self.endpoint = out.stdout.strip().splitlines()[-1]
        return self.endpoint

    def alive(self) -> bool:
        pid = self.state / "pids" / "containerd.pid"
        with contextlib.suppress(OSError, ValueError):
            return Path(f"/proc/{int(pid.read_text())}").is_dir()
        return False

    def down(self) -> None:
        """Stop every container and shim, containerd, the overlay mounts, the bridge."""
        subprocess.run(
            [*self.prefix, str(self.scripts / "down.sh"), str(self.state)],
            capture_output=True, env=self.env, check=False, timeout=120,
        )  # fmt: skip

    def ctr(self, *args: str) -> str:
        out = subprocess.run(
            [str(self.bin / "ctr"), "-a", str(self.socket), "-n", "k8s.io", *args],
            capture_output=True, text=True, check=True, timeout=120,
        )  # fmt: skip
        return out.stdout

    def import_image(self, tar: Path, ref: str | None = None) -> None:
        """Load the image tar (skipped when ``ref`` is given and already here)."""
        if ref is not None and ref in self.ctr("images", "ls", "-q").split():
            return
        self.ctr("images", "import", str(tar))

    def tasks(self) -> list[str]:
        """The ids of the running containers (sandboxes included)."""
        return [ln.split()[0] for ln in self.ctr("tasks", "ls").splitlines()[1:] if ln.strip()]

    def spec(self, container_id: str) -> dict[str, object]:
        """A container's OCI spec as containerd made it (``ctr containers info``)."""
        info = json.loads(self.ctr("containers", "info", container_id))
        return dict(info.get("Spec") or {})


# ---------------------------------------------------------------------------------------------
# /dev and /var/log/pods of the private mount namespace


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, capture_output=True)


def private_dev(scratch: Path) -> None:
    """A tmpfs on ``/dev`` with the host's nodes (copied), symlinks and subtrees (bound).

    Only in a private mount namespace (the tier's): the machine's ``/dev`` is untouched, and
    device nodes a test makes there vanish with the namespace.
    """
    if Path("/dev/.kd-e2e-private").exists():
        return
    host = scratch / "host-dev"
    host.mkdir(parents=True, exist_ok=True)
    _mount("--rbind", "/dev", str(host))
    _mount("-t", "tmpfs", "-o", "mode=0755,nosuid", "tmpfs", "/dev")
    for entry in os.scandir(host):
        src, dst = Path(entry.path), Path("/dev") / entry.name
        st = os.lstat(src)
        if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
            os.mknod(dst, st.st_mode, st.st_rdev)
            os.chown(dst, st.st_uid, st.st_gid)
            os.chmod(dst, stat.S_IMODE(st.st_mode))  # not the umask's (/dev/null: 0666)
        elif stat.S_ISLNK(st.st_mode):
            os.symlink(os.readlink(src), dst)
        elif stat.S_ISDIR(st.st_mode):
            dst.mkdir(mode=stat.S_IMODE(st.st_mode))
            _mount("--rbind", str(src), str(dst))
        # sockets and files in /dev (none that matter here) are left out
    Path("/dev/.kd-e2e-private").touch()
    # a volume mounted with HostToContainer propagation (the chart's /dev and /sys) needs a
    # shared or slave source ("... is not a shared or slave mount"): shared within this
    # namespace only (it was made private from the machine's)
    _mount("--make-rshared", "/")


def pod_logs_tmpfs() -> bool:
    """A tmpfs on ``/var/log/pods`` (container output) unless one is there; True if mounted."""
    POD_LOGS.mkdir(parents=True, exist_ok=True)
    if os.path.ismount(POD_LOGS):
        return False
    _mount("-t", "tmpfs", "-o", "mode=0755", "tmpfs", str(POD_LOGS))
    return True


def mknod_char(path: Path, major: int, minor: int) -> Path:
    """A real character device node at ``path`` (a real runtime ``lstat``s it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
    os.chmod(path, 0o666)
    return path


_LINE = re.compile(r"^\S+ (stdout|stderr) [FP] ?(.*)$")


def container_output(namespace: str, pod: str, uid: str, container: str) -> str:
    """What ``container`` of the pod wrote (stdout and stderr, as the kubelet's CRI log keeps it:
    ``/var/log/pods/<ns>_<pod>_<uid>/<container>/<restart>.log``), the last run's."""
    d = POD_LOGS / f"{namespace}_{pod}_{uid}" / container
    logs = sorted(d.glob("*.log"), key=lambda p: int(p.stem) if p.stem.isdigit() else -1)
    if not logs:
        return ""
    lines = []
    for raw in logs[-1].read_text(errors="replace").splitlines():
        m = _LINE.match(raw)
        lines.append(m.group(2) if m else raw)
    return "\n".join(lines)


def real_pause(manifest: dict[str, object]) -> dict[str, object]:
    """``manifest`` with kd-fakecri's pause image replaced by the local one (which really runs)."""
    spec = manifest.get("spec")
    if isinstance(spec, dict):
        for key in ("containers", "initContainers"):
            for c in spec.get(key) or []:
                if c.get("image") == FAKE_PAUSE:
                    c["image"] = PAUSE
    return manifest


def runtime_of(env: dict[str, str] | None = None) -> str:
    """The tier's default runtime: ``KUBEDEVICE_E2E_RUNTIME`` (``fakecri`` or ``containerd``)."""
    value = (env if env is not None else os.environ).get("KUBEDEVICE_E2E_RUNTIME", "fakecri")
    return value or "fakecri"


RUNTIMES = ("fakecri", "containerd")


@contextlib.contextmanager
def nodes(paths: dict[Path, tuple[int, int]]) -> Iterator[list[Path]]:
    """Real char nodes at ``paths`` (path -> major, minor) for the block; removed afterwards."""
    made = [mknod_char(p, *mm) for p, mm in paths.items()]
    try:
        yield made
    finally:
        for p in made:
            with contextlib.suppress(FileNotFoundError):
                p.unlink()


def busybox(
    name: str,
    script: str,
    limits: dict[str, int] | None = None,
    claims: list[str] | None = None,
) -> dict[str, object]:
    """A container of ``localhost/busybox:1`` running ``sh -c script`` (its output is the test's
    view from inside), asking for ``limits`` and/or the pod's ``claims``."""
    c: dict[str, object] = {
        "name": name,
        "image": BUSYBOX,
        "command": ["/bin/sh", "-c", script],
        "resources": {"limits": {k: str(v) for k, v in (limits or {}).items()}},
    }
    if claims:
        c["resources"] = {**c["resources"], "claims": [{"name": n} for n in claims]}  # type: ignore[dict-item]
    return c


#: what a container prints about its devices: one line per node under /dev (``DEV path major
#: minor`` in hex, as ``stat -c '%t %T'`` prints), then its environment (``ENV K=V``)
SHOW = (
    "for f in $(busybox find /dev -type c); do echo DEV $f $(stat -c '%t %T' $f); done; "
    "env | busybox sed 's/^/ENV /'"
)


def parse_show(output: str) -> tuple[dict[str, tuple[int, int]], dict[str, str]]:
    """``SHOW``'s output: device path -> (major, minor), and the env."""
    devs: dict[str, tuple[int, int]] = {}
    env: dict[str, str] = {}
    for line in output.splitlines():
        if line.startswith("DEV "):
            parts = line.split()
            if len(parts) == 4:
                devs[parts[1]] = (int(parts[2], 16), int(parts[3], 16))
        elif line.startswith("ENV ") and "=" in line:
            k, _, v = line[4:].partition("=")
            env[k] = v
    return devs, env

"""End-to-end check of the GPU DRA driver on a real NVIDIA GPU; prints one JSON object.

Run it as ``scripts/gpu-dra-check`` as root on a machine with an NVIDIA driver and
``nvidia-ml-py``, with the Kubernetes binaries ``etcd``, ``kube-apiserver``, ``kubelet`` and
``kd-fakecri`` in ``--k8s-bin DIR`` (or ``$KUBEDEVICE_K8S_BIN``). kubedevice need not be
installed: ``src/`` of this checkout is used, its dependencies come from ``$PYTHONPATH``.
Steps, all inside a private mount namespace (a tmpfs on the kubelet's fixed
``/var/lib/kubelet/device-plugins`` and on ``/var/log``), so the host's mounts are untouched:

1. etcd and kube-apiserver on free ports of 127.0.0.1 with their own PKI (no scheduler, no
   controller-manager: the ServiceAccount admission plugin is off), ``kd-fakecri`` and a real
   kubelet for Node ``gpu-node``; wait until the Node is Ready.
2. ``kubedevice nvidia dra --nvml real`` starts (timed until its ResourceSlice is published);
   every published device's uuid, productName, memory capacity, PCI bus ID, minor (the
   device name ``gpu-<minor>``) and NUMA node must agree with what NVML (and sysfs) says.
3. With no scheduler, allocation is by hand: a DeviceClass, a ResourceClaim, a Pod naming it;
   the claim's ``status`` gets the allocation (the first GPU, a nodeSelector for the node) and
   ``reservedFor`` the pod, then the pod is bound to the node (what the scheduler does).
   The kubelet calls NodePrepareResources: the pod must be Running, the runtime's record must
   name the claim's CDI device, and the CDI spec must give that GPU's ``/dev/nvidia<minor>``.
   With torch importable, a CUDA process with the container's view of the GPU (the spec's
   ``*_VISIBLE_DEVICES`` env, else ``CUDA_VISIBLE_DEVICES=<the published uuid>``) must see
   exactly that GPU. Deleting the pod must unprepare the claim (the CDI spec goes).

Exit status: 0 when every check passed, 1 when one failed (the JSON says which), 2 without
NVML. The JSON also goes to ``$OUT/gpu-dra-check.json`` when ``$OUT`` is set. A global
deadline (``--deadline``, 240 s) bounds the run; every process group started is stopped and
the temp dir removed, also on failure.

``--nvml fake:MACHINE`` rehearses the same steps without a GPU (the fake NVML backend and its
``/dev`` and ``/sys`` trees under the temp dir); the e2e tests run it that way.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import lzma
import os
import re
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
NODE = "gpu-node"
DRIVER = "gpu.kubedevice.io"
NS = "default"
BINARIES = ("etcd", "kube-apiserver", "kubelet", "kd-fakecri")
DEVICE_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
INNER = "KD_GPU_DRA_CHECK_INNER"  # set in the re-executed process inside the namespace
WORK = "KD_GPU_DRA_CHECK_WORK"
STEP_S = 60.0  # one step's limit (a pod may wait for a kubelet retry)
NAME = "gpu-dra-check"
REGISTERED = "registered with the kubelet as DRA driver"

# A CUDA process with a container's view of the GPUs (its env from the CDI spec).
CUDA_CHILD = r"""
import json, torch
n = torch.cuda.device_count()
out = {"count": n, "uuids": [], "names": []}
for i in range(n):
    p = torch.cuda.get_device_properties(i)
    u = getattr(p, "uuid", None)
    out["uuids"].append(None if u is None else str(u))
    out["names"].append(p.name)
print(json.dumps(out), flush=True)
"""


class CheckError(Exception):
    """A step did not reach its state in time, or a component failed."""


class Deadline(BaseException):
    """The global deadline passed (raised from SIGALRM; not caught by ``except Exception``)."""


# ---------------------------------------------------------------------------------------------
# what NVML says


@dataclass(frozen=True)
class Gpu:
    """One GPU as NVML (and sysfs) report it, independently of the driver."""

    uuid: str
    name: str
    memory: int
    pci_bus_id: str
    minor: int
    numa_node: int | None


def _fail_no_nvml(why: str) -> None:
    print(
        f"gpu-dra-check: NVML is not available here ({why}); it needs an NVIDIA GPU and "
        "driver, and nvidia-ml-py",
        file=sys.stderr,
    )
    raise SystemExit(2)


def _numa(sys_root: Path, bus_id: str) -> int | None:
    try:
        value = int((sys_root / "bus/pci/devices" / bus_id / "numa_node").read_text().strip())
    except (OSError, ValueError):
        return None
    return value if value >= 0 else None


def bdf(bus_id: str) -> str:
    """A PCI bus ID as ``dddd:bb:dd.f`` lower case (NVML gives an 8-digit domain)."""
    m = re.fullmatch(r"([0-9a-fA-F]+):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])", bus_id.strip())
    if m is None:
        return bus_id.strip().lower()
    return f"{int(m[1], 16):04x}:{m[2]}:{m[3]}.{m[4]}".lower()


def real_gpus() -> list[Gpu]:
    """The GPUs as pynvml says (exit 2 without NVML)."""
    try:
        import pynvml
    except ImportError:
        _fail_no_nvml("the Python module pynvml (nvidia-ml-py) is not installed")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        _fail_no_nvml(f"nvmlInit failed: {exc}")

    def text(v: Any) -> str:
        return v.decode() if isinstance(v, bytes) else str(v)

    try:
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            bus = bdf(text(pynvml.nvmlDeviceGetPciInfo(h).busId))
            out.append(
                Gpu(
                    uuid=text(pynvml.nvmlDeviceGetUUID(h)),
                    name=text(pynvml.nvmlDeviceGetName(h)),
                    memory=int(pynvml.nvmlDeviceGetMemoryInfo(h).total),
                    pci_bus_id=bus,
                    minor=int(pynvml.nvmlDeviceGetMinorNumber(h)),
                    numa_node=_numa(Path("/sys"), bus),
                )
            )
    finally:
        pynvml.nvmlShutdown()
    if not out:
        _fail_no_nvml("NVML lists no GPU")
    return out


def fake_gpus(nvml: str, work: Path) -> list[Gpu]:
    """The fake machine's GPUs; its ``/dev`` and ``/sys`` trees under ``work``."""
    from kubedevice.errors import KubeDeviceError
    from kubedevice.nvidia.fake import FakeNvml, write_fake_dev, write_fake_sysfs

    try:
        fake = FakeNvml.from_file(nvml.removeprefix("fake:"))
        fake.init()
    except KubeDeviceError as exc:
        _fail_no_nvml(str(exc))
    try:
        write_fake_dev(fake, work / "dev")
        write_fake_sysfs(fake, work / "sys")
        return [
            Gpu(
                g.uuid,
                g.name,
                g.memory_total,
                bdf(g.pci_bus_id),
                g.minor,
                _numa(work / "sys", bdf(g.pci_bus_id)),
            )
            for g in fake.gpus()
        ]
    finally:
        fake.close()


# ---------------------------------------------------------------------------------------------
# processes


def _die_with_parent() -> None:
    """In a child: SIGKILL when this script dies (even by SIGKILL)."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


@dataclass
class Proc:
    """A child in its own process group, logging to ``log``."""

    name: str
    argv: list[str]
    log: Path
    env: dict[str, str] | None = None
    popen: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        # Each child works in a directory of its own, never the caller's: the kubelet deletes
        # what its container log paths glob relative to its working directory, and the fake
        # runtime's paths are empty (every entry of the directory would match).
        cwd = self.log.parent / f"cwd-{self.name}"
        cwd.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            self.popen = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=self.env,
                cwd=cwd,
                preexec_fn=_die_with_parent,
            )

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def check(self) -> None:
        if not self.alive():
            code = None if self.popen is None else self.popen.returncode
            raise CheckError(f"{self.name} exited (status {code}): {tail(self.log, 8)}")

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM the group, wait, SIGKILL what is left; the exit status."""
        p = self.popen
        if p is None:
            return None
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=timeout)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=10)
        return p.returncode


def tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"({exc})"


def free_port() -> int:
    """A port outside the ephemeral range (kubedevice.ports; imported once src/ is on the path)."""
    from kubedevice.ports import free_port as pick

    return pick()


def poll(what: str, check: Callable[[], bool], timeout: float, procs: list[Proc]) -> None:
    """Poll ``check`` (a readiness probe or a file) until true; fail early if a process died."""
    deadline = time.monotonic() + timeout
    delay = 0.02
    while not check():
        for p in procs:
            p.check()
        if time.monotonic() > deadline:
            raise CheckError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(delay)
        delay = min(delay * 1.5, 0.25)


# ---------------------------------------------------------------------------------------------
# the API server, over plain HTTPS


class Api:
    """A tiny JSON client for the API server (admin bearer token)."""

    def __init__(self, server: str, ca: Path, token: str) -> None:
        self.server = server
        self.token = token
        self.ctx = ssl.create_default_context(cafile=str(ca))

    def call(
        self, method: str, path: str, body: Any = None, *, content_type: str = "application/json"
    ) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.server + path, data=data, method=method)
        req.add_header("Authorization", f"Bearer {self.token}")
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(req, context=self.ctx, timeout=30) as resp:
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")
            with contextlib.suppress(ValueError):
                detail = json.loads(detail).get("message", detail)
            raise CheckError(f"{method} {path}: HTTP {exc.code}: {detail}") from None

    def get(self, path: str) -> Any:
        return self.call("GET", path)

    def healthy(self) -> bool:
        req = urllib.request.Request(self.server + "/readyz")
        req.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(req, context=self.ctx, timeout=2) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    def wait(
        self,
        path: str,
        check: Callable[[dict[str, Any]], Any],
        timeout: float,
        what: str,
    ) -> Any:
        """List ``path`` (a collection), then watch it; after the list and each event call
        ``check(objects by name)``; return its first true value.

        Raises:
            CheckError: not true within ``timeout`` s (with the last objects seen).
        """
        deadline = time.monotonic() + timeout
        sep = "&" if "?" in path else "?"
        objects: dict[str, Any] = {}
        while True:
            listing = self.get(path)
            objects = {o["metadata"]["name"]: o for o in listing.get("items") or []}
            got = check(objects)
            if got:
                return got
            rv = listing["metadata"]["resourceVersion"]
            left = deadline - time.monotonic()
            if left <= 0:
                seen = json.dumps(list(objects.values()))[-1500:]
                raise CheckError(f"timed out after {timeout:.0f} s waiting for {what}; saw {seen}")
            url = f"{self.server}{path}{sep}watch=1&resourceVersion={rv}"
            url += f"&timeoutSeconds={max(1, int(left))}&allowWatchBookmarks=false"
            req = urllib.request.Request(url)
            req.add_header("Authorization", f"Bearer {self.token}")
            with urllib.request.urlopen(req, context=self.ctx, timeout=left + 5) as resp:
                for line in resp:
                    event = json.loads(line)
                    kind, obj = event.get("type"), event.get("object") or {}
                    if kind == "ERROR":
                        break  # 410 Gone: list again
                    name = obj.get("metadata", {}).get("name")
                    if kind == "DELETED":
                        objects.pop(name, None)
                    elif kind in ("ADDED", "MODIFIED"):
                        objects[name] = obj
                    got = check(objects)
                    if got:
                        return got
            if time.monotonic() >= deadline:
                seen = json.dumps(list(objects.values()))[-1500:]
                raise CheckError(f"timed out after {timeout:.0f} s waiting for {what}; saw {seen}")


# ---------------------------------------------------------------------------------------------
# the cluster


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_pki(pki: Path, users: dict[str, str]) -> dict[str, str]:
    """A CA, the API server's serving and kubelet-client certs, SA keys, static tokens."""
    pki.mkdir(parents=True)
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl(
        "req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
        "-subj", "/CN=kd-gpu-dra-check-ca", "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature", cwd=pki,
    )  # fmt: skip
    (pki / "server.ext").write_text(
        "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,"
        "DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc\n"
    )
    (pki / "client.ext").write_text(
        "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=clientAuth\n"
    )
    for name, subj, ext in (
        ("apiserver", "/CN=kube-apiserver", "server.ext"),
        ("kubelet-client", "/O=system:masters/CN=kube-apiserver-kubelet-client", "client.ext"),
    ):
        _openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subj,
                 cwd=pki)  # fmt: skip
        _openssl(
            "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", "-extfile", ext, cwd=pki,
        )  # fmt: skip
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-out", "sa.key", cwd=pki)  # fmt: skip
    _openssl("pkey", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)
    tokens = {user: os.urandom(16).hex() for user in users}
    (pki / "tokens.csv").write_text(
        "".join(
            f"{tokens[u]},{u},uid-{u.replace(':', '-')}" + (f',"{g}"' if g else "") + "\n"
            for u, g in users.items()
        )
    )
    for f in pki.iterdir():
        f.chmod(0o600)
    return tokens


def kubeconfig(path: Path, server: str, ca: Path, user: str, token: str) -> Path:
    path.write_text(
        textwrap.dedent(f"""\
        apiVersion: v1
        kind: Config
        clusters:
        - name: check
          cluster: {{server: "{server}", certificate-authority: "{ca}"}}
        users:
        - name: "{user}"
          user: {{token: "{token}"}}
        contexts:
        - name: check
          context: {{cluster: check, user: "{user}"}}
        current-context: check
        """)
    )
    path.chmod(0o600)
    return path


@dataclass
class Cluster:
    """etcd, kube-apiserver, kd-fakecri and a kubelet, as process groups of this script."""

    bin_dir: Path
    work: Path
    procs: list[Proc] = field(default_factory=list)
    api: Api | None = None
    admin_kubeconfig: Path | None = None

    @property
    def logs(self) -> Path:
        return self.work / "logs"

    @property
    def kubelet_root(self) -> Path:
        return self.work / "kubelet"

    @property
    def record(self) -> Path:
        return self.kubelet_root / "cri-record.jsonl"

    def proc(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Proc:
        p = Proc(name, argv, self.logs / f"{name}.log", env)
        self.procs.append(p)
        p.start()
        return p

    def start(self) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        pki = self.work / "pki"
        tokens = make_pki(pki, {"admin": "system:masters", f"system:node:{NODE}": "system:nodes"})
        ca = pki / "ca.crt"
        etcd_port, etcd_peer, api_port = free_port(), free_port(), free_port()
        server = f"https://127.0.0.1:{api_port}"
        b = self.bin_dir
        etcd = self.proc(
            "etcd",
            [str(b / "etcd"), "--name", "kd", "--data-dir", str(self.work / "etcd"),
             "--listen-client-urls", f"http://127.0.0.1:{etcd_port}",
             "--advertise-client-urls", f"http://127.0.0.1:{etcd_port}",
             "--listen-peer-urls", f"http://127.0.0.1:{etcd_peer}",
             "--initial-advertise-peer-urls", f"http://127.0.0.1:{etcd_peer}",
             "--initial-cluster", f"kd=http://127.0.0.1:{etcd_peer}",
             "--unsafe-no-fsync=true", "--log-level", "warn"],
        )  # fmt: skip

        def etcd_ok() -> bool:
            try:
                url = f"http://127.0.0.1:{etcd_port}/health"
                with urllib.request.urlopen(url, timeout=2) as r:
                    return bool(json.loads(r.read()).get("health") == "true")
            except (OSError, ValueError):
                return False

        poll("etcd /health", etcd_ok, 60, [etcd])
        api = self.proc(
            "kube-apiserver",
            [str(b / "kube-apiserver"),
             "--advertise-address=127.0.0.1", "--bind-address=127.0.0.1",
             f"--secure-port={api_port}", f"--etcd-servers=http://127.0.0.1:{etcd_port}",
             f"--tls-cert-file={pki / 'apiserver.crt'}",
             f"--tls-private-key-file={pki / 'apiserver.key'}",
             f"--client-ca-file={ca}", f"--token-auth-file={pki / 'tokens.csv'}",
             f"--kubelet-client-certificate={pki / 'kubelet-client.crt'}",
             f"--kubelet-client-key={pki / 'kubelet-client.key'}",
             "--kubelet-preferred-address-types=InternalIP,Hostname",
             "--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction",
             "--disable-admission-plugins=ServiceAccount",
             "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
             f"--service-account-key-file={pki / 'sa.pub'}",
             f"--service-account-signing-key-file={pki / 'sa.key'}",
             "--service-cluster-ip-range=10.96.0.0/16", "--allow-privileged=true",
             "--endpoint-reconciler-type=none", "--profiling=false", "--v=1"],
        )  # fmt: skip
        self.api = Api(server, ca, tokens["admin"])
        poll("kube-apiserver /readyz", self.api.healthy, 120, [etcd, api])
        self.admin_kubeconfig = kubeconfig(
            self.work / "admin.kubeconfig", server, ca, "admin", tokens["admin"]
        )
        node_kc = kubeconfig(
            self.work / "kubelet.kubeconfig",
            server,
            ca,
            f"system:node:{NODE}",
            tokens[f"system:node:{NODE}"],
        )
        self._start_kubelet(node_kc, ca)

    def _start_kubelet(self, node_kc: Path, ca: Path) -> None:
        root = self.kubelet_root
        root.mkdir(parents=True)
        cri_sock = root / "cri.sock"
        cri = self.proc(
            "kd-fakecri",
            [str(self.bin_dir / "kd-fakecri"), "--endpoint", f"unix://{cri_sock}",
             "--record", str(self.record)],
        )  # fmt: skip
        poll("kd-fakecri's socket", cri_sock.is_socket, 30, [cri])
        port, healthz = free_port(), free_port()
        config = root / "config.yaml"
        config.write_text(
            textwrap.dedent(f"""\
            apiVersion: kubelet.config.k8s.io/v1beta1
            kind: KubeletConfiguration
            address: 127.0.0.1
            port: {port}
            readOnlyPort: 0
            healthzBindAddress: 127.0.0.1
            healthzPort: {healthz}
            authentication:
              anonymous: {{enabled: true}}
              webhook: {{enabled: false}}
              x509: {{clientCAFile: "{ca}"}}
            authorization: {{mode: AlwaysAllow}}
            containerRuntimeEndpoint: unix://{cri_sock}
            cgroupDriver: cgroupfs
            cgroupsPerQOS: false
            enforceNodeAllocatable: []
            failSwapOn: false
            failCgroupV1: false
            resolvConf: ""
            serializeImagePulls: false
            evictionHard: {{}}
            imageGCHighThresholdPercent: 100
            imageGCLowThresholdPercent: 99
            localStorageCapacityIsolation: false
            podLogsDirectory: "{root / "pod-logs"}"
            nodeStatusUpdateFrequency: 1s
            nodeStatusReportFrequency: 1s
            """)
        )
        kubelet = self.proc(
            "kubelet",
            [str(self.bin_dir / "kubelet"), f"--kubeconfig={node_kc}", f"--config={config}",
             f"--hostname-override={NODE}", f"--root-dir={root}", f"--cert-dir={root / 'pki'}",
             "--v=2"],
        )  # fmt: skip

        def healthz_ok() -> bool:
            try:
                url = f"http://127.0.0.1:{healthz}/healthz"
                with urllib.request.urlopen(url, timeout=2) as r:
                    return bool(r.status == 200)
            except OSError:
                return False

        poll("kubelet /healthz", healthz_ok, 60, [kubelet, cri])
        assert self.api is not None

        def ready(nodes: dict[str, Any]) -> bool:
            conds = (nodes.get(NODE) or {}).get("status", {}).get("conditions") or []
            return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)

        self.api.wait(
            f"/api/v1/nodes?fieldSelector=metadata.name%3D{NODE}", ready, STEP_S, "Node Ready"
        )

    def stop(self) -> None:
        for p in reversed(self.procs):  # kubelet first, etcd last
            p.stop()
        unmount_under(self.work)


def unmount_under(root: Path) -> None:
    """Unmount whatever the kubelet mounted at or below ``root`` (deepest first)."""
    prefix = str(root.resolve()).rstrip("/") + "/"
    points = set()
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = line.split()[4].replace("\\040", " ")
            if (point + "/").startswith(prefix):
                points.add(point)
    for point in sorted(points, key=len, reverse=True):
        for _ in range(10):  # a mount may be stacked (the kubelet's root dir bind mount)
            if subprocess.run(["umount", point], capture_output=True, check=False).returncode:
                break


def records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


# ---------------------------------------------------------------------------------------------
# the check


_QUANTITY = re.compile(r"([0-9.]+)([a-zA-Z]*)")
_SUFFIX = {
    "": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50,
}  # fmt: skip


def quantity(text: str) -> int | None:
    """A Kubernetes quantity (``85899345920``, ``80Gi``) as an integer, or ``None``."""
    m = _QUANTITY.fullmatch(str(text).strip())
    if m is None or m[2] not in _SUFFIX:
        return None
    return int(float(m[1]) * _SUFFIX[m[2]])


def attr(device: dict[str, Any], name: str) -> Any:
    """A device attribute's value (``string``/``int``/``bool``/``version``), or ``None``."""
    attrs = device.get("attributes") or {}
    value = attrs.get(name, attrs.get(f"{DRIVER}/{name}"))
    if not isinstance(value, dict) or not value:
        return None
    return next(iter(value.values()))


@dataclass
class Report:
    """The checks so far, the timings, what was seen."""

    nvml: str
    checks: list[dict[str, Any]] = field(default_factory=list)
    timings_ms: dict[str, float] = field(default_factory=dict)
    facts: dict[str, Any] = field(default_factory=dict)

    def check(self, name: str, ok: bool, detail: Any = "") -> bool:
        self.checks.append({"name": name, "ok": bool(ok), "detail": detail})
        return bool(ok)

    def time(self, name: str, since: float) -> None:
        self.timings_ms[name] = round((time.monotonic() - since) * 1000, 1)


def compare_devices(report: Report, gpus: list[Gpu], devices: dict[str, Any]) -> None:
    """Every NVML GPU published once, its attributes equal to what NVML and sysfs say."""
    by_uuid = {attr(d, "uuid"): d for d in devices.values()}
    report.check(
        "every_nvml_gpu_published",
        sorted(by_uuid) == sorted(g.uuid for g in gpus) and len(by_uuid) == len(devices),
        {"nvml": [g.uuid for g in gpus], "published": sorted(devices)},
    )
    for g in gpus:
        d = by_uuid.get(g.uuid)
        if d is None:
            continue
        mem = quantity(((d.get("capacity") or {}).get("memory") or {}).get("value", ""))
        want: dict[str, tuple[Any, Any]] = {
            "name": (d["name"], f"gpu-{g.minor}"),
            "productName": (attr(d, "productName"), g.name[:64]),
            "memory": (mem, g.memory),
            "pcieBusID": (attr(d, "pcieBusID"), g.pci_bus_id),
            "resource.kubernetes.io/pciBusID": (
                attr(d, "resource.kubernetes.io/pciBusID"),
                g.pci_bus_id,
            ),
            "minor": (attr(d, "minor"), g.minor),
            "numaNode": (attr(d, "numaNode"), g.numa_node),
            "type": (attr(d, "type"), "gpu"),
        }
        for key, (got, expected) in want.items():
            report.check(
                f"{d['name']}.{key}_matches_nvml",
                got == expected,
                {"published": got, "nvml": expected},
            )


def spec_nodes(spec: dict[str, Any]) -> dict[str, list[str]]:
    return {
        d["name"]: [
            n.get("hostPath") or n["path"] for n in d["containerEdits"].get("deviceNodes", [])
        ]
        for d in spec.get("devices") or []
    }


def spec_env(spec: dict[str, Any], device: str) -> dict[str, str]:
    env: dict[str, str] = {}
    for e in spec.get("containerEdits", {}).get("env") or []:
        k, _, v = e.partition("=")
        env[k] = v
    for d in spec.get("devices") or []:
        if d["name"] == device:
            for e in d["containerEdits"].get("env") or []:
                k, _, v = e.partition("=")
                env[k] = v
    return env


def cdi_specs(cdi_dir: Path) -> dict[str, dict[str, Any]]:
    if not cdi_dir.is_dir():
        return {}
    return {p.name: json.loads(p.read_text()) for p in sorted(cdi_dir.glob("*.json"))}


def uuid_matches(torch_uuid: str | None, nvml_uuid: str) -> bool:
    if torch_uuid is None:
        return False
    return nvml_uuid.removeprefix("GPU-").lower() == torch_uuid.removeprefix("GPU-").lower()


def torch_check(report: Report, env: dict[str, str], gpu: Gpu) -> None:
    """A CUDA process with the container's GPU env sees exactly the allocated GPU."""
    probe = subprocess.run(
        [sys.executable, "-c", "import torch"], capture_output=True, timeout=60, check=False
    )
    if probe.returncode != 0:
        report.facts["torch"] = "skipped: torch is not importable"
        return
    visible = {k: v for k, v in env.items() if k.endswith("_VISIBLE_DEVICES")}
    if "CUDA_VISIBLE_DEVICES" not in visible and "NVIDIA_VISIBLE_DEVICES" not in visible:
        visible = {"CUDA_VISIBLE_DEVICES": gpu.uuid}
        report.facts["torch_env_from"] = "the published uuid (the CDI spec sets no env)"
    elif "CUDA_VISIBLE_DEVICES" not in visible:
        # what the NVIDIA container runtime does with NVIDIA_VISIBLE_DEVICES on the host
        visible["CUDA_VISIBLE_DEVICES"] = visible["NVIDIA_VISIBLE_DEVICES"]
        report.facts["torch_env_from"] = "the CDI spec's NVIDIA_VISIBLE_DEVICES"
    else:
        report.facts["torch_env_from"] = "the CDI spec's CUDA_VISIBLE_DEVICES"
    report.facts["torch_env"] = visible
    out = subprocess.run(
        [sys.executable, "-c", CUDA_CHILD],
        env={**os.environ, **visible},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if out.returncode != 0:
        report.check("torch_sees_the_gpu", False, out.stderr[-800:])
        return
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    report.facts["torch"] = seen
    report.check("torch_sees_exactly_one_gpu", seen["count"] == 1, seen["count"])
    report.check(
        "torch_gpu_is_the_allocated_one",
        bool(seen["uuids"]) and uuid_matches(seen["uuids"][0], gpu.uuid),
        {"torch": seen["uuids"], "allocated": gpu.uuid},
    )
    report.check(
        "torch_gpu_name_matches_nvml",
        bool(seen["names"]) and seen["names"][0] == gpu.name,
        {"torch": seen["names"], "nvml": gpu.name},
    )


#: What the driver process imports; a module missing here fails before any process starts.
DRIVER_IMPORTS = "import kubedevice.cli, kubedevice.nvidia.dra, kubernetes, asyncinotify, pydantic"


def preflight() -> None:
    """The driver's modules import in this Python (else one line naming what is missing)."""
    out = subprocess.run(
        [sys.executable, "-c", DRIVER_IMPORTS], capture_output=True, text=True, timeout=120
    )
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise CheckError(f"the driver cannot start in {sys.executable}: {last}")


def run_check(args: argparse.Namespace, work: Path, report: Report) -> None:
    nvml: str = args.nvml
    preflight()
    gpus = fake_gpus(nvml, work) if nvml.startswith("fake:") else real_gpus()
    report.facts["nvml_gpus"] = [g.__dict__ for g in gpus]
    bin_dir = find_binaries(args.k8s_bin, work)
    cluster = Cluster(bin_dir, work)
    driver: Proc | None = None
    cdi_dir = work / "cdi"
    api: Api | None = None
    try:
        t0 = time.monotonic()
        cluster.start()
        report.time("cluster_up_node_ready", t0)
        report.check("node_ready", True, NODE)
        api = cluster.api
        assert api is not None
        assert cluster.admin_kubeconfig is not None

        # 2. the driver and its ResourceSlice
        argv = [sys.executable, "-m", "kubedevice", "--log-level", "debug", "nvidia", "dra",
                "--nvml", nvml, "--driver-name", DRIVER, "--node-name", NODE,
                "--kubelet-dir", str(cluster.kubelet_root), "--cdi-dir", str(cdi_dir),
                "--kubeconfig", str(cluster.admin_kubeconfig)]  # fmt: skip
        if nvml.startswith("fake:"):
            argv += ["--dev-root", str(work / "dev"), "--sys-root", str(work / "sys")]
        t_driver = time.monotonic()
        driver = cluster.proc("driver", argv, env=dict(os.environ))

        def published(slices: dict[str, Any]) -> dict[str, Any] | None:
            driver.check()
            devices: dict[str, Any] = {}
            for s in slices.values():
                spec = s.get("spec") or {}
                if spec.get("driver") == DRIVER and spec.get("nodeName") == NODE:
                    devices.update({d["name"]: d for d in spec.get("devices") or []})
            return devices if len(devices) >= len(gpus) else None

        devices = api.wait(
            f"/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.driver%3D{DRIVER}",
            published,
            STEP_S,
            "the driver's ResourceSlice",
        )
        report.time("driver_start_to_slice_published", t_driver)
        report.facts["published"] = devices
        compare_devices(report, gpus, devices)
        # a pod bound before the kubelet has registered the driver waits for its next pod
        # resync (about a minute): the driver logs the kubelet's registration status
        poll(
            "the kubelet to register the driver",
            lambda: REGISTERED in driver.log.read_text(errors="replace"),
            STEP_S,
            [driver],
        )
        report.time("driver_start_to_registered", t_driver)
        report.check("driver_registered_with_the_kubelet", True, REGISTERED)

        # 3. allocation by hand, the pod, NodePrepareResources
        gpu = gpus[0]
        device_name = f"gpu-{gpu.minor}"
        if device_name not in devices:
            raise CheckError(f"no published device {device_name} for {gpu.uuid}")
        res = "/apis/resource.k8s.io/v1"
        api.call(
            "POST",
            f"{res}/deviceclasses",
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": NAME},
                "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
            },
        )
        claim = api.call(
            "POST",
            f"{res}/namespaces/{NS}/resourceclaims",
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": NAME},
                "spec": {
                    "devices": {
                        "requests": [
                            {
                                "name": "gpu",
                                "exactly": {
                                    "deviceClassName": NAME,
                                    "allocationMode": "ExactCount",
                                    "count": 1,
                                },
                            }
                        ]
                    }
                },
            },
        )
        t_pod = time.monotonic()
        pod = api.call(
            "POST",
            f"/api/v1/namespaces/{NS}/pods",
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": NAME},
                "spec": {
                    "automountServiceAccountToken": False,
                    "terminationGracePeriodSeconds": 0,
                    "resourceClaims": [{"name": "gpu", "resourceClaimName": NAME}],
                    "containers": [
                        {
                            "name": "cuda",
                            "image": "registry.k8s.io/pause:3.10",
                            "resources": {"claims": [{"name": "gpu"}]},
                        }
                    ],
                },
            },
        )
        # what the scheduler would write: the allocation, the pod as the claim's consumer
        claim["status"] = {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": device_name}
                    ]
                },
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": [NODE]}
                            ]
                        }
                    ]
                },
            },
            "reservedFor": [{"resource": "pods", "name": NAME, "uid": pod["metadata"]["uid"]}],
        }
        claim = api.call("PUT", f"{res}/namespaces/{NS}/resourceclaims/{NAME}/status", claim)
        report.check(
            "claim_allocated_by_hand",
            bool(claim.get("status", {}).get("allocation")),
            claim.get("status", {}).get("allocation", {}).get("devices"),
        )
        api.call(
            "POST",
            f"/api/v1/namespaces/{NS}/pods/{NAME}/binding",
            {
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": {"name": NAME},
                "target": {"apiVersion": "v1", "kind": "Node", "name": NODE},
            },
        )

        def running(pods: dict[str, Any]) -> bool:
            driver.check()
            return bool((pods.get(NAME) or {}).get("status", {}).get("phase") == "Running")

        api.wait(
            f"/api/v1/namespaces/{NS}/pods?fieldSelector=metadata.name%3D{NAME}",
            running,
            args.pod_timeout,
            "the pod Running",
        )
        report.time("pod_created_to_running", t_pod)
        report.check("pod_running", True, NAME)

        claim_uid = claim["metadata"]["uid"]
        cdi_id = f"k8s.{DRIVER}/claim={claim_uid}-{device_name}"
        created = [r for r in records(cluster.record) if r.get("pod") == NAME]
        cdi = [d["name"] for d in (created[-1].get("cdiDevices") or [])] if created else []
        report.facts["runtime_cdi_devices"] = cdi
        report.check("runtime_got_the_claims_cdi_device", cdi == [cdi_id], {"want": cdi_id})
        specs = cdi_specs(cdi_dir)
        report.facts["cdi_spec_files"] = sorted(specs)
        [spec] = specs.values() if len(specs) == 1 else [{}]
        nodes = spec_nodes(spec).get(f"{claim_uid}-{device_name}", [])
        report.facts["cdi_device_nodes"] = nodes
        report.check(
            "cdi_spec_names_the_gpus_device_node",
            bool(nodes) and nodes[0] == f"/dev/nvidia{gpu.minor}",
            {"spec": nodes[:1], "nvml_minor": gpu.minor},
        )
        missing = [n for n in nodes if not host_path(n, work, nvml).exists()]
        report.check("cdi_device_nodes_exist", bool(nodes) and not missing, {"missing": missing})
        if nvml.startswith("fake:"):
            report.facts["torch"] = "skipped: fake NVML"
        else:
            torch_check(report, spec_env(spec, f"{claim_uid}-{device_name}"), gpu)

        # delete the pod: the kubelet unprepares the claim, the driver removes its spec
        t_del = time.monotonic()
        api.call("DELETE", f"/api/v1/namespaces/{NS}/pods/{NAME}")
        api.wait(
            f"/api/v1/namespaces/{NS}/pods?fieldSelector=metadata.name%3D{NAME}",
            lambda pods: NAME not in pods,
            STEP_S,
            "the pod gone",
        )
        poll("the claim's CDI spec removed", lambda: not cdi_specs(cdi_dir), STEP_S, [driver])
        report.time("pod_deleted_to_unprepared", t_del)
        report.check("claim_unprepared_cdi_spec_removed", True, sorted(cdi_specs(cdi_dir)))

        driver_status = driver.stop()
        report.check("driver_clean_exit", driver_status == 0, driver_status)
    finally:
        if driver is not None and driver.alive():
            driver.stop()
        failed = not report.checks or not all(c["ok"] for c in report.checks)
        if failed or args.logs:
            report.facts["logs"] = {
                p.name: tail(p.log, 25) for p in cluster.procs if p.name in ("driver", "kubelet")
            }
        cluster.stop()


def host_path(path: str, work: Path, nvml: str) -> Path:
    """Where a ``/dev/...`` path of the spec is here (the fake's tree in a rehearsal)."""
    if nvml.startswith("fake:"):
        return work / "dev" / path.removeprefix("/dev/")
    return Path(path)


def find_binaries(option: str | None, work: Path) -> Path:
    """The Kubernetes binaries from ``--k8s-bin``, else ``$KUBEDEVICE_K8S_BIN``.

    A binary there only as ``NAME.xz`` (the compressed form, small enough to carry) is
    unpacked into ``work/bin``.
    """
    candidates = [option, os.environ.get("KUBEDEVICE_K8S_BIN")]
    for c in candidates:
        if c:
            d = Path(c).resolve()  # the children run in directories of their own
            missing = [
                b for b in BINARIES if not (d / b).is_file() and not (d / f"{b}.xz").is_file()
            ]
            if missing:
                raise CheckError(f"--k8s-bin {d}: missing {', '.join(missing)}")
            if all((d / b).is_file() for b in BINARIES):
                return d
            unpacked = work / "bin"
            unpacked.mkdir(exist_ok=True)
            for b in BINARIES:
                if (d / b).is_file():
                    (unpacked / b).symlink_to((d / b).resolve())
                    continue
                with lzma.open(d / f"{b}.xz") as src, (unpacked / b).open("wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
                (unpacked / b).chmod(0o755)
            return unpacked
    raise CheckError(
        "no Kubernetes binaries: pass --k8s-bin DIR or set KUBEDEVICE_K8S_BIN (etcd, "
        "kube-apiserver, kubelet and kd-fakecri of Kubernetes v1.34 or newer)"
    )


# ---------------------------------------------------------------------------------------------
# entry points


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--nvml", default="real", help="'real' (default) or 'fake:MACHINE' to rehearse"
    )
    parser.add_argument(
        "--k8s-bin",
        default=None,
        help="the directory with etcd, kube-apiserver, kubelet, kd-fakecri (or NAME.xz) "
        "[default: $KUBEDEVICE_K8S_BIN]",
    )
    parser.add_argument(
        "--deadline", type=float, default=240.0, help="give up after this many seconds"
    )
    parser.add_argument(
        "--pod-timeout",
        type=float,
        default=100.0,
        help="how long the pod may take to run (a kubelet retry after a refused claim read "
        "comes at its next pod resync, up to a minute)",
    )
    parser.add_argument("--logs", action="store_true", help="add log tails to the JSON")
    return parser


def _emit(result: dict[str, Any], name: str = NAME) -> None:
    text = json.dumps(result, indent=2, default=str)
    print(text, flush=True)
    out = os.environ.get("OUT")
    if out:
        with contextlib.suppress(OSError):
            Path(out).mkdir(parents=True, exist_ok=True)
            (Path(out) / f"{name}.json").write_text(text + "\n")


@dataclass(frozen=True)
class Script:
    """A check run this way (``gpu-dra-check``, ``gpu-mps-check``): its name, file, options
    and steps (``run(args, work, report)``)."""

    name: str
    file: str
    parser: Callable[[], argparse.ArgumentParser]
    run: Callable[[argparse.Namespace, Path, Report], None]


def inner(argv: list[str], script: Script | None = None) -> int:
    """In the private mount namespace: the tmpfs mounts, the check, the JSON."""
    script = script or THIS
    args = script.parser().parse_args(argv)
    work = Path(os.environ[WORK])
    report = Report(args.nvml)
    report.facts["work_dir"] = str(work)  # removed when the check ends
    error = None

    def alarm(_sig: int, _frame: Any) -> None:
        raise Deadline(f"the global deadline ({args.deadline:.0f} s) passed")

    def terminate(_sig: int, _frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: the clean-up must run
        raise Deadline("terminated by a signal")

    signal.signal(signal.SIGALRM, alarm)
    signal.signal(signal.SIGTERM, terminate)
    signal.setitimer(signal.ITIMER_REAL, max(1.0, args.deadline - 5))
    t0 = time.monotonic()
    try:
        for point in (DEVICE_PLUGIN_DIR, Path("/var/log")):
            subprocess.run(
                ["mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", str(point)],
                check=True,
                capture_output=True,
                timeout=30,
            )
        script.run(args, work, report)
    except SystemExit:
        raise
    except (Exception, Deadline) as exc:  # report what failed in the JSON, not as a traceback
        error = f"{type(exc).__name__}: {exc}"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    report.timings_ms["total"] = round((time.monotonic() - t0) * 1000, 1)
    ok = error is None and bool(report.checks) and all(c["ok"] for c in report.checks)
    result: dict[str, Any] = {
        "ok": ok,
        "nvml": args.nvml,
        "node": NODE,
        "driver": DRIVER,
        "python": sys.version.split()[0],
        "checks": report.checks,
        "failed": [c["name"] for c in report.checks if not c["ok"]],
        "timings_ms": report.timings_ms,
        **report.facts,
    }
    if error is not None:
        result["error"] = error
    _emit(result, script.name)
    return 0 if ok else 1


def outer(argv: list[str], script: Script | None = None) -> int:
    """Re-run this script inside ``unshare -m`` (private mounts); clean up after it."""
    script = script or THIS
    args = script.parser().parse_args(argv)
    if not args.nvml.startswith("fake:"):
        real_gpus()  # exit 2 before anything starts when there is no NVML
    if os.geteuid() != 0:
        print(f"{script.name}: run it as root (mount namespace, kubelet)", file=sys.stderr)
        return 1
    if shutil.which("unshare") is None or shutil.which("openssl") is None:
        print(f"{script.name}: needs the unshare and openssl commands", file=sys.stderr)
        return 1
    made: list[Path] = []  # the mount point's parents we create (removed afterwards)
    for d in (DEVICE_PLUGIN_DIR.parent, DEVICE_PLUGIN_DIR):
        if not d.exists():
            d.mkdir()
            made.append(d)
    work = Path(tempfile.mkdtemp(prefix="kd-gdc-", dir="/tmp"))
    env = {**os.environ, INNER: "1", WORK: str(work)}
    cmd = ["unshare", "-m", "--propagation", "private", sys.executable, script.file, *argv]
    proc = subprocess.Popen(cmd, env=env, start_new_session=True, preexec_fn=_die_with_parent)

    def forward(_sig: int, _frame: Any) -> None:
        """SIGTERM/SIGINT here: the check stops early, cleans up and still prints its JSON."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    try:
        code = proc.wait(timeout=args.deadline + 30)
    except (subprocess.TimeoutExpired, KeyboardInterrupt):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        killed = {"ok": False, "error": f"killed after {args.deadline + 30:.0f} s", "checks": []}
        _emit(killed, script.name)
        code = 1
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # anything of the namespace left behind
        shutil.rmtree(work, ignore_errors=True)
        for d in reversed(made):
            with contextlib.suppress(OSError):
                d.rmdir()
    return code


THIS = Script(NAME, __file__, _parser, run_check)


def main(argv: list[str] | None = None, script: Script | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if str(ROOT / "src") not in sys.path and (ROOT / "src" / "kubedevice").is_dir():
        sys.path.insert(0, str(ROOT / "src"))  # run from a checkout without installing
        os.environ["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH")) if p
        )
    inside = os.environ.get(INNER) == "1"
    raise SystemExit(inner(argv, script) if inside else outer(argv, script))


if __name__ == "__main__":
    main()

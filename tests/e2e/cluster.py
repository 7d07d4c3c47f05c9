"""A real Kubernetes control plane and one real kubelet, as child processes of the test session.

``Cluster.start(bin_dir, workdir)`` brings up etcd, kube-apiserver, kube-scheduler and
kube-controller-manager on free ports of 127.0.0.1, with their own PKI (openssl), static tokens
and kubeconfigs in ``workdir``; then ``kd-fakecri`` (a fake CRI runtime that records every
CreateContainer) and a kubelet for one Node, ``NODE``; ``add_node`` starts a kubelet for one
more (in a mount namespace of its own, see ``Kubelet.private_mounts``). Every process runs in its
own process group and writes ``workdir/logs/<name>.log``; ``Cluster.stop()`` stops exactly those
groups, unmounts what the kubelet mounted under ``workdir`` and leaves the device-plugin directory
clean.

Waits never sleep for a fixed time: HTTP readiness is polled against a deadline, API objects are
awaited with watches (``wait_for``).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import math
import os
import shutil
import signal
import socket
import ssl
import subprocess
import textwrap
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from kubedevice.ports import free_port

from .runtime import Containerd, pod_logs_tmpfs, private_dev, real_pause

NODE = "kd-node"
#: Nodes a test may add with ``Cluster.add_node`` (each has a token and a kubeconfig).
EXTRA_NODES = ("kd-node-2", "kd-node-3")
DEVICE_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
KUBELET_SOCK = DEVICE_PLUGIN_DIR / "kubelet.sock"
BINARIES = (
    "etcd",
    "kube-apiserver",
    "kube-scheduler",
    "kube-controller-manager",
    "kubelet",
    "kd-fakecri",
)
HOW_TO_GET = (
    "no Kubernetes binaries: set KUBEDEVICE_K8S_BIN to a directory with etcd, kube-apiserver, "
    "kube-scheduler, kube-controller-manager, kubelet (upstream v1.34+) and kd-fakecri, or put "
    "../shared/k8s beside the checkout (tests/e2e/README.md)"
)


class ClusterError(Exception):
    """A component did not start, or an awaited state was not reached in time."""


def find_binaries(repo_root: Path) -> Path | None:
    """``$KUBEDEVICE_K8S_BIN``, else what ``../shared/k8s/unpack.sh`` unpacks; else ``None``."""
    env = os.environ.get("KUBEDEVICE_K8S_BIN")
    if env:
        d = Path(env)
        return d if all((d / b).is_file() for b in BINARIES) else None
    unpack = repo_root.parent / "shared" / "k8s" / "unpack.sh"
    if not unpack.is_file():
        # a git worktree under .../wt/NAME: the shared dir is beside the main checkout's parent
        unpack = repo_root.parent.parent / "shared" / "k8s" / "unpack.sh"
    if not unpack.is_file():
        return None
    out = subprocess.run([str(unpack)], capture_output=True, text=True, check=False, timeout=300)
    if out.returncode != 0:
        raise ClusterError(f"{unpack} failed: {out.stderr.strip()}")
    d = Path(out.stdout.strip().splitlines()[-1])
    return d if all((d / b).is_file() for b in BINARIES) else None


def unix_socket_answers(path: Path) -> bool:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(1.0)
    try:
        s.connect(str(path))
    except OSError:
        return False
    finally:
        s.close()
    return True


def clean_device_plugin_dir() -> None:
    """Empty ``/var/lib/kubelet/device-plugins/`` (sockets, checkpoint); refuse a live kubelet's.

    Raises:
        ClusterError: another kubelet answers on its ``kubelet.sock``.
    """
    if KUBELET_SOCK.is_socket() and unix_socket_answers(KUBELET_SOCK):
        raise ClusterError(
            f"a kubelet is listening on {KUBELET_SOCK}: run the tier in a private mount namespace "
            "(see tests/e2e/README.md) or on a machine without a kubelet"
        )
    DEVICE_PLUGIN_DIR.mkdir(parents=True, exist_ok=True)
    for entry in DEVICE_PLUGIN_DIR.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


# ---------------------------------------------------------------------------------------------
# processes


@dataclass
class Process:
    """One child process in its own process group, logging to ``log``, in the directory ``cwd``.

    ``cwd`` is the process's own (created empty if missing), never the checkout: the kubelet,
    for one, removes what matches its containers' log paths relative to its working directory
    (kd-fakecri reports empty ones, so that is everything there).
    """

    name: str
    argv: list[str]
    log: Path
    cwd: Path
    env: dict[str, str] | None = None
    popen: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.cwd.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            out.write(f"==== start {' '.join(self.argv)}\n".encode())
            out.flush()
            # No preexec_fn: with one, Python forks (not vfork) and the pthread_atfork handlers
            # of a gRPC already used in this process (the fidelity test's emulator, inspect)
            # run in the child before exec; one restarted an event-engine poller there, and
            # the child hung before exec now and then. setpriv sets the death signal instead.
            self.popen = subprocess.Popen(
                [*_DIE_WITH_PARENT, *self.argv],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=self.env,
                cwd=self.cwd,
            )

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def check_alive(self) -> None:
        if not self.alive():
            code = self.popen.returncode if self.popen else None
            raise ClusterError(f"{self.name} exited (status {code}); log:\n{tail(self.log)}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> int | None:
        """Signal the process group (``sig``), wait, then SIGKILL it; return the exit status."""
        p = self.popen
        if p is None:
            return None
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, sig)
            try:
                p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=10)
        # whatever else the group still holds (children of the process)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        return p.returncode

    def kill(self) -> None:
        """SIGKILL, as a crash: sockets stay behind."""
        self.stop(signal.SIGKILL)


def _die_with_parent() -> list[str]:
    """The argv prefix that SIGKILLs the child when the test process dies (even by SIGKILL),
    so nothing leaks: util-linux ``setpriv --pdeathsig`` (it execs the command in place)."""
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "KILL", "--"] if setpriv else []


_DIE_WITH_PARENT = _die_with_parent()


def tail(path: Path, lines: int = 60) -> str:
    return tail_since(path, 0, lines) or "(empty)"


def tail_since(path: Path, offset: int, lines: int = 60) -> str:
    """The last ``lines`` lines of what ``path`` got after its first ``offset`` bytes."""
    try:
        with path.open("rb") as f:
            f.seek(offset)
            text = f.read().decode(errors="replace")
    except OSError as e:
        return f"({e})"
    return "\n".join(text.splitlines()[-lines:])


def own_dir(logs: Path, name: str) -> Path:
    """The working directory of component ``name``: ``cwd/<name>`` beside the ``logs`` dir."""
    return logs.parent / "cwd" / name


def _poll(what: str, check: Callable[[], bool], timeout: float, procs: Sequence[Process]) -> None:
    """Poll ``check`` (an HTTP readiness probe) until true; fail early if a process died."""
    deadline = time.monotonic() + timeout
    delay = 0.05
    while not check():
        for p in procs:
            p.check_alive()
        if time.monotonic() > deadline:
            raise ClusterError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(delay)
        delay = min(delay * 1.5, 0.5)


def _http_ok(url: str, ctx: ssl.SSLContext | None, token: str | None = None) -> bool:
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=2) as r:
            return bool(r.status == 200 and r.read().strip() == b"ok")
    except (OSError, urllib.error.URLError):
        return False


def etcd_args(data_dir: Path, client_port: int, peer_port: int) -> list[str]:
    """The flags of a one-member etcd for tests (no fsync) on 127.0.0.1."""
    client, peer = f"http://127.0.0.1:{client_port}", f"http://127.0.0.1:{peer_port}"
    return [
        "--name", "kd", "--data-dir", str(data_dir),
        "--listen-client-urls", client, "--advertise-client-urls", client,
        "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
        "--initial-cluster", f"kd={peer}", "--unsafe-no-fsync=true", "--log-level", "warn",
    ]  # fmt: skip


# ---------------------------------------------------------------------------------------------
# PKI


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_pki(pki: Path, users: dict[str, str]) -> dict[str, str]:
    """CA, serving and client certs, SA keys (ECDSA P-256) and one static token per user.

    ``users`` maps a user name to its groups (comma-separated, may be empty). Returns the tokens.
    """
    pki.mkdir(parents=True)
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    for ca in ("ca", "front-proxy-ca"):
        _openssl(
            "req", "-x509", *ec, "-keyout", f"{ca}.key", "-out", f"{ca}.crt", "-days", "30",
            "-subj", f"/CN=kd-e2e-{ca}", "-addext", "basicConstraints=critical,CA:TRUE",
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
    for name, ca, subj, ext in (
        ("apiserver", "ca", "/CN=kube-apiserver", "server.ext"),
        (
            "apiserver-kubelet-client",
            "ca",
            "/O=system:masters/CN=kube-apiserver-kubelet-client",
            "client.ext",
        ),
        ("front-proxy-client", "front-proxy-ca", "/CN=front-proxy-client", "client.ext"),
    ):
        _openssl(
            "req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subj, cwd=pki
        )
        _openssl(
            "x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
            "-CAcreateserial", "-out", f"{name}.crt", "-days", "30", "-extfile", ext, cwd=pki,
        )  # fmt: skip
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-out", "sa.key", cwd=pki)  # fmt: skip
    _openssl("pkey", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)
    tokens = {user: os.urandom(16).hex() for user in users}
    lines = []
    for user, groups in users.items():
        line = f"{tokens[user]},{user},uid-{user.replace(':', '-')}"
        lines.append(line + (f',"{groups}"' if groups else ""))
    (pki / "tokens.csv").write_text("\n".join(lines) + "\n")
    for f in pki.iterdir():
        f.chmod(0o600)
    return tokens


def write_kubeconfig(path: Path, server: str, ca: Path, user: str, token: str) -> Path:
    path.write_text(
        textwrap.dedent(f"""\
        apiVersion: v1
        kind: Config
        clusters:
        - name: e2e
          cluster: {{server: "{server}", certificate-authority: "{ca}"}}
        users:
        - name: "{user}"
          user: {{token: "{token}"}}
        contexts:
        - name: e2e
          context: {{cluster: e2e, user: "{user}"}}
        current-context: e2e
        """)
    )
    path.chmod(0o600)
    return path


# ---------------------------------------------------------------------------------------------
# the kubelet


@dataclass
class Kubelet:
    """kd-fakecri and the kubelet of Node ``NODE``; ``stop()``/``start()`` restart the kubelet."""

    bin_dir: Path
    root: Path
    logs: Path
    kubeconfig: Path
    ca: Path
    port: int = field(default_factory=free_port)
    healthz_port: int = field(default_factory=free_port)
    process: Process | None = None
    cri: Process | None = None
    #: KubeletConfiguration fields to set (top level, replacing the harness's), used from the
    #: next ``start()``: e.g. ``{"topologyManagerPolicy": "single-numa-node"}``
    extra_config: dict[str, Any] = field(default_factory=dict)
    #: when the current kubelet process was started (``time.time()``)
    started_at: float = 0.0
    #: the Node's name
    node: str = NODE
    #: run the kubelet in a mount namespace of its own with a tmpfs on the device-plugin
    #: directory (fixed at /var/lib/kubelet/device-plugins): a second kubelet of the machine
    #: then never touches the first one's device plugins, nor they it
    private_mounts: bool = False
    #: the real runtime (containerd) in place of kd-fakecri, when the cluster has one
    containerd: Containerd | None = None
    #: bind mounts (target -> source) of a mount namespace this node's kubelet and runtime
    #: share (``mount_ns``, made by ``start_runtime``): e.g. its own root and CDI dir at the
    #: first node's paths, so one DaemonSet's hostPaths lead to each node's own; empty: none
    binds: dict[Path, Path] = field(default_factory=dict)
    #: ``--node-ip`` (the Node's InternalIP, a hostNetwork pod's IP); None: the kubelet's pick
    node_ip: str | None = None
    #: the process holding the mount namespace of ``binds`` while the node is up
    ns_holder: Process | None = None

    @property
    def cri_socket(self) -> Path:
        return self.root / "cri.sock"

    @property
    def cri_endpoint(self) -> str:
        if self.containerd is not None:
            return self.containerd.endpoint
        return f"unix://{self.cri_socket}"

    def runtime_alive(self) -> bool:
        if self.containerd is not None:
            return self.containerd.alive()
        return self.cri is not None and self.cri.alive()

    @property
    def record(self) -> Path:
        """kd-fakecri's record: one JSON line per CreateContainer."""
        return self.root / "cri-record.jsonl"

    @property
    def pod_resources_socket(self) -> Path:
        return self.root / "pod-resources" / "kubelet.sock"

    @property
    def checkpoint(self) -> Path:
        return DEVICE_PLUGIN_DIR / "kubelet_internal_checkpoint"

    @property
    def kubelet_sock(self) -> Path:
        """The device manager's socket as this process sees it (through /proc for a kubelet
        in a mount namespace of its own)."""
        if not self.private_mounts or self.process is None:
            return KUBELET_SOCK
        return Path(f"/proc/{self.process.pid}/root") / KUBELET_SOCK.relative_to("/")

    @property
    def plugins_registry(self) -> Path:
        """Where DRA drivers (and other kubelet plugins) put their registration sockets."""
        return self.root / "plugins_registry"

    @property
    def plugins_dir(self) -> Path:
        """The kubelet's plugins directory (a DRA driver's own socket goes under it)."""
        return self.root / "plugins"

    def _enter(self) -> list[str]:
        """The argv prefix that runs a command in the node's mount namespace (of ``binds``)."""
        if self.ns_holder is None:
            return []
        return ["nsenter", f"--mount=/proc/{self.ns_holder.pid}/ns/mnt", "--"]

    def make_namespace(self) -> None:
        """The mount namespace of ``binds``, held by a process of its own (``ns_holder``): a
        slave of the test's, a tmpfs on the device-plugin dir, the binds, shared within."""
        if not self.binds or (self.ns_holder is not None and self.ns_holder.alive()):
            return
        for src in self.binds.values():
            src.mkdir(parents=True, exist_ok=True)
        ready = self.root.parent / f"ns-{self.node}.ready"
        ready.unlink(missing_ok=True)
        steps = [f"mount -t tmpfs tmpfs {DEVICE_PLUGIN_DIR}"]
        steps += [f"mount --bind {src} {dst}" for dst, src in self.binds.items()]
        steps += ["mount --make-rshared /", f"touch {ready}", "exec sleep infinity"]
        name = f"mountns-{self.node}"
        self.ns_holder = Process(
            name,
            ["unshare", "-m", "--propagation", "slave", "sh", "-c", " && ".join(steps)],
            self.logs / f"{name}.log",
            own_dir(self.logs, name),
        )
        self.ns_holder.start()
        _poll(f"the mount namespace of {self.node}", ready.exists, 30, [self.ns_holder])

    def drop_namespace(self) -> None:
        """Let the namespace go (once its processes have)."""
        if self.ns_holder is not None:
            self.ns_holder.stop()
            self.ns_holder = None

    def start_runtime(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        if self.containerd is not None:
            self.make_namespace()
            self.containerd.prefix = self._enter()
            self.containerd.up()
            return
        name = "kd-fakecri" if self.node == NODE else f"kd-fakecri-{self.node}"
        self.cri = Process(
            name,
            [str(self.bin_dir / "kd-fakecri"), "--endpoint", f"unix://{self.cri_socket}",
             "--record", str(self.record)],
            self.logs / f"{name}.log",
            own_dir(self.logs, name),
        )  # fmt: skip
        self.cri.start()
        _poll("kd-fakecri", self.cri_socket.is_socket, 30, [self.cri])

    def write_config(self) -> Path:
        config = self.root / "config.yaml"
        config.write_text(
            textwrap.dedent(f"""\
            apiVersion: kubelet.config.k8s.io/v1beta1
            kind: KubeletConfiguration
            address: 127.0.0.1
            port: {self.port}
            readOnlyPort: 0
            healthzBindAddress: 127.0.0.1
            healthzPort: {self.healthz_port}
            authentication:
              anonymous: {{enabled: true}}
              webhook: {{enabled: false}}
              x509: {{clientCAFile: "{self.ca}"}}
            authorization: {{mode: AlwaysAllow}}
            containerRuntimeEndpoint: {self.cri_endpoint}
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
            # device health and capacity reach the Node status at the next status update: keep
            # it short so the tier is fast
            nodeStatusUpdateFrequency: 1s
            nodeStatusReportFrequency: 1s
            # a DRA pod whose claim the kubelet could not read yet (the node authorizer had not
            # linked it) is retried at the next pod sync: 10 s here, not the default minute
            syncFrequency: 10s
            """)
        )
        if self.extra_config:
            merged = {**yaml.safe_load(config.read_text()), **self.extra_config}
            config.write_text(yaml.safe_dump(merged))
        return config

    def start(self) -> None:
        """Start the kubelet process (and the runtime if it is not running); returns once
        /healthz is ok."""
        if not self.runtime_alive():
            self.start_runtime()
        config = self.write_config()
        prefix: list[str] = self._enter()
        if self.private_mounts and not self.binds:
            mount = f'mount -t tmpfs tmpfs {DEVICE_PLUGIN_DIR} && exec "$@"'
            prefix = ["unshare", "-m", "--propagation", "private", "sh", "-c", mount, "kubelet"]
        name = "kubelet" if self.node == NODE else f"kubelet-{self.node}"
        # a bind of the root (to the first node's path) is the kubelet's --root-dir: the paths
        # it dials (a plugin's registration socket: 107 bytes at most) are those drivers see
        root = next((dst for dst, src in self.binds.items() if src == self.root), self.root)
        self.process = Process(
            name,
            [*prefix, str(self.bin_dir / "kubelet"), f"--kubeconfig={self.kubeconfig}",
             f"--config={config}", f"--hostname-override={self.node}", f"--root-dir={root}",
             f"--cert-dir={self.root / 'pki'}", "--v=2",
             *([f"--node-ip={self.node_ip}"] if self.node_ip else []),
             # the device manager's GetPreferredAllocation and Allocate calls are logged at 4
             "--vmodule=manager=4"],
            self.logs / f"{name}.log",
            own_dir(self.logs, name),
        )  # fmt: skip
        self.started_at = time.time()
        self.process.start()
        url = f"http://127.0.0.1:{self.healthz_port}/healthz"
        _poll("kubelet /healthz", lambda: _http_ok(url, None), 60, [self.process])
        # the previous kubelet's kubelet.sock stays until this one's device manager replaces
        # it: a plugin registering before then is refused (and waits out its backoff)
        _poll(
            "the new kubelet.sock to accept",
            lambda: unix_socket_answers(self.kubelet_sock),
            30,
            [self.process],
        )

    def stop(self) -> None:
        """Stop the kubelet process only (SIGTERM); kd-fakecri and its 'containers' keep running."""
        if self.process is not None:
            self.process.stop()

    def stop_runtime(self) -> None:
        """Stop the runtime: kd-fakecri, or containerd with every container, shim, mount and
        bridge it made."""
        if self.containerd is not None:
            self.containerd.down()
        if self.cri is not None:
            self.cri.stop()

    def stop_all(self) -> None:
        self.stop()
        self.stop_runtime()

    def log_since_start(self) -> str:
        """The current kubelet process's log (the file holds every start's)."""
        assert self.process is not None
        text = self.process.log.read_text(errors="replace")
        return text[text.rfind("==== start ") :]

    def wait_plugin_devices(self, resource: str, healthy: int, timeout: float = 30) -> None:
        """Wait until this kubelet process has ``healthy`` Healthy devices of ``resource`` from
        its plugin (its device manager's log line), whatever the Node status says yet.

        After a kubelet restart the Node status still shows the old kubelet's counts: this is
        what a test needs before it creates a pod the new kubelet must admit.
        """
        want = f'"Processed device updates for resource" resourceName="{resource}"'
        count = f"healthyCount={healthy}"

        def seen() -> bool:
            lines = self.log_since_start().splitlines()
            last = [ln for ln in lines if want in ln]
            return bool(last) and last[-1].rstrip().endswith(count)

        poll_until(f"the kubelet to have {healthy} Healthy {resource}", seen, timeout)

    def records(self) -> list[dict[str, Any]]:
        """Every CreateContainer the runtime got, oldest first (kd-fakecri's record)."""
        if self.containerd is not None:
            raise ClusterError(
                "no CreateContainer record on containerd (only kd-fakecri keeps one): read "
                "what the container saw instead (tests/e2e/real.py)"
            )
        if not self.record.exists():
            return []
        return [json.loads(line) for line in self.record.read_text().splitlines() if line.strip()]

    def created(self, namespace: str, pod: str, container: str) -> dict[str, Any]:
        """The last CreateContainer of ``namespace/pod``'s ``container`` (wait for Running)."""
        found = [
            r
            for r in self.records()
            if r.get("namespace") == namespace
            and r.get("pod") == pod
            and r.get("container") == container
        ]
        if not found:
            raise ClusterError(f"no CreateContainer recorded for {namespace}/{pod}/{container}")
        return found[-1]


def envs(record: dict[str, Any]) -> dict[str, str]:
    """A CreateContainer record's environment as a dict."""
    return {e["key"]: e["value"] for e in record.get("envs") or []}


# ---------------------------------------------------------------------------------------------
# the cluster


@dataclass
class Cluster:
    """The control plane, one kubelet, and an admin API client."""

    bin_dir: Path
    workdir: Path
    procs: dict[str, Process] = field(default_factory=dict)
    extra_logs: dict[str, Path] = field(default_factory=dict)
    tokens: dict[str, str] = field(default_factory=dict)
    api_port: int = 0
    kubelet: Kubelet | None = None
    api: client.ApiClient | None = None
    #: kubelets of more nodes (``add_node``), by Node name
    nodes: dict[str, Kubelet] = field(default_factory=dict)
    #: ``fakecri`` (kd-fakecri records what the kubelet asks) or ``containerd`` (real containers)
    runtime: str = "fakecri"
    #: the real runtime's scripts (``runtime/up.sh`` ...), for ``runtime="containerd"``
    runtime_dir: Path | None = None
    #: the controller-manager's ``--controllers`` (``*,-node-lifecycle-controller`` keeps
    #: Nodes without a kubelet from being tainted unreachable)
    kcm_controllers: str = "*"
    #: more flags for the scheduler (``--kube-api-qps=...``)
    scheduler_flags: tuple[str, ...] = ()
    #: more flags for the API server (``--audit-policy-file=...``)
    apiserver_flags: tuple[str, ...] = ()
    #: etcd's client port (its ``/metrics``)
    etcd_port: int = 0
    _pod_logs_mounted: bool = False

    @property
    def containerd(self) -> Containerd | None:
        return self.kubelet.containerd if self.kubelet is not None else None

    @property
    def cdi_dir(self) -> Path | None:
        """The CDI spec dir the runtime reads (containerd's); ``None`` on kd-fakecri."""
        return self.containerd.cdi_dir if self.containerd is not None else None

    # -- paths
    @property
    def pki(self) -> Path:
        return self.workdir / "pki"

    @property
    def logs(self) -> Path:
        return self.workdir / "logs"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.api_port}"

    @property
    def admin_kubeconfig(self) -> Path:
        return self.workdir / "admin.kubeconfig"

    @property
    def node_kubeconfig(self) -> Path:
        return self.workdir / "kubelet.kubeconfig"

    @property
    def other_node_kubeconfig(self) -> Path:
        """User ``system:node:other-node`` (group system:nodes): a node without a kubelet."""
        return self.workdir / "other-node.kubeconfig"

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    # -- life cycle
    @classmethod
    def start(
        cls,
        bin_dir: Path,
        workdir: Path,
        *,
        runtime: str = "fakecri",
        runtime_dir: Path | None = None,
    ) -> Cluster:
        c = cls(bin_dir, workdir, runtime=runtime, runtime_dir=runtime_dir)
        try:
            c._start_control_plane()
            c._start_kubelet()
        except BaseException:
            c.stop()
            raise
        return c

    @classmethod
    def control_plane(
        cls,
        bin_dir: Path,
        workdir: Path,
        *,
        kcm_controllers: str = "*",
        scheduler_flags: tuple[str, ...] = (),
        apiserver_flags: tuple[str, ...] = (),
    ) -> Cluster:
        """etcd, kube-apiserver, kube-scheduler and kube-controller-manager, no kubelet."""
        c = cls(
            bin_dir,
            workdir,
            kcm_controllers=kcm_controllers,
            scheduler_flags=scheduler_flags,
            apiserver_flags=apiserver_flags,
        )
        try:
            c._start_control_plane()
        except BaseException:
            c.stop()
            raise
        return c

    def _proc(self, name: str, *argv: str) -> Process:
        argv_ = [str(self.bin_dir / name), *argv]
        p = Process(name, argv_, self.logs / f"{name}.log", own_dir(self.logs, name))
        self.procs[name] = p
        p.start()
        return p

    def _start_control_plane(self) -> None:
        users = {
            "admin": "system:masters",
            "system:kube-scheduler": "",
            "system:kube-controller-manager": "",
            f"system:node:{NODE}": "system:nodes",
            # a node identity without a kubelet: for 403 tests (NodeRestriction)
            "system:node:other-node": "system:nodes",
            **{f"system:node:{n}": "system:nodes" for n in EXTRA_NODES},
        }
        self.tokens = make_pki(self.pki, users)
        ca = self.pki / "ca.crt"
        etcd_port, etcd_peer = free_port(), free_port()
        self.etcd_port = etcd_port
        self.api_port = free_port()
        sched_port, kcm_port = free_port(), free_port()
        kc = {
            name: write_kubeconfig(
                self.workdir / f"{name}.kubeconfig", self.server, ca, user, self.tokens[user]
            )
            for name, user in (
                ("admin", "admin"),
                ("scheduler", "system:kube-scheduler"),
                ("controller-manager", "system:kube-controller-manager"),
                ("kubelet", f"system:node:{NODE}"),
                ("other-node", "system:node:other-node"),
                *((f"kubelet-{n}", f"system:node:{n}") for n in EXTRA_NODES),
            )
        }
        etcd = self._proc("etcd", *etcd_args(self.workdir / "etcd", etcd_port, etcd_peer))

        def etcd_healthy() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{etcd_port}/health", timeout=2) as r:
                    return bool(json.loads(r.read()).get("health") == "true")
            except (OSError, ValueError):
                return False

        _poll("etcd /health", etcd_healthy, 60, [etcd])
        p = self.pki
        api = self._proc(
            "kube-apiserver",
            "--advertise-address=127.0.0.1", "--bind-address=127.0.0.1",
            f"--secure-port={self.api_port}", f"--etcd-servers=http://127.0.0.1:{etcd_port}",
            f"--tls-cert-file={p / 'apiserver.crt'}",
            f"--tls-private-key-file={p / 'apiserver.key'}",
            f"--client-ca-file={ca}", f"--token-auth-file={p / 'tokens.csv'}",
            f"--kubelet-client-certificate={p / 'apiserver-kubelet-client.crt'}",
            f"--kubelet-client-key={p / 'apiserver-kubelet-client.key'}",
            "--kubelet-preferred-address-types=InternalIP,Hostname",
            "--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={p / 'sa.pub'}",
            f"--service-account-signing-key-file={p / 'sa.key'}",
            "--service-cluster-ip-range=10.96.0.0/16", "--allow-privileged=true",
            f"--requestheader-client-ca-file={p / 'front-proxy-ca.crt'}",
            "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={p / 'front-proxy-client.crt'}",
            f"--proxy-client-key-file={p / 'front-proxy-client.key'}",
            "--endpoint-reconciler-type=none", "--profiling=false", "--v=1",
            *self.apiserver_flags,
        )  # fmt: skip
        ctx = ssl.create_default_context(cafile=str(ca))
        readyz = f"{self.server}/readyz"
        _poll(
            "kube-apiserver /readyz",
            lambda: _http_ok(readyz, ctx, self.tokens["admin"]),
            120,
            [etcd, api],
        )
        sched = self._proc(
            "kube-scheduler", f"--kubeconfig={kc['scheduler']}",
            f"--authentication-kubeconfig={kc['scheduler']}",
            f"--authorization-kubeconfig={kc['scheduler']}",
            "--bind-address=127.0.0.1", f"--secure-port={sched_port}", "--leader-elect=false",
            "--v=1", *self.scheduler_flags,
        )  # fmt: skip
        kcm = self._proc(
            "kube-controller-manager", f"--kubeconfig={kc['controller-manager']}",
            f"--authentication-kubeconfig={kc['controller-manager']}",
            f"--authorization-kubeconfig={kc['controller-manager']}",
            "--bind-address=127.0.0.1", f"--secure-port={kcm_port}", "--leader-elect=false",
            f"--controllers={self.kcm_controllers}", "--use-service-account-credentials=true",
            f"--service-account-private-key-file={p / 'sa.key'}", f"--root-ca-file={ca}",
            f"--cluster-signing-cert-file={ca}", f"--cluster-signing-key-file={p / 'ca.key'}",
            "--service-cluster-ip-range=10.96.0.0/16", "--allocate-node-cidrs=false", "--v=1",
        )  # fmt: skip
        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE
        for proc, port in ((sched, sched_port), (kcm, kcm_port)):
            url = f"https://127.0.0.1:{port}/healthz"
            _poll(f"{proc.name} /healthz", lambda url=url: _http_ok(url, insecure), 90, [proc])
        self.api = self.client_for(self.tokens["admin"])

    def client_for(self, token: str) -> client.ApiClient:
        """An API client for the user of ``token`` (see ``tokens``)."""
        conf = client.Configuration()
        conf.host = self.server
        conf.ssl_ca_cert = str(self.pki / "ca.crt")
        conf.api_key = {"authorization": token}
        conf.api_key_prefix = {"authorization": "Bearer"}
        return client.ApiClient(conf)

    def _start_kubelet(self) -> None:
        clean_device_plugin_dir()
        self.kubelet = Kubelet(
            self.bin_dir,
            self.workdir / "kubelet",
            self.logs,
            self.node_kubeconfig,
            self.pki / "ca.crt",
        )
        if self.runtime == "containerd":
            assert self.runtime_dir is not None
            # the runtime lstat()s each device node: tests make theirs in a /dev of their own
            private_dev(self.workdir)
            self._pod_logs_mounted = pod_logs_tmpfs()
            self.kubelet.containerd = Containerd(self.runtime_dir, self.workdir)
        self.kubelet.start_runtime()
        if self.kubelet.cri is not None:
            self.procs["kd-fakecri"] = self.kubelet.cri
        self.kubelet.start()
        self.wait_node_ready()

    def add_node(
        self,
        name: str = EXTRA_NODES[0],
        binds: dict[Path, Path] | None = None,
        node_ip: str | None = None,
    ) -> Kubelet:
        """Start a runtime (kd-fakecri, or a containerd of its own on a containerd cluster) and
        a kubelet for one more Node ``name`` (one of ``EXTRA_NODES``) and wait until it is
        Ready; ``remove_node`` stops them and deletes the Node.

        The kubelet runs in a mount namespace of its own (``Kubelet.private_mounts``): device
        plugins of the test process register with the first kubelet only; DRA drivers reach
        this one through its ``--root-dir`` (``kubelet.root``), which both namespaces see.
        With ``binds`` (containerd only), the kubelet and its containerd share one mount
        namespace with those bind mounts (``Kubelet.binds``); ``node_ip``: its ``--node-ip``.
        """
        if name not in EXTRA_NODES:
            raise ClusterError(f"no identity for Node {name}; add it to EXTRA_NODES")
        if name in self.nodes:
            raise ClusterError(f"Node {name} is running already")
        kubelet = Kubelet(
            self.bin_dir,
            self.workdir / f"kubelet-{name}",
            self.logs,
            self.workdir / f"kubelet-{name}.kubeconfig",
            self.pki / "ca.crt",
            node=name,
            private_mounts=True,
            binds=dict(binds or {}),
            node_ip=node_ip,
        )
        if self.runtime == "containerd":  # one runtime per node, with its own bridge and CDI dir
            assert self.runtime_dir is not None
            kubelet.containerd = Containerd(self.runtime_dir, self.workdir / f"runtime-{name}")
        self.nodes[name] = kubelet
        kubelet.start_runtime()
        kubelet.start()
        self.wait_node_ready(kubelet)
        return kubelet

    def remove_node(self, name: str) -> None:
        """Stop Node ``name``'s kubelet and runtime and delete the Node (its pods go with it)."""
        kubelet = self.nodes.pop(name, None)
        if kubelet is not None:
            kubelet.stop_all()
            kubelet.drop_namespace()
        with contextlib.suppress(ApiException):
            self.core.delete_node(name)

    def restart_kubelet(self) -> None:
        """Stop the kubelet process and start it again (the runtime and its containers stay)."""
        assert self.kubelet is not None
        self.kubelet.stop()
        self.kubelet.start()
        self.wait_node_ready()

    def stop(self) -> None:
        """Stop every process this cluster started, unmount under the workdir, clean up."""
        if self.api is not None:
            self.api.close()
        for kubelet in self.nodes.values():
            kubelet.stop_all()
        if self.kubelet is not None:
            self.kubelet.stop_all()
        for name in ("kube-controller-manager", "kube-scheduler", "kube-apiserver", "etcd"):
            if name in self.procs:
                self.procs[name].stop()
        unmount_under(self.workdir)
        if self._pod_logs_mounted:
            subprocess.run(["umount", "-l", "/var/log/pods"], capture_output=True, check=False)
        if self.kubelet is not None:
            with contextlib.suppress(ClusterError):
                clean_device_plugin_dir()

    # -- logs
    def log_files(self) -> dict[str, Path]:
        """Every component's log, and those of daemons registered with ``add_log``."""
        out = {name: p.log for name, p in self.procs.items()}
        if self.kubelet is not None and self.kubelet.process is not None:
            out["kubelet"] = self.kubelet.process.log
        for name, kubelet in self.nodes.items():
            if kubelet.process is not None:
                out[f"kubelet-{name}"] = kubelet.process.log
        if self.containerd is not None:
            out["containerd"] = self.containerd.log
        out.update(self.extra_logs)
        return out

    def add_log(self, name: str, path: Path) -> None:
        self.extra_logs[name] = path

    # -- API helpers
    def node(self) -> Any:
        return self.core.read_node(NODE)

    def wait_node_ready(self, kubelet: Kubelet | None = None, timeout: float = 60) -> Any:
        """Wait until the current process of ``kubelet`` (the first) has posted its Node Ready.

        A Ready heartbeat from before its start (the previous kubelet's, after a restart) does
        not count: heartbeats have whole seconds, so one at or after the first whole second
        after the start is the new kubelet's.
        """
        kubelet = kubelet or self.kubelet
        assert kubelet is not None
        since = datetime.datetime.fromtimestamp(math.ceil(kubelet.started_at), datetime.UTC)

        def ready(n: Any) -> bool:
            return any(
                c.type == "Ready" and c.status == "True" and c.last_heartbeat_time >= since
                for c in n.status.conditions or []
            )

        return self.wait_node(
            ready, timeout, f"Ready (a heartbeat since {since:%H:%M:%S})", node=kubelet.node
        )

    def wait_node(
        self,
        predicate: Callable[[Any], bool],
        timeout: float = 30,
        what: str = "",
        *,
        node: str = NODE,
    ) -> Any:
        """Watch Node ``node`` until ``predicate(node)``; return that node."""
        return wait_for(
            self.core.list_node,
            lambda n: n.metadata.name == node and predicate(n),
            timeout,
            f"Node {node} {what}".strip(),
            field_selector=f"metadata.name={node}",
        )

    def wait_resource(
        self,
        resource: str,
        *,
        capacity: int | None = None,
        allocatable: int | None = None,
        timeout: float = 30,
    ) -> Any:
        """Watch the Node until its capacity and/or allocatable of ``resource`` equal the counts.

        A count of 0 also matches a resource that is absent from the status.
        """

        def match(n: Any) -> bool:
            cap = int((n.status.capacity or {}).get(resource, "0"))
            alloc = int((n.status.allocatable or {}).get(resource, "0"))
            return (capacity is None or cap == capacity) and (
                allocatable is None or alloc == allocatable
            )

        want = ", ".join(
            f"{k}={v}"
            for k, v in (("capacity", capacity), ("allocatable", allocatable))
            if v is not None
        )
        return self.wait_node(match, timeout, f"{resource} {want}")

    def create_pod(self, namespace: str, manifest: dict[str, Any]) -> Any:
        if self.runtime == "containerd":
            manifest = real_pause(manifest)  # type: ignore[assignment]
        return self.core.create_namespaced_pod(namespace, manifest)

    def wait_pod(
        self,
        namespace: str,
        name: str,
        predicate: Callable[[Any], bool],
        timeout: float = 60,
        what: str = "",
    ) -> Any:
        return wait_for(
            self.core.list_namespaced_pod,
            lambda p: p.metadata.name == name and predicate(p),
            timeout,
            f"pod {namespace}/{name} {what}".strip(),
            namespace,
            field_selector=f"metadata.name={name}",
        )

    def wait_running(self, namespace: str, name: str, timeout: float = 60) -> Any:
        return self.wait_pod(
            namespace, name, lambda p: p.status.phase == "Running", timeout, "Running"
        )

    def wait_scheduled(self, namespace: str, name: str, timeout: float = 60) -> Any:
        return self.wait_pod(
            namespace, name, lambda p: bool(p.spec.node_name), timeout, "scheduled"
        )

    def run_pod(self, namespace: str, manifest: dict[str, Any], timeout: float = 60) -> Any:
        """Create the pod and wait until it is Running; return the Running pod."""
        self.create_pod(namespace, manifest)
        return self.wait_running(namespace, manifest["metadata"]["name"], timeout)

    def delete_pods(self, namespace: str, timeout: float = 60) -> None:
        """Delete every pod of ``namespace`` (and its DaemonSets, Deployments and ReplicaSets,
        which would make them again) and wait until the pods are gone.

        Graceful (not forced), so each is gone only once the kubelet has stopped it and
        released its devices: the next test's pods find them free.
        """
        # the controllers first: a DaemonSet or ReplicaSet left behind makes its pods again
        apps = client.AppsV1Api(self.api)
        for delete in (
            apps.delete_collection_namespaced_daemon_set,
            apps.delete_collection_namespaced_deployment,
            apps.delete_collection_namespaced_replica_set,
        ):
            delete(namespace, propagation_policy="Orphan")
        self.core.delete_collection_namespaced_pod(namespace)
        deadline = time.monotonic() + timeout
        while True:
            listing = self.core.list_namespaced_pod(namespace)
            left = {p.metadata.name for p in listing.items}
            if not left:
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ClusterError(f"pods of {namespace} not gone after {timeout:.0f} s: {left}")
            w = watch.Watch()
            try:
                for ev in w.stream(
                    self.core.list_namespaced_pod,
                    namespace,
                    resource_version=listing.metadata.resource_version,
                    timeout_seconds=max(1, int(remaining)),
                ):
                    if ev["type"] == "DELETED":
                        left.discard(ev["object"].metadata.name)
                        if not left:
                            return
            except ApiException as e:
                if e.status != 410:
                    raise
            finally:
                w.stop()

    def events(self, namespace: str, involved: str) -> list[Any]:
        items = self.core.list_namespaced_event(
            namespace, field_selector=f"involvedObject.name={involved}"
        ).items
        return list(items)


def watch_of(listing: Any) -> watch.Watch:
    """A watch that builds the objects of ``listing``'s kind. The client names a watched
    object's type after its list call's (``V1ResourceClaim`` from ``V1ResourceClaimList``),
    which is no model for resource.k8s.io/v1 claims (``ResourceV1ResourceClaim`` is): every
    event of a plain ``watch.Watch()`` on claims fails to deserialize."""
    items: str = type(listing).openapi_types["items"]  # "List[ResourceV1ResourceClaim]"
    return watch.Watch(return_type=items[items.index("[") + 1 : -1])


def wait_for(
    list_fn: Callable[..., Any],
    predicate: Callable[[Any], bool],
    timeout: float,
    what: str,
    *args: Any,
    **kwargs: Any,
) -> Any:
    """List with ``list_fn``, then watch from that list's resourceVersion until an object
    satisfies ``predicate``; return it. Re-lists when the watch expires (410 Gone).

    Raises:
        ClusterError: the deadline passed; the message shows the last object seen.
    """
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        listing = list_fn(*args, **kwargs)
        for item in listing.items:
            last = item
            if predicate(item):
                return item
        rv = listing.metadata.resource_version
        w = watch_of(listing)
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ClusterError(
                        f"timed out after {timeout:.0f} s waiting for {what}; "
                        f"last seen:\n{_brief(last)}"
                    )
                for ev in w.stream(
                    list_fn, *args, resource_version=rv, timeout_seconds=max(1, int(left)), **kwargs
                ):
                    obj = ev["object"]
                    if ev["type"] == "ERROR":
                        break
                    rv = obj.metadata.resource_version
                    if ev["type"] in ("ADDED", "MODIFIED"):
                        last = obj
                        if predicate(obj):
                            return obj
                else:
                    continue  # the server ended the watch: watch again from rv
                break  # an ERROR event (410 Gone): list again
        except ApiException as e:
            if e.status != 410:
                raise
        finally:
            w.stop()


def _brief(obj: Any) -> str:
    if obj is None:
        return "(nothing)"
    status = getattr(obj, "status", None)
    return f"{obj.metadata.name}: {status}"[:3000]


def unmount_under(root: Path) -> list[str]:
    """Unmount everything mounted at or below ``root``, deepest first; return what was unmounted."""
    prefix = str(root.resolve()).rstrip("/") + "/"
    mounts = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = line.split()[4].replace("\\040", " ")
            if (point + "/").startswith(prefix):
                mounts.append(point)
    done = []
    for point in sorted(set(mounts), key=len, reverse=True):
        # a mount may be stacked several times (the kubelet's root dir bind-mount)
        while subprocess.run(["umount", point], capture_output=True, check=False).returncode == 0:
            done.append(point)
    return done


@contextlib.contextmanager
def namespace(cluster: Cluster, name: str) -> Iterator[str]:
    """A fresh namespace, usable once its ``default`` ServiceAccount exists; deleted afterwards."""
    core = cluster.core
    core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    try:
        wait_for(
            core.list_namespaced_service_account,
            lambda sa: sa.metadata.name == "default",
            30,
            f"ServiceAccount {name}/default",
            name,
        )
        yield name
    finally:
        with contextlib.suppress(ApiException):
            core.delete_namespace(name, grace_period_seconds=0)


def pod_manifest(
    name: str,
    limits: dict[str, int] | None = None,
    *,
    containers: list[dict[str, Any]] | None = None,
    init_containers: list[dict[str, Any]] | None = None,
    node_name: str | None = None,
) -> dict[str, Any]:
    """A Pod whose one container ``main`` asks for ``limits`` (or the given containers).

    The service-account token is not mounted (nothing runs in the fake runtime to read it, and
    the pod starts without waiting for the projected volume).
    """
    if containers is None:
        containers = [container("main", limits or {})]
    spec: dict[str, Any] = {
        "containers": containers,
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": 0,
    }
    if init_containers:
        spec["initContainers"] = init_containers
    if node_name:
        spec["nodeName"] = node_name
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def container(name: str, limits: dict[str, int]) -> dict[str, Any]:
    """A container asking for ``limits`` (extended resources: requests default to limits)."""
    return {
        "name": name,
        "image": "registry.k8s.io/pause:3.10",
        "imagePullPolicy": "IfNotPresent",
        "resources": {"limits": {k: str(v) for k, v in limits.items()}},
    }


def poll_until(what: str, check: Callable[[], bool], timeout: float = 30) -> None:
    """Poll ``check`` (something with no watch: a plugin's metric, a file) until true.

    Raises:
        ClusterError: not true within ``timeout`` seconds.
    """
    _poll(what, check, timeout, [])

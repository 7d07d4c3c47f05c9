"""``--k8s-bin DIR``: the kit's own etcd and kube-apiserver, for a run with no cluster.

Both on free loopback ports, with a PKI made by ``openssl`` (a CA, the serving certificate,
the service-account key) and two static tokens in ``system:masters``: the kit's and the
driver's, so that the API server's audit log (``audit.log``, resource.k8s.io requests at
the Metadata level) tells the driver's requests apart. No scheduler, no controllers: the
kit writes allocations itself. Everything lives in one work directory; :meth:`stop` stops
both processes (SIGTERM, then SIGKILL) and nothing else.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from kubedevice.errors import ConfigError
from kubedevice.ports import free_port

__all__ = ["DRIVER_USER", "LocalApiServer"]

#: The user name the driver's token authenticates as (how the audit log names it).
DRIVER_USER = "kd-conformance-driver"
KIT_USER = "kd-conformance-kit"
_READY_S = 60.0

_AUDIT_POLICY = f"""\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
  users: ["{DRIVER_USER}"]
  resources: [{{group: resource.k8s.io}}]
- level: None
"""

_SERVER_EXT = """\
basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,DNS:localhost
"""


def _openssl(cwd: Path, *args: str) -> None:
    try:
        subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)
    except FileNotFoundError as exc:
        raise ConfigError("--k8s-bin needs the openssl command (for the API server's PKI)") from exc
    except subprocess.CalledProcessError as exc:
        raise ConfigError(f"openssl {args[0]} failed: {exc.stderr.decode()[:200]}") from exc


def _kubeconfig(path: Path, server: str, ca: Path, user: str, token: str) -> Path:
    path.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters:\n- name: kit\n  cluster: {{server: '{server}', "
        f"certificate-authority: '{ca}'}}\n"
        f"users:\n- name: {user}\n  user: {{token: '{token}'}}\n"
        f"contexts:\n- name: kit\n  context: {{cluster: kit, user: {user}}}\n"
        "current-context: kit\n"
    )
    path.chmod(0o600)
    return path


def _ready(request: urllib.request.Request, ctx: ssl.SSLContext) -> bool:
    try:
        with urllib.request.urlopen(request, context=ctx, timeout=2) as answer:
            return bool(answer.status == 200)
    except (OSError, urllib.error.URLError):
        return False


class LocalApiServer:
    """etcd and kube-apiserver from ``bin_dir``, working in ``work``."""

    def __init__(self, bin_dir: Path, work: Path) -> None:
        for name in ("etcd", "kube-apiserver"):
            if not (bin_dir / name).is_file():
                raise ConfigError(f"--k8s-bin {bin_dir}: no {name} there")
        self.bin_dir = bin_dir
        self.work = work
        self.audit_log = work / "audit.log"
        self.kit_kubeconfig = work / "kit.kubeconfig"
        self.driver_kubeconfig = work / "driver.kubeconfig"
        self._procs: list[subprocess.Popen[bytes]] = []

    def _pki(self) -> tuple[str, str]:
        pki = self.work / "pki"
        pki.mkdir(parents=True)
        ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
        _openssl(pki, "req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "7",
                 "-subj", "/CN=kd-conformance-ca")  # fmt: skip
        (pki / "server.ext").write_text(_SERVER_EXT)
        _openssl(pki, "req", *ec, "-keyout", "server.key", "-out", "server.csr",
                 "-subj", "/CN=kube-apiserver")  # fmt: skip
        _openssl(pki, "x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                 "-CAcreateserial", "-out", "server.crt", "-days", "7",
                 "-extfile", "server.ext")  # fmt: skip
        _openssl(pki, "ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", "sa.key")
        _openssl(pki, "ec", "-in", "sa.key", "-pubout", "-out", "sa.pub")
        kit, driver = secrets.token_hex(16), secrets.token_hex(16)
        (pki / "tokens.csv").write_text(
            f'{kit},{KIT_USER},1,"system:masters"\n{driver},{DRIVER_USER},2,"system:masters"\n'
        )
        return kit, driver

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        with (self.work / f"{name}.log").open("ab") as log:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True,
                                    cwd=self.work)  # fmt: skip
        self._procs.append(proc)
        return proc

    def start(self) -> None:
        """Start both and wait until the API server is ready (ConfigError when it is not)."""
        kit, driver = self._pki()
        pki = self.work / "pki"
        etcd_port, peer_port, api_port = free_port(), free_port(), free_port()
        client, peer = f"http://127.0.0.1:{etcd_port}", f"http://127.0.0.1:{peer_port}"
        self._spawn("etcd", [
            str(self.bin_dir / "etcd"), "--name", "kd", "--data-dir", str(self.work / "etcd"),
            "--listen-client-urls", client, "--advertise-client-urls", client,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"kd={peer}", "--unsafe-no-fsync=true", "--log-level", "warn",
        ])  # fmt: skip
        (self.work / "audit-policy.yaml").write_text(_AUDIT_POLICY)
        self._spawn("kube-apiserver", [
            str(self.bin_dir / "kube-apiserver"), "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1", f"--secure-port={api_port}",
            f"--etcd-servers={client}", f"--tls-cert-file={pki / 'server.crt'}",
            f"--tls-private-key-file={pki / 'server.key'}", f"--client-ca-file={pki / 'ca.crt'}",
            f"--token-auth-file={pki / 'tokens.csv'}", "--authorization-mode=RBAC",
            "--disable-admission-plugins=ServiceAccount",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            "--service-cluster-ip-range=10.96.0.0/16", "--endpoint-reconciler-type=none",
            f"--audit-policy-file={self.work / 'audit-policy.yaml'}",
            f"--audit-log-path={self.audit_log}", "--audit-log-mode=blocking",
            "--audit-log-format=json", "--profiling=false", "--v=0",
        ])  # fmt: skip
        server = f"https://127.0.0.1:{api_port}"
        ca = pki / "ca.crt"
        _kubeconfig(self.kit_kubeconfig, server, ca, KIT_USER, kit)
        _kubeconfig(self.driver_kubeconfig, server, ca, DRIVER_USER, driver)
        ctx = ssl.create_default_context(cafile=str(ca))
        request = urllib.request.Request(
            f"{server}/readyz", headers={"Authorization": f"Bearer {kit}"}
        )
        deadline = time.monotonic() + _READY_S
        while time.monotonic() < deadline:
            for proc in self._procs:
                if proc.poll() is not None:
                    raise ConfigError(
                        f"--k8s-bin: {Path(str(proc.args[0])).name} exited with "  # type: ignore[index]
                        f"{proc.returncode} (its log is in {self.work})"
                    )
            if _ready(request, ctx):
                return
            time.sleep(0.2)  # nothing to wait on: the API server tells readiness by HTTP only
        raise ConfigError(f"--k8s-bin: kube-apiserver not ready in {_READY_S:.0f} s")

    def stop(self) -> None:
        """SIGTERM both (the API server first), SIGKILL what is left after 10 s."""
        for proc in reversed(self._procs):
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self._procs.clear()

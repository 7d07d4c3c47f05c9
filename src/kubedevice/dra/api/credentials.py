"""The API server and credentials of a DRA driver, read without the ``kubernetes`` package.

The common cases are read here: the pod's service account (its token read again whenever the
kubelet rotates the file) and a kubeconfig whose user has a ``token``, a ``tokenFile``, a
client certificate and key (files or ``-data``) or ``username``/``password``, whose cluster
has a ``server``, a CA (file or ``-data``), ``tls-server-name`` or
``insecure-skip-tls-verify``. Relative paths are relative to the kubeconfig's directory, as
kubectl reads them. Every kubeconfig is first checked by kubectl's rules
(:mod:`kubedevice.kubeconfig_rules`): what kubectl refuses (a quoted
``insecure-skip-tls-verify``, insecure together with a CA...) is refused here too, in one
line, whichever client then reads it. Anything else (a credential plugin: ``exec``,
``auth-provider``; a ``proxy-url``) gives ``None``: the official client, imported only then,
handles it. The official client's import holds about 20 MB of memory for the life of the
process (its generated models), which a driver with these credentials does not pay.

Client certificate and key data are handed to TLS through anonymous memory files
(``memfd_create``), never written to disk.
"""

from __future__ import annotations

import base64
import binascii
import errno
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final
from urllib.parse import quote, urlencode

from kubedevice._regular_file import read_regular
from kubedevice.errors import ConfigError
from kubedevice.kubeconfig_rules import load_kubeconfig

__all__ = [
    "IN_CLUSTER_DIR",
    "ClientEndpoint",
    "Credentials",
    "Endpoint",
    "OwnEndpoint",
    "read_credentials",
]

#: A pod's service-account files (token, ca.crt).
IN_CLUSTER_DIR: Final = Path("/var/run/secrets/kubernetes.io/serviceaccount")


@dataclass
class Credentials:
    """Where the API server is and how to authenticate to it.

    Attributes:
        server: The API server's base URL (``https://host:port``, no trailing ``/``).
        ca_file: The CA bundle to verify the server with (``None``: the system's).
        cert_file: The client certificate (PEM), if any.
        key_file: The client key (PEM), if any.
        insecure: Do not verify the server's certificate.
        tls_server_name: The name to verify the server's certificate against.
        token: A bearer token.
        token_file: A file with the bearer token, read again when it changes.
        token_fallback: The token used while ``token_file`` cannot be read (a kubeconfig
            user with both ``token`` and ``tokenFile``, as client-go reads it).
        basic: ``(user, password)`` for basic authentication.
    """

    server: str
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    insecure: bool = False
    tls_server_name: str | None = None
    token: str | None = None
    token_file: Path | None = None
    token_fallback: str | None = None
    basic: tuple[str, str] | None = None
    _fds: list[int] = field(default_factory=list, repr=False)
    _token_seen: tuple[int, int] | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def authorization(self) -> str | None:
        """The ``Authorization`` header's value (a token file is read again when changed).

        Raises:
            OSError: The token file cannot be read.
        """
        if self.token_file is not None:
            try:
                st = os.stat(self.token_file)
                with self._lock:
                    if self._token_seen != (st.st_mtime_ns, st.st_size) or self.token is None:
                        self.token = _read_token(self.token_file)
                        self._token_seen = (st.st_mtime_ns, st.st_size)
            except OSError:
                if self.token_fallback is None:
                    raise
                self.token = self.token_fallback  # a token beside the file: client-go's way
        if self.token:
            return f"Bearer {self.token}"
        if self.basic is not None:
            raw = f"{self.basic[0]}:{self.basic[1]}".encode()
            return f"Basic {base64.b64encode(raw).decode()}"
        return None

    def pool_manager(self) -> Any:
        """A ``urllib3.PoolManager`` with this TLS configuration."""
        import urllib3

        kwargs: dict[str, Any] = {"maxsize": 8}
        if self.insecure:
            kwargs["cert_reqs"] = "CERT_NONE"
            urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
        else:
            kwargs["cert_reqs"] = "CERT_REQUIRED"
            if self.ca_file is not None:
                kwargs["ca_certs"] = self.ca_file
        if self.cert_file is not None:
            kwargs["cert_file"] = self.cert_file
            kwargs["key_file"] = self.key_file
        if self.tls_server_name:
            kwargs["server_hostname"] = self.tls_server_name
            kwargs["assert_hostname"] = self.tls_server_name
        return urllib3.PoolManager(**kwargs)

    def close(self) -> None:
        """Close the memory files that hold certificate or key data."""
        fds, self._fds = self._fds, []
        for fd in fds:
            os.close(fd)


def read_credentials(kubeconfig: Path | None) -> Credentials | None:
    """The credentials of ``kubeconfig`` (``None``: the pod's service account).

    Returns:
        ``None`` when they need the official client (a credential plugin, a proxy).

    Raises:
        ConfigError: The kubeconfig cannot be read, or does not say what it must.
    """
    if kubeconfig is None:
        return _in_cluster()
    doc = load_kubeconfig(kubeconfig)  # checked by kubectl's rules: types, TLS, files, methods
    context = _named(doc, "contexts", doc["current-context"]) or {}
    cluster = _named(doc, "clusters", context.get("cluster") or "") or {}
    user = _named(doc, "users", context.get("user") or "") or {}
    if set(user) - _USER_KEYS or set(cluster) - _CLUSTER_KEYS:
        return None  # exec, auth-provider, proxy-url, impersonation...: the official client
    server = cluster["server"]
    if not server.startswith(("https://", "http://")):
        return None
    base = kubeconfig.parent
    creds = Credentials(
        server=server.rstrip("/"),
        insecure=cluster.get("insecure-skip-tls-verify") is True,
        tls_server_name=cluster.get("tls-server-name") or None,
    )
    try:
        creds.ca_file = _file_or_data(creds, base, cluster, "certificate-authority")
        if user.get("client-certificate") or user.get("client-certificate-data"):
            creds.cert_file = _file_or_data(creds, base, user, "client-certificate")
            creds.key_file = _file_or_data(creds, base, user, "client-key")
        if user.get("tokenFile"):  # as client-go: the file, read again; the token if unreadable
            creds.token_file = base / user["tokenFile"]
            creds.token_fallback = user.get("token") or None
        elif user.get("token"):
            creds.token = user["token"]
        elif user.get("username") or user.get("password"):
            creds.basic = (user.get("username") or "", user.get("password") or "")
        creds.authorization()  # a token file that cannot be read (and no token) fails now
    except (OSError, ValueError, binascii.Error) as exc:
        creds.close()
        why = str(exc)
        if isinstance(exc, OSError) and exc.strerror:  # not "[Errno 22] ..."
            why = f"{exc.filename}: {exc.strerror}" if exc.filename else exc.strerror
        raise ConfigError(f"cannot load kubeconfig {kubeconfig}: {why}") from None
    return creds


_USER_KEYS: Final = frozenset(
    {
        "token",
        "tokenFile",
        "client-certificate",
        "client-certificate-data",
        "client-key",
        "client-key-data",
        "username",
        "password",
        "extensions",
    }
)
_CLUSTER_KEYS: Final = frozenset(
    {
        "server",
        "certificate-authority",
        "certificate-authority-data",
        "insecure-skip-tls-verify",
        "tls-server-name",
        "extensions",
    }
)


def _named(doc: dict[str, Any], key: str, name: str) -> dict[str, Any] | None:
    for entry in doc.get(key) or []:
        if isinstance(entry, dict) and entry.get("name") == name:
            inner = entry.get(key.rstrip("s"))
            return inner if isinstance(inner, dict) else {}
    return None


def _file_or_data(creds: Credentials, base: Path, section: dict[str, Any], key: str) -> str | None:
    """``section[key]`` (a path, relative to ``base``), or ``section[key-data]`` (base64 PEM)
    in an anonymous memory file; ``None`` if neither is set."""
    data = section.get(f"{key}-data")
    if data:
        fd = os.memfd_create(key, os.MFD_CLOEXEC)
        creds._fds.append(fd)
        os.write(fd, base64.b64decode(str(data).replace("\r", "").replace("\n", ""), validate=True))
        return f"/proc/self/fd/{fd}"
    path = section.get(key)
    if path:
        full = base / str(path)
        if not full.is_file():
            raise FileNotFoundError(f"{key} {full} does not exist")
        return str(full)
    return None


#: The longest token file read (a ServiceAccount token is about 1 KiB).
MAX_TOKEN_BYTES: Final = 64 << 10


def _read_token(path: Path) -> str:
    """The token in ``path`` (a symlink followed, as a projected volume's; a FIFO or a
    device never read).

    Raises:
        OSError: It cannot be read, is not a regular file, is not UTF-8 or is too long.
    """
    data = read_regular(path, MAX_TOKEN_BYTES, follow_symlinks=True)
    if len(data) > MAX_TOKEN_BYTES:
        raise OSError(errno.EFBIG, f"{path} is larger than {MAX_TOKEN_BYTES >> 10} KiB")
    try:
        return data.decode().strip()
    except UnicodeDecodeError:
        raise OSError(errno.EINVAL, f"{path} is not UTF-8 text") from None


def _in_cluster() -> Credentials:
    host = os.environ.get("KUBERNETES_SERVICE_HOST", "")
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "")
    if not host or not port:
        raise ConfigError(
            "not in a pod: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set"
        )
    if ":" in host:
        host = f"[{host}]"  # IPv6
    token = IN_CLUSTER_DIR / "token"
    ca = IN_CLUSTER_DIR / "ca.crt"
    if not ca.is_file():
        raise ConfigError(f"the service account's CA {ca} does not exist")
    creds = Credentials(server=f"https://{host}:{port}", ca_file=str(ca), token_file=token)
    try:
        creds.authorization()
    except OSError as exc:
        raise ConfigError(f"cannot read the service account token {token}: {exc}") from None
    return creds


class Endpoint:
    """The server's URL, the headers of a call (credentials included) and the pool."""

    pool_manager: Any

    def request(
        self, path: str, query: list[tuple[str, str]], content_type: str
    ) -> tuple[str, dict[str, str]]:
        """The URL and headers of one call."""
        raise NotImplementedError

    def close(self) -> None:
        """Close the connections."""
        if self.pool_manager is not None:
            self.pool_manager.clear()


class OwnEndpoint(Endpoint):
    """Credentials read by :mod:`kubedevice.dra.api.credentials`."""

    def __init__(self, credentials: Credentials) -> None:
        self.credentials = credentials
        # its calls go through kubedevice.dra.api.http (no urllib3 pool)
        self.pool_manager = None

    def request(
        self, path: str, query: list[tuple[str, str]], content_type: str
    ) -> tuple[str, dict[str, str]]:
        url = self.credentials.server + quote(path, safe="/:@!$&'()*+,;=-._~")
        if query:
            url += "?" + urlencode(query)
        headers = {
            "Accept": "application/json",
            "Content-Type": content_type,
            "User-Agent": "kubedevice-dra",
        }
        authorization = self.credentials.authorization()
        if authorization is not None:
            headers["Authorization"] = authorization
        return url, headers

    def close(self) -> None:
        super().close()
        self.credentials.close()


class ClientEndpoint(Endpoint):
    """The official client's ``ApiClient`` (credential plugins, proxies)."""

    def __init__(self, api_client: Any) -> None:
        self._api = api_client
        self.pool_manager = api_client.rest_client.pool_manager

    @classmethod
    def load(cls, path: Path | None) -> ClientEndpoint:
        """Raises: ConfigError: not installed, or the configuration cannot be loaded."""
        try:
            import kubernetes.client
            import kubernetes.config
        except ImportError:
            raise ConfigError(
                "this kubeconfig needs the Kubernetes client: pip install 'kubedevice[kube-client]'"
            ) from None
        configuration = kubernetes.client.Configuration()
        try:
            if path is not None:
                kubernetes.config.load_kube_config(  # type: ignore[no-untyped-call]
                    config_file=str(path), client_configuration=configuration
                )
            else:
                kubernetes.config.load_incluster_config(  # type: ignore[no-untyped-call]
                    client_configuration=configuration
                )
        except (kubernetes.config.ConfigException, OSError, ValueError, TypeError) as exc:
            where = f"kubeconfig {path}" if path else "in-cluster configuration"
            raise ConfigError(f"cannot load the {where}: {exc}") from None
        configuration.retries = False  # the tries are ours, inside the deadline
        return cls(kubernetes.client.ApiClient(configuration))

    def request(
        self, path: str, query: list[tuple[str, str]], content_type: str
    ) -> tuple[str, dict[str, str]]:
        _method, url, headers, _body, _post = self._api.param_serialize(
            "GET",
            path,
            query_params=query,
            header_params={"Accept": "application/json", "Content-Type": content_type},
            auth_settings=["BearerToken"],
        )
        return str(url), dict(headers)

    def close(self) -> None:
        self._api.close()

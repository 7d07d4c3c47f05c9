"""The kubeconfig is read by kubectl's rules (client-go's), row by row: what kubectl refuses
is one line naming the field; what it accepts is read as it reads it (no API server here)."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubedevice.dra.api.credentials import read_credentials
from kubedevice.errors import ConfigError
from kubedevice.kubeconfig_rules import INSECURE_WITH_CA

ROOT = Path(__file__).resolve().parents[1]
KUBEDEVICE = str(Path(sys.executable).parent / "kubedevice")
PEM = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
B64 = base64.b64encode(PEM).decode()
DROP = object()  # a key taken out of the base document


def _doc(cluster: dict[str, Any], user: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    base_cluster = {"server": "https://127.0.0.1:6443", "certificate-authority": "ca.crt"}
    base_user: dict[str, Any] = {"token": "static-token"}
    doc: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": _patched(base_cluster, cluster)}],
        "users": [{"name": "u", "user": _patched(base_user, user)}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    return _patched(doc, top)


def _patched(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in patch.items():
        if value is DROP:
            out.pop(key, None)
        else:
            out[key] = value
    return out


def _write(
    tmp_path: Path, cluster: dict[str, Any], user: dict[str, Any], top: dict[str, Any]
) -> Path:
    for name in ("ca.crt", "client.crt", "client.key"):
        (tmp_path / name).write_bytes(PEM)
    (tmp_path / "token").write_text("file-token\n")
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(_doc(cluster, user, top)))
    return path


CA = {"certificate-authority": DROP}  # no CA: the system's (insecure allowed then)
REFUSED = [
    # (id, cluster, user, top, the words of the one line)
    ("insecure-quoted-false", {**CA, "insecure-skip-tls-verify": "false"}, {}, {},
     "cluster \"c\": insecure-skip-tls-verify is the string 'false', not a boolean"),
    ("insecure-quoted-true", {**CA, "insecure-skip-tls-verify": "true"}, {}, {},
     "insecure-skip-tls-verify is the string 'true', not a boolean"),
    ("insecure-number", {**CA, "insecure-skip-tls-verify": 1}, {}, {},
     "insecure-skip-tls-verify is the number 1, not a boolean"),
    ("insecure-with-ca-file", {"insecure-skip-tls-verify": True}, {}, {},
     f"insecure-skip-tls-verify is true and certificate-authority is set: {INSECURE_WITH_CA}"),
    ("insecure-with-ca-data",
     {**CA, "insecure-skip-tls-verify": True, "certificate-authority-data": B64}, {}, {},
     f"certificate-authority-data is set: {INSECURE_WITH_CA}"),
    ("compression-quoted", {"disable-compression": "no"}, {}, {},
     "disable-compression is the string 'no', not a boolean"),
    ("ca-both-ways", {"certificate-authority-data": B64}, {}, {},
     "certificate-authority-data and certificate-authority are both set"),
    ("ca-file-missing", {"certificate-authority": "nope.crt"}, {}, {},
     "certificate-authority {tmp}/nope.crt cannot be read: No such file or directory"),
    ("ca-data-not-base64", {**CA, "certificate-authority-data": "not base64!"}, {}, {},
     "certificate-authority-data is not valid base64"),
    ("no-server", {"server": DROP}, {}, {}, 'cluster "c": no server'),
    ("server-number", {"server": 6443}, {}, {}, "server is the number 6443, not a string"),
    ("tls-server-name-list", {"tls-server-name": ["a"]}, {}, {}, "tls-server-name is a list"),
    ("token-number", {}, {"token": 123}, {}, 'user "u": token is the number 123, not a string'),
    ("token-file-bool", {}, {"tokenFile": True}, {}, "tokenFile is the boolean true"),
    ("token-and-password", {}, {"username": "a", "password": "b"}, {},
     "token and username/password are both set"),
    ("token-file-missing", {}, {"token": DROP, "tokenFile": "gone"}, {}, "gone"),
    ("cert-without-key", {}, {"token": DROP, "client-certificate": "client.crt"}, {},
     "client-certificate without client-key or client-key-data"),
    ("cert-both-ways", {},
     {"token": DROP, "client-certificate": "client.crt", "client-certificate-data": B64,
      "client-key": "client.key"}, {},
     "client-certificate-data and client-certificate are both set"),
    ("key-both-ways", {},
     {"token": DROP, "client-certificate": "client.crt", "client-key": "client.key",
      "client-key-data": B64}, {},
     "client-key-data and client-key are both set"),
    ("cert-file-missing", {}, {"token": DROP, "client-certificate": "no.crt",
                               "client-key": "client.key"}, {},
     "client-certificate {tmp}/no.crt cannot be read"),
    ("key-data-number", {}, {"client-key-data": 7}, {}, "client-key-data is the number 7"),
    ("exec-and-auth-provider", {},
     {"token": DROP, "exec": {"command": "x"}, "auth-provider": {"name": "y"}}, {},
     "exec and auth-provider are both set"),
    ("groups-without-as", {}, {"as-groups": ["g"]}, {}, "as-groups or as-user-extra without as"),
    ("groups-not-strings", {}, {"as": "a", "as-groups": [1]}, {}, "as-groups is a list"),
    ("no-current-context", {}, {}, {"current-context": DROP}, "no current-context"),
    ("current-context-number", {}, {}, {"current-context": 5}, "current-context is the number 5"),
    ("context-not-found", {}, {}, {"current-context": "y"}, 'context "y" was not found'),
    ("cluster-not-found", {}, {},
     {"contexts": [{"name": "x", "context": {"cluster": "d", "user": "u"}}]},
     'cluster "d" of context "x" was not found'),
    ("another-cluster-mistyped", {}, {},
     {"clusters": [
         {"name": "c", "cluster": {"server": "https://127.0.0.1:6443"}},
         {"name": "d", "cluster": {"server": "https://e", "insecure-skip-tls-verify": "yes"}},
     ]},
     "cluster \"d\": insecure-skip-tls-verify is the string 'yes'"),
    ("clusters-a-mapping", {}, {}, {"clusters": {"c": {}}}, "clusters is a mapping, not a list"),
    ("entry-a-string", {}, {}, {"users": ["u"]}, "users[0] is the string 'u', not a mapping"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("cluster", "user", "top", "words"),
    [row[1:] for row in REFUSED],
    ids=[row[0] for row in REFUSED],
)
def test_what_kubectl_refuses_is_one_line_naming_the_field(
    tmp_path: Path, cluster: dict[str, Any], user: dict[str, Any], top: dict[str, Any], words: str
) -> None:
    path = _write(tmp_path, cluster, user, top)
    with pytest.raises(ConfigError) as caught:
        read_credentials(path)
    line = str(caught.value)
    assert "\n" not in line
    assert str(path) in line
    assert words.format(tmp=tmp_path) in line


ACCEPTED = [
    # (id, cluster, user, insecure, Authorization header)
    ("insecure-true-no-ca", {**CA, "insecure-skip-tls-verify": True}, {}, True,
     "Bearer static-token"),
    ("insecure-false-with-ca", {"insecure-skip-tls-verify": False}, {}, False,
     "Bearer static-token"),
    ("insecure-null", {"insecure-skip-tls-verify": None}, {}, False, "Bearer static-token"),
    ("ca-data-folded", {**CA, "certificate-authority-data": B64[:20] + "\n" + B64[20:]}, {},
     False, "Bearer static-token"),
    # client-go: the token file wins (read again as it changes), the token while it cannot be read
    ("token-and-token-file", {}, {"tokenFile": "token"}, False, "Bearer file-token"),
    ("token-and-missing-token-file", {}, {"tokenFile": "gone"}, False, "Bearer static-token"),
    ("basic", {}, {"token": DROP, "username": "a", "password": "b"}, False,
     "Basic " + base64.b64encode(b"a:b").decode()),
    ("client-cert", {}, {"token": DROP, "client-certificate": "client.crt",
                         "client-key-data": B64}, False, None),
]  # fmt: skip


@pytest.mark.parametrize(
    ("cluster", "user", "insecure", "authorization"),
    [row[1:] for row in ACCEPTED],
    ids=[row[0] for row in ACCEPTED],
)
def test_what_kubectl_accepts_is_read_as_it_reads_it(
    tmp_path: Path,
    cluster: dict[str, Any],
    user: dict[str, Any],
    insecure: bool,
    authorization: str | None,
) -> None:
    credentials = read_credentials(_write(tmp_path, cluster, user, {}))
    assert credentials is not None
    try:
        assert credentials.insecure is insecure
        assert credentials.authorization() == authorization
    finally:
        credentials.close()


def test_a_yaml_boolean_is_a_boolean(tmp_path: Path) -> None:
    """Unquoted YAML booleans are booleans to both readers; quoted ones are strings."""
    path = _write(tmp_path, CA, {}, {})
    text = path.read_text().replace("server:", "insecure-skip-tls-verify: yes\n    server:")
    path.write_text(text)
    credentials = read_credentials(path)
    assert credentials is not None
    assert credentials.insecure is True
    credentials.close()
    path.write_text(text.replace(": yes", ": 'yes'"))
    with pytest.raises(ConfigError, match="the string 'yes', not a boolean"):
        read_credentials(path)


def test_the_official_clients_kubeconfigs_are_checked_too(tmp_path: Path) -> None:
    """A credential plugin goes to the official client, whose reader takes a quoted "false"
    as true as well: the rules refuse it before."""
    path = _write(
        tmp_path,
        {**CA, "insecure-skip-tls-verify": "false"},
        {"token": DROP, "exec": {"command": "x", "apiVersion": "v1"}},
        {},
    )
    with pytest.raises(ConfigError, match="insecure-skip-tls-verify is the string 'false'"):
        read_credentials(path)


def _bad_kubeconfig(tmp_path: Path) -> Path:
    return _write(tmp_path, {**CA, "insecure-skip-tls-verify": "false"}, {}, {})


@pytest.mark.parametrize("command", ["run --dra", "nvidia dra", "examples/dra_minimal.py"])
def test_a_bad_kubeconfig_is_one_line_and_exit_2(tmp_path: Path, command: str) -> None:
    kubeconfig = _bad_kubeconfig(tmp_path)
    kdir = tmp_path / "k"
    common = ["--node-name", "n", "--kubeconfig", str(kubeconfig), "--kubelet-dir", str(kdir),
              "--cdi-dir", str(tmp_path / "cdi")]  # fmt: skip
    config = tmp_path / "config.yaml"
    if command == "run --dra":
        from kubedevice.generic import FakeHost

        host = FakeHost(tmp_path / "host")
        host.add_char_device("/dev/e2e0")
        config.write_text(
            "version: v1\nresources:\n  - name: example.com/e2e\n    groups:\n"
            "      - name: e2e\n        paths:\n          - path: /dev/e2e*\n"
        )
        argv = [KUBEDEVICE, "run", "--dra", "--config", str(config), "--dev-root",
                str(host.dev_root), "--sys-root", str(host.sys_root), *common]  # fmt: skip
    elif command == "nvidia dra":
        config.write_text("version: v1\n")
        argv = [KUBEDEVICE, "nvidia", "dra", "--nvml", "fake:pcie-4gpu", "--config", str(config),
                *common]  # fmt: skip
    else:
        argv = [sys.executable, str(ROOT / command), *common]
    keep = {k: os.environ[k] for k in ("PYTHONPATH",) if k in os.environ}
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), **keep}
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env, check=False)
    output = (proc.stdout + proc.stderr).strip().splitlines()
    assert proc.returncode == 2, output
    assert len(output) == 1, output
    assert f"kubeconfig {kubeconfig}" in output[0]
    assert "insecure-skip-tls-verify is the string 'false', not a boolean" in output[0]

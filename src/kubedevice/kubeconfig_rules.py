"""A kubeconfig checked by kubectl's rules (client-go's) before any credential in it is used.

client-go decodes a kubeconfig into typed fields, so a value of the wrong type refuses the
whole file: ``insecure-skip-tls-verify: "false"`` (a string) is an error there, not "true"
as a loose reader's truth test makes it; ``token: 123`` (a number) is an error too, and so is
``certificate-authority-data`` that is not base64. Of the context in use it then refuses
what its validation refuses (``clientcmd/validation.go`` and the TLS transport): no server,
a CA given both as a file and as data, a file that cannot be read, a client certificate
without its key (or a certificate or key given both ways), a token together with a user
name or password, a credential plugin given both as ``exec`` and ``auth-provider``,
impersonation extras without ``as``, and ``insecure-skip-tls-verify: true`` together with
a CA ("specifying a root certificates file with the insecure flag is not allowed").

Every refusal is one :class:`~kubedevice.errors.ConfigError` line that names the file, the
entry and the field. Every reader of a kubeconfig checks it here first: the DRA kit's own
(:mod:`kubedevice.dra.api.credentials`), the official client's it hands a credential plugin
to, and ``advertise``'s.

A leaf module (the standard library, ``yamlfile``, ``_regular_file`` and ``errors`` only).
"""

from __future__ import annotations

import base64
import binascii
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from kubedevice._regular_file import open_regular
from kubedevice.errors import ConfigError
from kubedevice.yamlfile import HugeInt, read_yaml

__all__ = ["INSECURE_WITH_CA", "check_kubeconfig", "load_kubeconfig"]

#: client-go's words for a CA together with ``insecure-skip-tls-verify: true``.
INSECURE_WITH_CA: Final = (
    "specifying a root certificates file with the insecure flag is not allowed"
)

# the Go type of each field client-go decodes (k8s.io/client-go/tools/clientcmd/api/v1)
_STR, _BOOL, _BYTES, _STRS, _MAP, _LIST = "str", "bool", "bytes", "strs", "map", "list"
_CLUSTER: Final = {
    "server": _STR,
    "tls-server-name": _STR,
    "insecure-skip-tls-verify": _BOOL,
    "certificate-authority": _STR,
    "certificate-authority-data": _BYTES,
    "proxy-url": _STR,
    "disable-compression": _BOOL,
    "extensions": _LIST,
}
_USER: Final = {
    "client-certificate": _STR,
    "client-certificate-data": _BYTES,
    "client-key": _STR,
    "client-key-data": _BYTES,
    "token": _STR,
    "tokenFile": _STR,
    "as": _STR,
    "as-uid": _STR,
    "as-groups": _STRS,
    "as-user-extra": _MAP,
    "username": _STR,
    "password": _STR,
    "auth-provider": _MAP,
    "exec": _MAP,
    "extensions": _LIST,
}
_CONTEXT: Final = {"cluster": _STR, "user": _STR, "namespace": _STR, "extensions": _LIST}
_SECTIONS: Final = (
    ("clusters", "cluster", _CLUSTER),
    ("users", "user", _USER),
    ("contexts", "context", _CONTEXT),
)
_WANTED: Final = {
    _STR: "a string",
    _BOOL: "a boolean (true or false, unquoted)",
    _BYTES: "base64 data (a string)",
    _STRS: "a list of strings",
    _MAP: "a mapping",
    _LIST: "a list",
}


def load_kubeconfig(path: Path, context: str | None = None) -> dict[str, Any]:
    """The YAML of ``path``, checked by :func:`check_kubeconfig` (for ``context``, else its
    ``current-context``).

    Raises:
        ConfigError: It cannot be read or parsed, or kubectl would refuse it.
    """
    try:
        # bounded: a FIFO, a huge file, an alias bomb or deep nesting is one line, quickly
        doc = read_yaml(path)
    except ConfigError as exc:
        raise ConfigError(f"kubeconfig {' '.join(str(exc).split())}") from None
    check_kubeconfig(doc, path, context)
    assert isinstance(doc, dict)  # checked
    return doc


def check_kubeconfig(doc: Any, path: Path, context: str | None = None) -> None:
    """Refuse ``doc`` (the YAML of ``path``) where kubectl refuses it.

    Args:
        doc: The parsed YAML.
        path: The file, for the messages and its relative paths.
        context: The context in use (``None``: its ``current-context``).

    Raises:
        ConfigError: One line naming the file, the entry and the field.
    """

    def fail(message: str) -> ConfigError:
        return ConfigError(f"kubeconfig {path}: {message}")

    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise fail(f"is {_kind(doc)}, not a mapping")
    named: dict[str, dict[str, dict[str, Any]]] = {}
    for plural, singular, fields in _SECTIONS:
        named[singular] = _entries(doc.get(plural), plural, singular, fields, fail)
    current = doc.get("current-context")
    if current is not None and not isinstance(current, str):
        raise fail(f"current-context is {_kind(current)}, not a string")
    name = context or current or ""
    if not name:
        raise fail("no current-context: kubectl finds no configuration in it")
    chosen = named["context"].get(name)
    if chosen is None:
        raise fail(f'context "{name}" was not found (its contexts: {_names(named["context"])})')
    cluster_name = chosen.get("cluster") or ""
    cluster = named["cluster"].get(cluster_name)
    if cluster is None:
        raise fail(
            f'cluster "{cluster_name}" of context "{name}" was not found '
            f"(its clusters: {_names(named['cluster'])})"
        )
    _check_cluster(cluster_name, cluster, path.parent, fail)
    user_name = chosen.get("user") or ""
    _check_user(user_name, named["user"].get(user_name) or {}, path.parent, fail)


def _entries(
    value: Any, plural: str, singular: str, fields: Mapping[str, str], fail: Any
) -> dict[str, dict[str, Any]]:
    """The entries of ``clusters``, ``users`` or ``contexts`` by name, their types checked."""
    if value is None:
        return {}
    if not isinstance(value, list):
        raise fail(f"{plural} is {_kind(value)}, not a list")
    found: dict[str, dict[str, Any]] = {}
    for index, entry in enumerate(value):
        if entry is None:
            continue
        if not isinstance(entry, dict):
            raise fail(f"{plural}[{index}] is {_kind(entry)}, not a mapping")
        name = entry.get("name")
        if name is not None and not isinstance(name, str):
            raise fail(f"{plural}[{index}].name is {_kind(name)}, not a string")
        where = f'{singular} "{name}"' if name else f"{plural}[{index}]"
        inner = entry.get(singular)
        if inner is None:
            inner = {}
        if not isinstance(inner, dict):
            raise fail(f"{where}: {singular} is {_kind(inner)}, not a mapping")
        for key, want in fields.items():
            problem = _type_problem(inner.get(key), want)
            if problem is not None:
                raise fail(f"{where}: {key} is {problem}, not {_WANTED[want]}")
        found.setdefault(name or "", inner)  # client-go: the first of a name
    return found


def _type_problem(value: Any, want: str) -> str | None:
    """What is wrong with ``value`` as the Go type ``want`` (``None``: nothing)."""
    if value is None:
        return None
    if want == _BOOL:
        ok = isinstance(value, bool)
    elif want == _STR:
        ok = isinstance(value, str)
    elif want == _BYTES:
        if not isinstance(value, str):
            return _kind(value)
        try:
            base64.b64decode(value.replace("\r", "").replace("\n", ""), validate=True)
        except (binascii.Error, ValueError):
            return "not valid base64"
        return None
    elif want == _STRS:
        ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
    elif want == _MAP:
        ok = isinstance(value, dict)
    else:
        ok = isinstance(value, list)
    return None if ok else _kind(value)


def _check_cluster(name: str, cluster: dict[str, Any], base: Path, fail: Any) -> None:
    where = f'cluster "{name}"'
    if not cluster.get("server"):
        raise fail(f"{where}: no server")
    ca_file, ca_data = (
        cluster.get("certificate-authority"),
        cluster.get("certificate-authority-data"),
    )
    if ca_file and ca_data:
        raise fail(f"{where}: certificate-authority-data and certificate-authority are both set")
    if cluster.get("insecure-skip-tls-verify") is True and (ca_file or ca_data):
        which = "certificate-authority" if ca_file else "certificate-authority-data"
        raise fail(
            f"{where}: insecure-skip-tls-verify is true and {which} is set: {INSECURE_WITH_CA}"
        )
    if ca_file:
        _readable(base / ca_file, f"{where}: certificate-authority", fail)


def _check_user(name: str, user: dict[str, Any], base: Path, fail: Any) -> None:
    where = f'user "{name}"'
    if user.get("token") and (user.get("username") or user.get("password")):
        raise fail(
            f"{where}: token and username/password are both set: more than one "
            "authentication method, only one is allowed"
        )
    cert, cert_data = user.get("client-certificate"), user.get("client-certificate-data")
    key, key_data = user.get("client-key"), user.get("client-key-data")
    if cert or cert_data:
        if cert and cert_data:
            raise fail(f"{where}: client-certificate-data and client-certificate are both set")
        if key and key_data:
            raise fail(f"{where}: client-key-data and client-key are both set")
        if not key and not key_data:
            raise fail(f"{where}: client-certificate without client-key or client-key-data")
        if cert:
            _readable(base / cert, f"{where}: client-certificate", fail)
        if key:
            _readable(base / key, f"{where}: client-key", fail)
    if user.get("exec") is not None and user.get("auth-provider") is not None:
        raise fail(f"{where}: exec and auth-provider are both set; give one credential plugin")
    if (user.get("as-uid") or user.get("as-groups") or user.get("as-user-extra")) and not user.get(
        "as"
    ):
        raise fail(f"{where}: as-uid, as-groups or as-user-extra without as (the user to be)")


def _readable(path: Path, what: str, fail: Any) -> None:
    """Refuse ``path`` unless it opens as a regular file (a symlink to one is fine; a FIFO
    never blocks, a device is never read)."""
    try:
        os.close(open_regular(path, os.O_RDONLY, follow_symlinks=True))
    except OSError as exc:
        raise fail(f"{what} {path} cannot be read: {exc.strerror or exc}") from None


def _names(entries: Mapping[str, Any], most: int = 10) -> str:
    names = [f'"{n[:60]}"' for n, _ in zip(entries, range(most), strict=False)]
    more = len(entries) - len(names)
    return ", ".join(names) + (f" and {more:,} more" if more > 0 else "") or "none"


def _kind(value: Any) -> str:
    """``value``'s YAML kind, in words, with a short value where it helps."""
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, str):
        return f"the string {value[:40]!r}"
    if isinstance(value, int | float):
        text = str(value)
        return f"the number {text if len(text) <= 40 else text[:20] + '...'}"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, HugeInt):
        return repr(value)
    return f"a {type(value).__name__}"

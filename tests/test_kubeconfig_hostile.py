"""Hostile kubeconfigs: each is one line (a ConfigError naming the file), quickly, with the
memory bounded; never a traceback, a hang on a FIFO or a file read whole however large."""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from kubedevice.dra.api.credentials import read_credentials
from kubedevice.errors import ConfigError

pytestmark = pytest.mark.timeout(30)

BASE = """apiVersion: v1
kind: Config
current-context: c
contexts: [{{name: c, context: {{cluster: k, user: u}}}}]
clusters: [{{name: k, cluster: {{server: "https://127.0.0.1:6443"{cluster}}}}}]
users: [{{name: u, user: {user}}}]
"""


def _kubeconfig(cluster: str = "", user: str = "{token: abc}") -> str:
    return BASE.format(cluster=cluster, user=user)


def _laughs() -> str:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    return "\n".join(lines) + "\n"


def _users(count: int) -> str:
    users = "".join(f"- name: u{i}\n  user: {{token: t{i}}}\n" for i in range(count))
    return _kubeconfig().replace("users: [{name: u, user: {token: abc}}]\n", "users:\n" + users)


def _fifo(tmp_path: Path) -> Path:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    return fifo


CASES: dict[str, tuple[Callable[[Path], str | bytes], str]] = {
    "not UTF-8": (lambda _t: b"\xff\xfe\x80 kind: Config\n", "not UTF-8 text"),
    "billion laughs": (lambda _t: _laughs() + _kubeconfig(), "aliases expand it to more than"),
    "laughs in a field": (
        lambda _t: _laughs() + _kubeconfig(user="{token: abc, extensions: *a8}"),
        "aliases expand it to more than",
    ),
    "nested lists": (lambda _t: "x: " + "[" * 50_000 + "]" * 50_000 + "\n", "nest"),
    "nested mappings": (lambda _t: "x: " + "{a: " * 20_000 + "1" + "}" * 20_000, "nest"),
    "huge integer": (
        lambda _t: _kubeconfig(user="{token: " + "9" * 5000 + "}"),
        'user "u": token is an integer of 5000 digits, not a string',
    ),
    "bad date": (lambda _t: _kubeconfig(user="{token: 2001-13-45}"), "invalid YAML"),
    "duplicate key": (
        lambda _t: _kubeconfig(", insecure-skip-tls-verify: false, insecure-skip-tls-verify: true"),
        "duplicate key 'insecure-skip-tls-verify'",
    ),
    "100k users": (lambda _t: _users(100_000), "too large: more than 100,000 values"),
    "CA a FIFO": (
        lambda t: _kubeconfig(f", certificate-authority: {_fifo(t)}"),
        "certificate-authority {tmp}/fifo cannot be read: is a FIFO, not a regular file",
    ),
    "CA /dev/zero": (
        lambda _t: _kubeconfig(", certificate-authority: /dev/zero"),
        "/dev/zero cannot be read: is a character device, not a regular file",
    ),
    "client key a FIFO": (
        lambda t: _kubeconfig(user=f"{{client-certificate-data: YQ==, client-key: {_fifo(t)}}}"),
        "client-key {tmp}/fifo cannot be read: is a FIFO",
    ),
    "tokenFile a FIFO": (
        lambda t: _kubeconfig(user=f"{{tokenFile: {_fifo(t)}}}"),
        "{tmp}/fifo: is a FIFO, not a regular file",
    ),
    "tokenFile /dev/zero": (
        lambda _t: _kubeconfig(user="{tokenFile: /dev/zero}"),
        "/dev/zero: is a character device, not a regular file",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_hostile_kubeconfig_is_one_line_quickly(tmp_path: Path, case: str) -> None:
    make, wanted = CASES[case]
    content = make(tmp_path)
    path = tmp_path / "kubeconfig"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    started = time.monotonic()
    with pytest.raises(ConfigError) as caught:
        read_credentials(path)
    took = time.monotonic() - started
    message = str(caught.value)
    assert "\n" not in message, message
    assert len(message) < 300, message
    assert wanted.format(tmp=tmp_path) in message
    assert str(path) in message
    assert took < 3, f"{case}: {took:.2f} s"


def test_a_huge_kubeconfig_is_refused_before_it_is_read_whole(tmp_path: Path) -> None:
    path = tmp_path / "kubeconfig"
    with path.open("w") as f:  # a valid kubeconfig and 64 MiB of comment
        f.write(_kubeconfig())
        f.truncate(64 << 20)  # sparse: NUL bytes, which YAML refuses anyway
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(ConfigError, match=r"larger than 16 MiB; refused"):
        read_credentials(path)
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mib < 40, f"peak RSS grew {grown_mib:.0f} MiB"


def test_a_symlinked_certificate_file_is_followed(tmp_path: Path) -> None:
    """A Secret volume's files are symlinks (..data/ca.crt): followed, as kubectl does."""
    (tmp_path / "real.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    (tmp_path / "ca.crt").symlink_to(tmp_path / "real.crt")
    path = tmp_path / "kubeconfig"
    path.write_text(_kubeconfig(f", certificate-authority: {tmp_path / 'ca.crt'}"))
    creds = read_credentials(path)
    assert creds is not None
    assert creds.ca_file == str(tmp_path / "ca.crt")
    creds.close()

"""`kubedevice pod apply` on hostile files: one-line errors, exit 2, nothing sent."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from kubelet_helpers import pod_manifest

KUBEDEVICE = str(Path(sys.executable).parent / "kubedevice")
R = "example.com/foo"


def _apply(dp_dir: Path, path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DP_DEVICE_PLUGIN_DIR": str(dp_dir)}
    return subprocess.run(
        [KUBEDEVICE, "pod", "apply", "-f", str(path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _one_line_error(r: subprocess.CompletedProcess[str]) -> str:
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr[-2000:]
    assert lines[0].startswith("error: ")
    assert len(lines[0]) < 600
    return lines[0]


ALIAS_BOMB = """\
a: &a ["x","x","x","x","x","x","x","x","x","x"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g,*g]
i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h,*h]
kind: Pod
metadata: {name: bomb, annotations: {x: *i}}
"""


def test_alias_bomb_refused(dp_dir: Path, sock_dir: Path) -> None:
    f = sock_dir / "bomb.yaml"
    f.write_text(ALIAS_BOMB)
    line = _one_line_error(_apply(dp_dir, f))
    assert "aliasing" in line


def test_recursive_alias_refused(dp_dir: Path, sock_dir: Path) -> None:
    f = sock_dir / "loop.yaml"
    f.write_text("kind: Pod\nmetadata: &m {name: x, labels: *m}\n")
    assert "aliasing" in _one_line_error(_apply(dp_dir, f))


@pytest.mark.parametrize("digits", ["1" * 5000, "0." + "0" * 5000 + "1", "1" * 5000 + "m"])
def test_quantity_with_thousands_of_digits(dp_dir: Path, sock_dir: Path, digits: str) -> None:
    f = sock_dir / "q.yaml"
    f.write_text(yaml.safe_dump(pod_manifest("q", {R: digits})))
    line = _one_line_error(_apply(dp_dir, f))
    assert "spec.containers[0].resources.limits[example.com/foo]" in line


def test_unquoted_integer_with_thousands_of_digits(dp_dir: Path, sock_dir: Path) -> None:
    f = sock_dir / "q.yaml"
    text = yaml.safe_dump(pod_manifest("q", {R: 1})).replace(f"{R}: 1", f"{R}: {'7' * 5000}")
    f.write_text(text)
    _one_line_error(_apply(dp_dir, f))


def test_non_utf8_manifest(dp_dir: Path, sock_dir: Path) -> None:
    f = sock_dir / "latin1.yaml"
    f.write_bytes(yaml.safe_dump(pod_manifest("q", {})).encode() + b"# caf\xe9\n")
    assert "UTF-8" in _one_line_error(_apply(dp_dir, f))


def test_manifest_over_the_request_limit(dp_dir: Path, sock_dir: Path) -> None:
    m = pod_manifest("big", {})
    m["metadata"]["annotations"] = {"x": "y" * (17 * 1024 * 1024)}
    f = sock_dir / "big.yaml"
    f.write_text(yaml.safe_dump(m, width=1 << 30))
    line = _one_line_error(_apply(dp_dir, f))
    assert line == "error: manifest too large (limit 16 MiB)"


def test_same_pod_twice_in_one_file(dp_dir: Path, sock_dir: Path) -> None:
    f = sock_dir / "twice.yaml"
    f.write_text(yaml.safe_dump_all([pod_manifest("a", {}), pod_manifest("a", {})]))
    line = _one_line_error(_apply(dp_dir, f))
    assert 'pod "default/a" appears twice' in line

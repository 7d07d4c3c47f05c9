"""Files someone planted where the generic plugin reads: a FIFO, a socket, a huge NUMA node.

Opening a FIFO for reading blocks until a writer comes; the plugin used to hang there at
start-up, past SIGTERM. Each case is one line and a clean exit, or a warning and a default.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubedevice._regular_file import read_regular
from kubedevice.generic import FakeHost, parse_config
from kubedevice.generic.discovery import Scanner

KUBEDEVICE = str(Path(sys.executable).parent / "kubedevice")


@pytest.fixture
def planted(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[Path, str]]:
    path = tmp_path / "config.yaml"
    kind = request.param
    if kind == "FIFO":
        os.mkfifo(path)
        yield path, "is a FIFO, not a regular file"
    else:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.bind(str(path))
            sock.listen()
            yield path, "is a socket, not a regular file"


@pytest.mark.parametrize("planted", ["FIFO", "socket"], indirect=True)
@pytest.mark.parametrize("command", ["run", "validate"])
def test_a_config_path_that_is_not_a_file_is_one_line(
    planted: tuple[Path, str], command: str, tmp_path: Path
) -> None:
    path, why = planted
    args = ["run", "-c", str(path), "--device-plugin-dir", str(tmp_path)]
    if command == "validate":
        args = ["validate", str(path)]
    # The bound is only for the old behaviour (blocked in open() forever, deaf to SIGTERM).
    proc = subprocess.run(
        [KUBEDEVICE, *args], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines == [f"error: {path}: cannot read: {why}"]


def test_read_regular_refuses_what_is_not_a_regular_file(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(OSError, match="is a FIFO, not a regular file"):
        read_regular(fifo)
    with pytest.raises(OSError, match="is a character device, not a regular file"):
        read_regular("/dev/null")
    with pytest.raises(OSError, match="is a directory, not a regular file"):
        read_regular(tmp_path)
    (tmp_path / "f").write_bytes(b"ok\n")
    os.symlink(tmp_path / "f", tmp_path / "link")  # a ConfigMap's symlinks still work
    assert read_regular(tmp_path / "link", follow_symlinks=True) == b"ok\n"
    with pytest.raises(OSError, match="is a symbolic link, not a regular file"):
        read_regular(tmp_path / "link")  # the kubelet side's checkpoints: never followed


@pytest.mark.parametrize("value", ["100000000000000000000", "9" * 5000, "0x1", "1024"])
def test_a_numa_node_out_of_range_is_a_warning_and_no_node(
    host: FakeHost, value: str, caplog: pytest.LogCaptureFixture
) -> None:
    host.add_char_device("/dev/dri/renderD128", numa_node=0, subsystem="drm")
    host.set_attr("/sys/class/drm/renderD128/device/numa_node", value)
    host.add_char_device("/dev/dri/renderD129", numa_node=1023, subsystem="drm")
    config = parse_config(
        {
            "version": "v1",
            "devRoot": str(host.dev_root),
            "sysRoot": str(host.sys_root),
            "resources": [
                {"name": "a.com/r", "groups": [{"paths": [{"path": "/dev/dri/renderD*"}]}]}
            ],
        }
    )
    scanner = Scanner(config)
    with caplog.at_level(logging.WARNING, logger="kubedevice.generic.discovery"):
        for _ in range(2):
            found = scanner.scan()
            assert [(d.id, d.numa_node) for d in found["a.com/r"]] == [
                ("dri-renderD128", None),
                ("dri-renderD129", 1023),
            ]
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1, warnings  # once per file and value, not once per scan
    assert "is not a NUMA node (0 to 1023); the device gets no NUMA node" in warnings[0]
    assert "set_int_max_str_digits" not in warnings[0]
    assert len(warnings[0]) < 400


def test_a_fifo_as_a_health_attribute_is_an_error_not_a_wait(host: FakeHost) -> None:
    from kubedevice.generic.health import _read_attribute

    fifo = host.sys("/sys/class/drm/renderD128/device/enable")
    fifo.parent.mkdir(parents=True)
    os.mkfifo(fifo)
    # Read in a worker thread by the health loop: a wait there never ends (and holds up
    # the daemon's exit, which joins those threads).
    with pytest.raises(OSError, match="is a FIFO, not a regular file"):
        _read_attribute(str(fifo), str(host.sys_root))

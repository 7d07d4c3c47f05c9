"""replace_if_changed: atomic, 0644, no-op when current, a symlink at the target never followed."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from kubedevice._regular_file import NotRegularFileError, read_regular
from kubedevice.plugin.files import replace_if_changed


def test_writes_once_then_leaves_a_current_file_alone(tmp_path: Path) -> None:
    d = tmp_path / "new" / "dir"
    old = os.umask(0o077)
    try:
        assert replace_if_changed(d, "spec.json", "one\n") is True
    finally:
        os.umask(old)
    target = d / "spec.json"
    assert target.read_text() == "one\n"
    assert target.stat().st_mode & 0o777 == 0o644  # readable by runtimes whatever the umask
    inode = target.stat().st_ino
    assert replace_if_changed(d, "spec.json", "one\n") is False
    assert target.stat().st_ino == inode  # not rewritten
    assert replace_if_changed(d, "spec.json", "one\ntwo\n") is True
    assert target.read_text() == "one\ntwo\n"
    assert sorted(p.name for p in d.iterdir()) == ["spec.json"]  # no temporary file left


def test_symlink_at_the_target_is_replaced_not_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.write_text("same\n")
    d = tmp_path / "d"
    d.mkdir()
    (d / "f").symlink_to(outside)
    assert replace_if_changed(d, "f", "same\n") is True  # a symlink is never "current"
    assert not (d / "f").is_symlink()
    assert (d / "f").read_text() == "same\n"
    assert outside.read_text() == "same\n"


def test_unwritable_directory_raises_oserror(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(OSError):
        replace_if_changed(blocker / "sub", "f", "x")


def test_a_fifo_socket_or_directory_at_the_target_never_blocks(tmp_path: Path) -> None:
    fifo = tmp_path / "spec.json"
    os.mkfifo(fifo)
    with pytest.raises(NotRegularFileError, match="a FIFO"):
        read_regular(fifo, 10)
    assert replace_if_changed(tmp_path, "spec.json", "one\n") is True  # replaced, not opened
    assert fifo.read_text() == "one\n"
    sock_dir = tmp_path / "s"
    sock_dir.mkdir()
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(sock_dir / "spec.json"))
        assert replace_if_changed(sock_dir, "spec.json", "two\n") is True
    assert (sock_dir / "spec.json").read_text() == "two\n"
    (tmp_path / "d" / "spec.json").mkdir(parents=True)
    with pytest.raises(IsADirectoryError, match="a directory is in the way"):
        replace_if_changed(tmp_path / "d", "spec.json", "three\n")

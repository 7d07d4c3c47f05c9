"""The inotify directory watcher and the fake host builder."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from kubedevice.generic import FakeHost
from kubedevice.plugin.filewatch import DirWatcher, FileChanges, file_digest


async def test_watcher_reports_and_follows_directories(host: FakeHost) -> None:
    watcher = DirWatcher()
    try:
        a = host.dev_root / "a"
        a.mkdir()
        watcher.watch_exactly({str(host.dev_root), str(a), str(host.root / "missing")})
        assert watcher.dirs == {str(host.dev_root), str(a)}  # missing ones are skipped
        async with asyncio.timeout(5):
            (a / "x").touch()
            (a / "y").touch()
            batch = await watcher.changed()
            names = {str(e.name) for e in batch}
            if "y" not in names:  # the two creates may arrive in two reads
                names |= {str(e.name) for e in await watcher.changed()}
            assert names == {"x", "y"}
            os.rename(a, host.dev_root / "b")
            names = {str(e.name) for e in await watcher.changed()}
            assert "a" in names or "b" in names
        watcher.watch_exactly({str(host.dev_root)})
        assert watcher.dirs == {str(host.dev_root)}
    finally:
        watcher.close()


def test_fake_host_layout(host: FakeHost) -> None:
    node = host.add_char_device("/dev/dri/renderD128", numa_node=1, subsystem="drm")
    assert node == host.dev_root / "dri" / "renderD128"
    assert node.is_file()
    assert (host.sys_root / "class/drm/renderD128/device/numa_node").read_text() == "1\n"
    name = host.add_usb("0403", "6001", "S1", busnum=2, devnum=7)
    assert name == "2-7"
    link = host.sys_root / "bus/usb/devices/2-7"
    assert link.is_symlink()
    assert not os.readlink(link).startswith("/")  # relative: stays inside sysRoot
    assert (link / "idVendor").read_text() == "0403\n"
    assert (link / "serial").read_text() == "S1\n"
    assert (host.dev_root / "bus/usb/002/007").is_file()
    host.remove_usb(name)
    assert not link.exists()
    assert not (host.dev_root / "bus/usb/002/007").exists()
    host.set_attr("/sys/class/drm/renderD128/device/enable", "1")
    host.remove_attr("/sys/class/drm/renderD128/device/enable")
    host.remove("/dev/dri")
    assert not (host.dev_root / "dri").exists()


@pytest.mark.parametrize("bad", ["/etc/passwd", "/dev", "/dev/../etc/x", "dev/x"])
def test_fake_host_refuses_paths_outside(host: FakeHost, bad: str) -> None:
    with pytest.raises(ValueError, match=r"must not contain|is not under"):
        host.add_char_device(bad)


async def test_file_changes_reports_an_edit_made_before_its_watch(tmp_path: Path) -> None:
    """The digest is taken before the config is loaded; an edit made between that and the
    watch being set up raises no inotify event, and must still be reported."""
    config = tmp_path / "config.yaml"
    config.write_text("version: v1\n")
    before = file_digest(config)
    config.write_text("version: v1\nresources: []\n")  # edited while the daemon starts
    changes = FileChanges(config, before)
    try:
        async with asyncio.timeout(5):
            await changes.changed()
        assert changes.digest == file_digest(config)
        # and nothing more until the next real edit
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.2):
                await changes.changed()
        config.write_text("version: v1\nresources: [] # again\n")
        async with asyncio.timeout(5):
            await changes.changed()
    finally:
        changes.close()


async def test_file_changes_without_an_edit_waits(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("version: v1\n")
    changes = FileChanges(config, file_digest(config))
    try:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.2):
                await changes.changed()
    finally:
        changes.close()

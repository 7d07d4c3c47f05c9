"""Fake ``/dev`` and ``/sys`` trees for tests, benchmarks and ``kubedevice demo``.

Root-less: a "device node" is an empty regular file (no ``mknod`` needed); the generic
plugin only checks that a node exists and is not a directory. USB devices get the sysfs
attributes discovery reads (``idVendor``, ``idProduct``, ``serial``, ``busnum``, ``devnum``)
under ``sys/devices/...``, a relative symlink in ``sys/bus/usb/devices``, and their
``dev/bus/usb/BBB/DDD`` node. Writes are ordered so a watcher never sees a half-made device.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

__all__ = ["FakeHost"]


class FakeHost:
    """A fake host under ``root``: ``root/dev`` is the devRoot and ``root/sys`` the sysRoot."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).absolute()
        self.dev_root.mkdir(parents=True, exist_ok=True)
        self.sys_root.mkdir(parents=True, exist_ok=True)
        self._usb: dict[str, tuple[Path, str]] = {}

    @property
    def dev_root(self) -> Path:
        """The fake ``/dev``."""
        return self.root / "dev"

    @property
    def sys_root(self) -> Path:
        """The fake ``/sys``."""
        return self.root / "sys"

    def dev(self, path: str) -> Path:
        """Where ``/dev/...`` lives in the fake tree."""
        return self.dev_root / _strip(path, "/dev")

    def sys(self, path: str) -> Path:
        """Where ``/sys/...`` lives in the fake tree."""
        return self.sys_root / _strip(path, "/sys")

    def add_char_device(
        self, path: str, *, numa_node: int | None = None, subsystem: str = "misc"
    ) -> Path:
        """Create the placeholder node ``/dev/...`` (an empty regular file).

        With ``numa_node``, its class entry ``/sys/class/<subsystem>/<name>/device/numa_node``
        is written first.
        """
        if numa_node is not None:
            self.set_numa(path, numa_node, subsystem=subsystem)
        target = self.dev(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.touch()
        return target

    def remove(self, path: str) -> None:
        """Remove ``/dev/...`` (a node, a symlink, or a directory tree)."""
        target = self.dev(path)
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        else:
            target.unlink()

    def symlink(self, path: str, target: str) -> Path:
        """Create ``/dev/...`` as a symlink to ``target`` (taken literally: tests of escapes)."""
        link = self.dev(path)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(target)
        return link

    def set_numa(self, path: str, node: int, *, subsystem: str = "misc") -> None:
        """Set the NUMA node sysfs reports for the node ``/dev/...`` (``-1`` = none)."""
        name = os.path.basename(path)
        self.set_attr(f"/sys/class/{subsystem}/{name}/device/numa_node", str(node))

    def set_attr(self, path: str, value: str) -> None:
        """Write the sysfs attribute ``/sys/...`` (atomically: write then rename)."""
        target = self.sys(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp")
        tmp.write_text(value + "\n", encoding="utf-8")
        tmp.replace(target)

    def remove_attr(self, path: str) -> None:
        """Remove the sysfs attribute ``/sys/...`` (so reading it fails)."""
        self.sys(path).unlink()

    def add_usb(
        self,
        vendor: str,
        product: str,
        serial: str | None = None,
        busnum: int = 1,
        devnum: int = 2,
        *,
        name: str | None = None,
        numa_node: int | None = None,
    ) -> str:
        """Plug a USB device; return its sysfs name (default ``<busnum>-<devnum>``)."""
        sysname = name or f"{busnum}-{devnum}"
        controller = self.sys_root / "devices" / "pci0000:00" / f"0000:00:14.{busnum}"
        devdir = controller / f"usb{busnum}" / sysname
        devdir.mkdir(parents=True, exist_ok=True)
        if numa_node is not None:
            (controller / "numa_node").write_text(f"{numa_node}\n", encoding="utf-8")
        attrs = {
            "idVendor": vendor,
            "idProduct": product,
            "busnum": str(busnum),
            "devnum": str(devnum),
        }
        if serial is not None:
            attrs["serial"] = serial
        for key, value in attrs.items():
            (devdir / key).write_text(value + "\n", encoding="utf-8")
        links = self.sys_root / "bus" / "usb" / "devices"
        links.mkdir(parents=True, exist_ok=True)
        link = links / sysname
        if not link.is_symlink():
            link.symlink_to(os.path.relpath(devdir, links))
        node = f"/dev/bus/usb/{busnum:03d}/{devnum:03d}"
        self.add_char_device(node)
        self._usb[sysname] = (devdir, node)
        return sysname

    def remove_usb(self, sysname: str) -> None:
        """Unplug the USB device ``sysname``: its node, its sysfs link and directory."""
        devdir, node = self._usb.pop(sysname)
        self.remove(node)
        (self.sys_root / "bus" / "usb" / "devices" / sysname).unlink()
        shutil.rmtree(devdir)


def _strip(path: str, prefix: str) -> str:
    if path == prefix or not path.startswith(prefix + "/"):
        raise ValueError(f"{path!r} is not under {prefix}/")
    rel = path[len(prefix) + 1 :]
    if ".." in Path(rel).parts:
        raise ValueError(f"{path!r} must not contain '..'")
    return rel

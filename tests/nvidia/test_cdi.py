"""The CDI spec: built from the inventory, validated, driver files found safely, atomic write."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kubedevice.errors import ConfigError
from kubedevice.nvidia.cdi import (
    DriverFile,
    build_spec,
    find_driver_files,
    resolve_binary,
    validate_spec,
    write_spec,
)
from kubedevice.nvidia.config import parse_config
from kubedevice.nvidia.devices import Inventory, build_inventory

from .gpu_helpers import fake_host, gpu, mig_device


def _inventory(tmp_path: Path) -> Inventory:
    g0, g1 = gpu(0, mig=True), gpu(1)
    mig = {g0.uuid: [mig_device(g0, 0, "1g.18gb", (21, 22))]}
    dev, sys = fake_host(tmp_path, [g0, g1], {})
    cfg = parse_config({"version": "v1", "flags": {"migStrategy": "mixed"}})
    return build_inventory(cfg, [g0, g1], mig, dev_root=str(dev), sys_root=str(sys))


def test_mig_devices_get_their_caps_and_two_names(tmp_path: Path) -> None:
    spec = build_spec(_inventory(tmp_path), host_driver_root="/")
    names = [d["name"] for d in spec["devices"]]
    assert names == [
        "MIG-00000000-aaaa-bbbb-cccc-dddddddddddd",
        "0:0",
        "GPU-00000001-aaaa-bbbb-cccc-dddddddddddd",
        "1",
    ]
    mig_nodes = [n["path"] for n in spec["devices"][0]["containerEdits"]["deviceNodes"]]
    assert mig_nodes == [
        "/dev/nvidia0",
        "/dev/nvidia-caps/nvidia-cap21",
        "/dev/nvidia-caps/nvidia-cap22",
    ]
    common = [n["path"] for n in spec["containerEdits"]["deviceNodes"]]
    assert common == ["/dev/nvidiactl", "/dev/nvidia-uvm"]
    assert "mounts" not in spec["containerEdits"]  # no driver files given


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda s: s.update(cdiVersion="v1"), "bad cdiVersion"),
        (lambda s: s.update(kind="nvidia"), "bad kind"),
        (lambda s: s["devices"].append(dict(s["devices"][0])), "appears twice"),
        (lambda s: s["devices"][0].update(name="a/b"), "bad device name"),
        (lambda s: s["devices"][0].update(containerEdits={}), "has no containerEdits"),
        (
            lambda s: s["devices"][0]["containerEdits"]["deviceNodes"].append({"path": "dev/x"}),
            "must be absolute",
        ),
    ],
)
def test_validation_refuses_what_a_runtime_would(
    tmp_path: Path, mutate: object, message: str
) -> None:
    spec = json.loads(json.dumps(build_spec(_inventory(tmp_path))))
    mutate(spec)  # type: ignore[operator]
    with pytest.raises(ConfigError, match=message):
        validate_spec(spec)


ELF = b"\x7fELF\x02\x01\x01" + bytes(9)


def test_driver_files_stay_inside_the_driver_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("platform.machine", lambda: "x86_64")
    root = tmp_path / "driver"
    lib = root / "usr" / "lib64"
    lib.mkdir(parents=True)
    (lib / "libnvidia-ml.so.580.1").write_text("elf")
    (lib / "libnvidia-ml.so.1").symlink_to("libnvidia-ml.so.580.1")
    (lib / "libnvidia-ml.so.470.9").write_text("an older driver's leftover")
    (lib / "libcuda.so.1").symlink_to(tmp_path / "outside")
    (tmp_path / "outside").write_text("not the driver's")
    (root / "usr" / "bin").mkdir()
    (root / "usr" / "bin" / "nvidia-smi").write_bytes(ELF)
    files = find_driver_files(str(root), "580.1")
    assert files == [
        DriverFile("usr/lib64/libnvidia-ml.so.1", "/usr/lib64/libnvidia-ml.so.1"),
        DriverFile("usr/lib64/libnvidia-ml.so.580.1", "/usr/lib64/libnvidia-ml.so.580.1"),
        # also where a Debian image's loader looks
        DriverFile("usr/lib64/libnvidia-ml.so.1", "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"),
        DriverFile(
            "usr/lib64/libnvidia-ml.so.580.1", "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.1"
        ),
        DriverFile("usr/bin/nvidia-smi", "/usr/bin/nvidia-smi"),
    ]


def test_debian_libraries_are_also_mounted_where_a_lib64_loader_looks(tmp_path: Path) -> None:
    lib = tmp_path / "usr" / "lib" / "aarch64-linux-gnu"
    lib.mkdir(parents=True)
    (lib / "libcuda.so.580.1").write_text("elf")
    (lib / "libcuda.so.1").symlink_to("libcuda.so.580.1")
    targets = {f.target: f.source for f in find_driver_files(str(tmp_path), "580.1")}
    rel = "usr/lib/aarch64-linux-gnu/libcuda.so.1"
    assert targets["/" + rel] == rel
    assert targets["/usr/lib64/libcuda.so.1"] == rel  # the arch comes from the directory
    assert len(targets) == 4


def test_wrapper_scripts_are_replaced_by_the_binary_they_run(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "driver"
    bin_dir = root / "usr" / "bin"
    real = root / "usr" / "lib" / "nvidia" / "current"
    bin_dir.mkdir(parents=True)
    real.mkdir(parents=True)
    (real / "nvidia-smi").write_bytes(ELF)
    # a Debian-style wrapper: the binary it runs is named in the script
    (bin_dir / "nvidia-smi").write_text(
        '#!/bin/sh\nset -e\nexec /usr/lib/nvidia/current/nvidia-smi "$@"\n'
    )
    # a wrapper running "$0.real": the sibling binary
    (bin_dir / "nvidia-persistenced").write_text('#!/bin/sh\nexec "$0.real" "$@"\n')
    (bin_dir / "nvidia-persistenced.real").write_bytes(ELF)
    # a wrapper whose binary is a link leading out of the driver root: skipped
    (tmp_path / "elsewhere").write_bytes(ELF)
    (real / "nvidia-debugdump").symlink_to(tmp_path / "elsewhere")
    (bin_dir / "nvidia-debugdump").write_text(
        "#!/bin/sh\nexec /usr/lib/nvidia/current/nvidia-debugdump\n"
    )
    caplog.set_level("INFO", logger="kubedevice.nvidia.cdi")
    files = find_driver_files(str(root), None)
    assert files == [
        DriverFile("usr/lib/nvidia/current/nvidia-smi", "/usr/bin/nvidia-smi"),
        DriverFile("usr/bin/nvidia-persistenced.real", "/usr/bin/nvidia-persistenced"),
    ]
    assert resolve_binary(str(root), "usr/bin/nvidia-smi") == "usr/lib/nvidia/current/nvidia-smi"
    assert resolve_binary(str(root), "usr/bin/nvidia-debugdump") is None
    said = {(r.getMessage(), getattr(r, "tool", "")[len(str(root)) :]): r for r in caplog.records}
    chose = said[
        ("driver tool is a wrapper script: mounting the binary it runs", "/usr/bin/nvidia-smi")
    ]
    assert chose.binary == "usr/lib/nvidia/current/nvidia-smi"  # type: ignore[attr-defined]
    skipped = "skipping a driver tool: a script, and no ELF binary it runs in the driver root"
    assert (skipped, "/usr/bin/nvidia-debugdump") in said


def test_a_tool_neither_elf_nor_script_is_skipped(tmp_path: Path) -> None:
    (tmp_path / "usr" / "bin").mkdir(parents=True)
    (tmp_path / "usr" / "bin" / "nvidia-smi").write_text("not a program")
    assert find_driver_files(str(tmp_path), None) == []


def test_the_spec_mounts_each_file_at_its_target(tmp_path: Path) -> None:
    files = [DriverFile("usr/lib/nvidia/current/nvidia-smi", "/usr/bin/nvidia-smi")]
    spec = build_spec(_inventory(tmp_path), driver_files=files, host_driver_root="/run/nv")
    assert spec["containerEdits"]["mounts"] == [
        {
            "hostPath": "/run/nv/usr/lib/nvidia/current/nvidia-smi",
            "containerPath": "/usr/bin/nvidia-smi",
            "options": ["ro", "nosuid", "nodev", "bind"],
        }
    ]


def test_write_is_atomic_and_only_on_change(tmp_path: Path) -> None:
    spec = build_spec(_inventory(tmp_path))
    cdi = tmp_path / "cdi"
    assert write_spec(cdi, spec) is True
    target = cdi / "kubedevice-nvidia.json"
    assert json.loads(target.read_text()) == spec
    assert oct(target.stat().st_mode & 0o777) == "0o644"
    inode = target.stat().st_ino
    assert write_spec(cdi, spec) is False  # same content: not rewritten
    assert target.stat().st_ino == inode
    spec["devices"] = spec["devices"][:2]
    assert write_spec(cdi, spec) is True
    assert target.stat().st_ino != inode  # replaced by rename, never rewritten in place
    assert sorted(os.listdir(cdi)) == ["kubedevice-nvidia.json"]  # no temp file left


def test_unwritable_dir_is_a_config_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ConfigError, match="cannot write the CDI spec in"):
        write_spec(blocker / "cdi", {"devices": []})

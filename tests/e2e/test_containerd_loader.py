"""The GPU CDI spec's driver libraries, loaded by a container whose dynamic loader does not
search the host's library directory (a Fedora/RHEL/UBI image on a Debian host).

The fake driver root holds a real shared library ``libcuda.so.1`` (built with gcc here) at the
Debian path ``usr/lib/x86_64-linux-gnu``. The image holds only the host's glibc loader and libc
in ``/lib64`` and ``/usr/lib64`` (no ld.so.conf, no ld.so.cache) and a probe that dlopen()s
``libcuda.so.1`` and prints ``OK`` or the loader's error. The probe is linked with
``RUNPATH=/usr/lib64`` and ``-z nodefaultlib`` (DF_1_NODEFLIB): the loader searches
``/usr/lib64`` and nothing else for it, as a UBI image's loader does (the host's Debian loader
would otherwise also search the Debian directories, where the host path already lies).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubedevice.nvidia.fake.nvml import FakeNvml

from .cluster import Cluster, pod_manifest
from .conftest import GPU
from .real import finished, real_nvidia_nodes

pytestmark = pytest.mark.containerd

IMAGE = "localhost/kd-ldprobe:1"
MACHINE = "dgx-8gpu"
DEBIAN_DIR = "usr/lib/x86_64-linux-gnu"

PROBE_C = r"""
#include <dlfcn.h>
#include <stdio.h>
int main(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (h == NULL) { printf("DLERROR %s\n", dlerror()); return 1; }
    int (*init)(unsigned) = (int (*)(unsigned))dlsym(h, "cuInit");
    if (init == NULL || init(0) != 42) { printf("NOSYM\n"); return 1; }
    printf("OK\n");
    return 0;
}
"""
LIBCUDA_C = "int cuInit(unsigned flags) { (void)flags; return 42; }\n"


def _gcc(*args: str) -> None:
    out = subprocess.run(["gcc", *args], capture_output=True, text=True, check=False, timeout=60)
    assert out.returncode == 0, out.stderr


def _host_file(name: str) -> Path:
    """The host's glibc file ``name`` (the loader or libc), resolved."""
    out = subprocess.run(
        ["gcc", f"-print-file-name={name}"], capture_output=True, text=True, check=True
    )
    path = Path(out.stdout.strip())
    assert path.is_absolute(), f"gcc does not know {name}: {path}"
    return path.resolve()


@pytest.fixture
def work() -> Iterator[Path]:
    if shutil.which("gcc") is None:
        why = "the loader test builds its libraries with gcc: apt-get install gcc"
        if os.environ.get("CI"):
            pytest.fail(f"CI is set: {why}", pytrace=False)
        pytest.skip(why)
    d = Path(tempfile.mkdtemp(prefix="kd-ld-", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def driver_root(work: Path) -> Path:
    """A fake driver root with a real ``libcuda.so.<version>`` and its ``.so.1`` link."""
    version = FakeNvml.from_file(MACHINE).machine.driver.driver_version
    lib = work / "driver" / DEBIAN_DIR
    lib.mkdir(parents=True)
    (work / "libcuda.c").write_text(LIBCUDA_C)
    _gcc("-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(lib / f"libcuda.so.{version}"),
         str(work / "libcuda.c"))  # fmt: skip
    (lib / "libcuda.so.1").symlink_to(f"libcuda.so.{version}")
    return work / "driver"


@pytest.fixture
def probe_image(cluster: Cluster, work: Path) -> str:
    """The lib64-only image, packed with the runtime's mkimage.py and imported with ctr."""
    assert cluster.containerd is not None
    rootfs = work / "rootfs"
    for d in ("lib64", "usr/lib64", "usr/bin"):
        (rootfs / d).mkdir(parents=True)
    shutil.copy(_host_file("ld-linux-x86-64.so.2"), rootfs / "lib64" / "ld-linux-x86-64.so.2")
    shutil.copy(_host_file("libc.so.6"), rootfs / "usr" / "lib64" / "libc.so.6")
    (work / "probe.c").write_text(PROBE_C)
    _gcc("-o", str(rootfs / "usr" / "bin" / "probe"), str(work / "probe.c"),
         "-Wl,--enable-new-dtags,-rpath,/usr/lib64", "-Wl,-z,nodefaultlib")  # fmt: skip
    tar = work / "probe.tar"
    pack = subprocess.run(
        [sys.executable, str(cluster.containerd.scripts / "mkimage.py"), str(rootfs), IMAGE,
         str(tar), "/usr/bin/probe"],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    assert pack.returncode == 0, pack.stderr
    cluster.containerd.import_image(tar)
    return IMAGE


def test_cdi_libraries_load_where_the_image_loader_searches_only_usr_lib64(
    cluster: Cluster, ns: str, gpu_plugin, driver_root: Path, probe_image: str
) -> None:
    config = (
        f"version: v1\nflags:\n  deviceListStrategy: cdi-cri\n  nvidiaDriverRoot: {driver_root}\n"
    )
    gpus = gpu_plugin(config, machine=MACHINE, start=False)
    with real_nvidia_nodes(gpus.nvml.machine.dev_nodes):
        gpus.start()
        cluster.wait_resource(GPU, allocatable=8)
        probe = {
            "name": "main",
            "image": probe_image,
            "imagePullPolicy": "Never",
            "resources": {"limits": {GPU: "1"}},
            # the mount points are made before runc makes the root read-only
            "securityContext": {"readOnlyRootFilesystem": True},
        }
        manifest = pod_manifest("ldprobe", containers=[probe])
        manifest["spec"]["restartPolicy"] = "Never"
        cluster.create_pod(ns, manifest)
        got = finished(cluster, ns, "ldprobe")
    assert got.output.strip() == "OK", got.output
    assert got.phase == "Succeeded", got.output

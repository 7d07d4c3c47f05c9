"""Our plugin daemons as real processes, pointed at the real kubelet's device-plugin directory.

``GenericDaemon`` runs ``kubedevice run`` on a fake ``/dev`` tree (``kubedevice.generic.FakeHost``);
``GpuDaemon`` runs ``kubedevice nvidia run --nvml fake:MACHINE`` with the fake's ``/dev`` and
``/sys`` trees and its control socket (XIDs, loss, recovery). Both serve Prometheus metrics on
a free port (``metric()`` reads one sample), log to ``logs/<name>.log`` (attached to a failing
test through ``Cluster.add_log``), and stop with SIGTERM (``stop()``) or SIGKILL (``kill()``:
the socket stays behind, as after a crash).
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from kubedevice.generic import FakeHost
from kubedevice.nvidia.fake import FakeNvml, send_control, write_fake_dev, write_fake_sysfs

from .cluster import DEVICE_PLUGIN_DIR, Cluster, Process, free_port

KUBEDEVICE = str(Path(sys.executable).with_name("kubedevice"))


class Daemon:
    """One plugin process; ``start()`` again after ``stop()``/``kill()`` restarts it."""

    def __init__(
        self,
        cluster: Cluster,
        name: str,
        argv: list[str],
        resources: list[str],
        cwd: Path,
        env: dict[str, str] | None = None,
    ):
        self.cluster = cluster
        self.resources = resources
        self.name = name
        self.metrics_port = free_port()
        self.log = cluster.logs / f"{name}.log"
        self.process = Process(
            name,
            [
                KUBEDEVICE,
                "--log-level",
                "debug",
                *argv,
                "--metrics-address",
                f"127.0.0.1:{self.metrics_port}",
            ],
            self.log,
            cwd,
            env={**os.environ, **(env or {})},
        )
        cluster.add_log(name, self.log)

    def start(self) -> None:
        self.process.start()

    def stop(self) -> int | None:
        """SIGTERM; return the exit status."""
        return self.process.stop()

    def kill(self) -> None:
        """SIGKILL: the plugin's socket stays in the directory."""
        self.process.kill()

    def metrics(self) -> str:
        with urllib.request.urlopen(
            f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5
        ) as r:
            return str(r.read().decode())

    def metric(self, name: str, **labels: str) -> float:
        """The value of one sample of the daemon's metrics (0 when it is not exported)."""
        for line in self.metrics().splitlines():
            m = re.match(r"^([a-zA-Z_:][\w:]*)(?:\{(.*)\})? (\S+)$", line)
            if not m or m.group(1) != name:
                continue
            got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
            if all(got.get(k) == v for k, v in labels.items()):
                return float(m.group(3))
        return 0.0

    def wait_gone(self, timeout: float = 30) -> None:
        """Wait until the Node shows none of this daemon's resources allocatable (after a stop).

        The kubelet's Node status lags its device manager by one status update: a test that
        starts the next plugin must not read the previous one's allocatable count.
        """
        for resource in self.resources:
            self.cluster.wait_resource(resource, allocatable=0, timeout=timeout)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


class GenericDaemon(Daemon):
    """``kubedevice run --config CONFIG`` on a fake host; ``host`` adds and removes devices."""

    def __init__(
        self,
        cluster: Cluster,
        config: str,
        name: str = "generic-plugin",
        dev_root: Path | None = None,
    ):
        self.root = Path(tempfile.mkdtemp(prefix="kdeg-", dir="/tmp"))
        self.host = FakeHost(self.root)
        self.config = self.root / "config.yaml"
        self.config.write_text(config)
        super().__init__(
            cluster,
            name,
            ["run", "--config", str(self.config), "--device-plugin-dir", str(DEVICE_PLUGIN_DIR),
             "--dev-root", str(dev_root or self.host.dev_root),
             "--sys-root", str(self.host.sys_root)],
            [r["name"] for r in yaml.safe_load(config)["resources"]],
            self.root,
        )  # fmt: skip

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


class GpuDaemon(Daemon):
    """``kubedevice nvidia run --nvml fake:MACHINE`` with its fake trees and control socket."""

    def __init__(
        self,
        cluster: Cluster,
        config: str = "version: v1\n",
        machine: str = "dgx-8gpu",
        name: str = "gpu-plugin",
        resources: tuple[str, ...] = ("nvidia.com/gpu",),
    ):
        self.root = Path(tempfile.mkdtemp(prefix="kden-", dir="/tmp"))
        self.nvml = FakeNvml.from_file(machine)
        write_fake_dev(self.nvml, self.root / "dev")
        write_fake_sysfs(self.nvml, self.root / "sys")
        self.control = self.root / "nvml.sock"
        self.config = self.root / "gpu.yaml"
        self.config.write_text(config)
        # on the real runtime, the dir containerd reads (it resolves the plugin's CDI names)
        self.cdi_dir = cluster.cdi_dir or self.root / "cdi"
        pod_resources = cluster.kubelet.pod_resources_socket if cluster.kubelet else ""
        super().__init__(
            cluster,
            name,
            ["nvidia", "run", "--config", str(self.config), "--nvml", f"fake:{machine}",
             "--device-plugin-dir", str(DEVICE_PLUGIN_DIR), "--dev-root", str(self.root / "dev"),
             "--sys-root", str(self.root / "sys"), "--features-dir", str(self.root / "features.d"),
             "--cdi-dir", str(self.cdi_dir),
             "--pod-resources-socket", str(pod_resources)],
            list(resources),
            self.root,
            env={"KUBEDEVICE_FAKE_NVML_CONTROL": str(self.control)},
        )  # fmt: skip

    @property
    def uuids(self) -> list[str]:
        """The machine's GPU UUIDs by index."""
        return [g.info.uuid for g in self.nvml.machine.gpus]

    def nvlinks(self, a: str, b: str) -> int:
        link = self.nvml.machine.links.get(frozenset((a, b)))
        return 0 if link is None else int(link.nvlinks)

    def send(self, message: dict[str, Any]) -> None:
        send_control(self.control, message)

    def xid(self, uuid: str, xid: int = 79) -> None:
        """A critical XID on ``uuid`` (79: fallen off the bus)."""
        self.send({"op": "xid", "uuid": uuid, "xid": xid})

    def recover(self, uuid: str) -> None:
        self.send({"op": "recover", "uuid": uuid})

    def close(self) -> None:
        self.stop()
        self.nvml.close()
        shutil.rmtree(self.root, ignore_errors=True)

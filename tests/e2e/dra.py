"""The DRA drivers as real processes on the real kubelet, and resource.k8s.io helpers.

``GpuDra`` runs ``kubedevice nvidia dra --nvml fake:MACHINE`` (fake ``/dev`` and ``/sys``
trees, the fake's control socket for XIDs and lost GPUs); ``GenericDra`` runs
``kubedevice run --dra`` on a fake ``/dev`` tree. Both register with the harness's kubelet
(its ``--root-dir`` is their ``--kubelet-dir``), publish as the admin user and write CDI
specs into a directory of their own. Waits are on events: watches of the API server,
inotify on files.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml
from asyncinotify import Inotify, Mask
from kubernetes import client

from kubedevice.generic import FakeHost
from kubedevice.nvidia.fake import FakeNvml, send_control, write_fake_dev, write_fake_sysfs

from .cluster import NODE, Cluster, ClusterError, Kubelet, Process, wait_for

KUBEDEVICE = str(Path(sys.executable).with_name("kubedevice"))
REGISTERED = "registered with the kubelet as DRA driver"
PREPARED = "kubedevice.dra.node.service: prepared claim "
UNPREPARED = "kubedevice.dra.node.service: unprepared claim "
_serial = iter(range(1, 1_000_000))


def wait_file(
    path: Path, predicate: Callable[[Path], bool], timeout: float = 30, what: str = ""
) -> None:
    """Wait (inotify on the parent directory) until ``predicate(path)`` holds."""

    async def run() -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with Inotify() as ino:
            ino.add_watch(
                path.parent,
                Mask.CREATE | Mask.DELETE | Mask.MODIFY | Mask.MOVED_TO | Mask.MOVED_FROM,
            )
            deadline = time.monotonic() + timeout
            while not predicate(path):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ClusterError(
                        f"timed out after {timeout:.0f} s waiting for {what or path}"
                    )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(ino.get(), left)

    asyncio.run(run())


def log_count(log: Path, needle: str) -> int:
    try:
        return log.read_text(errors="replace").count(needle)
    except OSError:
        return 0


class DraDriver:
    """One DRA driver process; ``start()`` again after ``stop()``/``kill()`` restarts it."""

    def __init__(
        self,
        cluster: Cluster,
        name: str,
        driver: str,
        argv: list[str],
        root: Path,
        env: Any,
        kubeconfig: Path | None = None,
        kubelet: Kubelet | None = None,
        node: str | None = None,
    ) -> None:
        kubelet = kubelet or cluster.kubelet
        assert kubelet is not None
        self.cluster = cluster
        name = f"{name}-{next(_serial)}"  # a log of its own: counts are this driver's
        self.name = name
        self.driver = driver
        self.root = root
        # on the real runtime, the dir its node's containerd reads (shared by every driver of
        # the session on that node)
        self.cdi_dir = kubelet.containerd.cdi_dir if kubelet.containerd else root / "cdi"
        self.log = cluster.logs / f"{name}.log"
        self.process = Process(
            name,
            [KUBEDEVICE, "--log-level", "debug", *argv, "--driver-name", driver,
             "--node-name", node or kubelet.node, "--kubelet-dir", str(kubelet.root),
             "--cdi-dir", str(self.cdi_dir),
             "--kubeconfig", str(kubeconfig or cluster.admin_kubeconfig)],
            self.log,
            root / "cwd",
            env={**os.environ, **(env or {})},
        )  # fmt: skip
        cluster.add_log(name, self.log)
        self._made = (cluster, driver, argv, env, kubeconfig, kubelet, node)

    def sibling(self, extra: list[str], env: dict[str, str] | None = None) -> DraDriver:
        """Another instance of this driver on the same trees (its CDI dir, fake /dev and
        NVML state): a DaemonSet's next pod in a rolling upgrade. Not started."""
        cluster, driver, argv, own_env, kubeconfig, kubelet, node = self._made
        twin = DraDriver.__new__(DraDriver)
        DraDriver.__init__(
            twin, cluster, self.name.rsplit("-", 1)[0] + "-next", driver, [*argv, *extra],
            self.root, {**(own_env or {}), **(env or {})}, kubeconfig, kubelet, node,
        )  # fmt: skip
        twin.cdi_dir = self.cdi_dir
        return twin

    def start(self, *, wait: bool = True) -> None:
        """Start; with ``wait``, until the kubelet has registered it (once more than before)."""
        before = log_count(self.log, REGISTERED)
        self.process.start()
        if wait:
            self.wait_registered(before + 1)

    def wait_registered(self, count: int, timeout: float = 30) -> None:
        wait_file(
            self.log,
            lambda p: log_count(p, REGISTERED) >= count or not self.process.alive(),
            timeout,
            f"{self.name} registered ({count})",
        )
        self.process.check_alive()

    def stop(self) -> int | None:
        return self.process.stop()

    def kill(self) -> None:
        self.process.kill()

    def cdi_specs(self) -> dict[str, dict[str, Any]]:
        """The CDI spec files in the driver's CDI dir, by name (JSON)."""
        if not self.cdi_dir.is_dir():
            return {}
        # this driver's (the dir may be the runtime's, shared with other drivers)
        out = {}
        for p in sorted(self.cdi_dir.glob(f"k8s.{self.driver}-claim_*.json")):
            with contextlib.suppress(FileNotFoundError):  # removed since listed: unprepared
                out[p.name] = json.loads(p.read_text())
        return out

    def wait_specs(self, predicate: Callable[[dict[str, dict[str, Any]]], bool], what: str) -> None:
        wait_file(self.cdi_dir / "x", lambda _p: predicate(self.cdi_specs()), 60, what)

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


class GpuDra(DraDriver):
    """``kubedevice nvidia dra --nvml fake:MACHINE`` with the fake's trees and control socket."""

    def __init__(
        self,
        cluster: Cluster,
        machine: str = "dgx-8gpu",
        driver: str = "gpu.kubedevice.io",
        config: str = "version: v1\n",
        name: str = "gpu-dra",
        kubeconfig: Path | None = None,
        kubelet: Kubelet | None = None,
        extra: tuple[str, ...] = (),
    ) -> None:
        root = Path(tempfile.mkdtemp(prefix="kddg-", dir="/tmp"))
        self.nvml = FakeNvml.from_file(machine)
        write_fake_dev(self.nvml, root / "dev")
        write_fake_sysfs(self.nvml, root / "sys")
        self.control = root / "nvml.sock"
        #: The fake's GPU instances (MIG on demand), kept where they outlive the process.
        self.nvml_state = root / "nvml-state.json"
        #: While this file is there, the next GPU instance made ends the driver (a crash).
        self.crash_marker = root / "crash-after-create"
        #: While a FIFO is here, the next GPU instance made waits until it is written to.
        self.hold_create = root / "hold-create"
        (root / "gpu.yaml").write_text(config)
        super().__init__(
            cluster,
            name,
            driver,
            ["nvidia", "dra", "--config", str(root / "gpu.yaml"), "--nvml", f"fake:{machine}",
             "--dev-root", str(root / "dev"), "--sys-root", str(root / "sys"), *extra],
            root,
            {
                "KUBEDEVICE_FAKE_NVML_CONTROL": str(root / "nvml.sock"),
                "KUBEDEVICE_FAKE_NVML_STATE": str(self.nvml_state),
                "KUBEDEVICE_FAKE_NVML_CRASH_AFTER_CREATE": str(self.crash_marker),
                "KUBEDEVICE_FAKE_NVML_HOLD_CREATE": str(self.hold_create),
            },
            kubeconfig,
            kubelet,
        )  # fmt: skip

    @property
    def uuids(self) -> list[str]:
        return [g.info.uuid for g in self.nvml.machine.gpus]

    def send(self, message: dict[str, Any]) -> None:
        send_control(self.control, message)

    def close(self) -> None:
        super().close()
        self.nvml.close()


#: A /dev group (``/dev/e2e*``) whose health check reads
#: ``/sys/class/e2e/<device>/ok`` every 0.2 s: write ``0`` there and the device is Unhealthy.
CHECKED_DEV_CONFIG = """\
version: v1
resources:
  - name: example.com/e2e
    groups:
      - name: e2e
        paths:
          - path: /dev/e2e*
        health:
          periodSeconds: 0.2
          sysfsAttribute:
            path: /sys/class/e2e/{name}/ok
            expect: "1"
"""


class GenericDra(DraDriver):
    """``kubedevice run --dra`` on a fake host (``host.add_char_device`` / ``remove``)."""

    def __init__(
        self,
        cluster: Cluster,
        config: str,
        driver: str = "dev.kubedevice.io",
        name: str = "dev-dra",
        extra: tuple[str, ...] = (),
        dev_root: Path | None = None,
        node: str | None = None,
    ) -> None:
        root = Path(tempfile.mkdtemp(prefix="kddd-", dir="/tmp"))
        self.host = FakeHost(root / "host")
        self.config = root / "config.yaml"
        self.config.write_text(config)
        super().__init__(
            cluster,
            name,
            driver,
            ["run", "--dra", "--config", str(root / "config.yaml"),
             "--dev-root", str(dev_root or self.host.dev_root),
             "--sys-root", str(self.host.sys_root), *extra],
            root,
            None,
            node=node,
        )  # fmt: skip


# ---------------------------------------------------------------------------------------------
# resource.k8s.io


def resource_api(cluster: Cluster) -> client.ResourceV1Api:
    return client.ResourceV1Api(cluster.api)


def slice_devices(cluster: Cluster, driver: str, node: str = NODE) -> dict[str, Any]:
    """The devices of the driver's slices on ``node``, by name."""
    out: dict[str, Any] = {}
    for s in (
        resource_api(cluster).list_resource_slice(field_selector=f"spec.driver={driver}").items
    ):
        if s.spec.node_name == node:
            out.update({d.name: d for d in s.spec.devices or []})
    return out


def wait_slices(
    cluster: Cluster,
    driver: str,
    predicate: Callable[[set[str]], bool],
    what: str,
    timeout: float = 30,
    node: str = NODE,
) -> set[str]:
    """Watch the ResourceSlices until the names of the driver's schedulable devices (those
    without a taint) on ``node`` satisfy ``predicate``."""
    api = resource_api(cluster)

    def names() -> set[str]:
        return {n for n, d in slice_devices(cluster, driver, node).items() if not d.taints}

    if predicate(names()):
        return names()
    wait_for(
        api.list_resource_slice,
        lambda _s: predicate(names()),
        timeout,
        f"ResourceSlices of {driver}: {what}",
        field_selector=f"spec.driver={driver}",
    )
    return names()


@contextlib.contextmanager
def device_class(cluster: Cluster, *expressions: str, prefix: str = "e2e") -> Iterator[str]:
    """A DeviceClass selecting with the CEL ``expressions``; deleted afterwards."""
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": e}} for e in expressions]},
    }
    api = resource_api(cluster)
    api.create_device_class(body)
    try:
        yield name
    finally:
        with contextlib.suppress(client.ApiException):
            api.delete_device_class(name)


def request(name: str, device_class_name: str, count: int = 1, *selectors: str) -> dict[str, Any]:
    exactly: dict[str, Any] = {
        "deviceClassName": device_class_name,
        "allocationMode": "ExactCount",
        "count": count,
    }
    if selectors:
        exactly["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    return {"name": name, "exactly": exactly}


def claim_spec(
    *requests: dict[str, Any],
    match_attribute: str | None = None,
    config: dict[str, Any] | None = None,
    driver: str | None = None,
) -> dict[str, Any]:
    devices: dict[str, Any] = {"requests": list(requests)}
    if match_attribute is not None:
        devices["constraints"] = [
            {"requests": [r["name"] for r in requests], "matchAttribute": match_attribute}
        ]
    if config is not None:
        devices["config"] = [{"opaque": {"driver": driver, "parameters": config}}]
    return {"devices": devices}


def create_template(cluster: Cluster, ns: str, name: str, spec: dict[str, Any]) -> None:
    resource_api(cluster).create_namespaced_resource_claim_template(
        ns,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": name},
            "spec": {"spec": spec},
        },
    )


def create_claim(cluster: Cluster, ns: str, name: str, spec: dict[str, Any]) -> None:
    resource_api(cluster).create_namespaced_resource_claim(
        ns,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name},
            "spec": spec,
        },
    )


def claim_pod(
    name: str, *, template: str | None = None, claim: str | None = None, claim_name: str = "dev"
) -> dict[str, Any]:
    """A pod with one container using one claim (from a template or an existing claim)."""
    ref: dict[str, Any] = {"name": claim_name}
    if template is not None:
        ref["resourceClaimTemplateName"] = template
    else:
        ref["resourceClaimName"] = claim
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 0,
            "resourceClaims": [ref],
            "containers": [
                {
                    "name": "main",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"claims": [{"name": claim_name}]},
                }
            ],
        },
    }


#: How long a DRA pod may take to run. The kubelet can fetch a claim before the API server's
#: node authorizer has linked it to the node ("no relationship found"); it then retries only
#: at its next pod sync (the harness's kubelet: every 10 s; a default kubelet: 1 minute), or
#: later after sync errors back off; a wait must outlast that.
POD_TIMEOUT = 150


def run_claim_pod(cluster: Cluster, ns: str, manifest: dict[str, Any]) -> Any:
    """Create a pod using claims and wait until it is Running (see :data:`POD_TIMEOUT`)."""
    return cluster.run_pod(ns, manifest, timeout=POD_TIMEOUT)


def pod_claim(cluster: Cluster, ns: str, pod: str) -> Any:
    """The ResourceClaim a (scheduled) pod uses: the first of its claim statuses."""
    p = cluster.core.read_namespaced_pod(pod, ns)
    statuses = p.status.resource_claim_statuses or []
    name = (
        statuses[0].resource_claim_name
        if statuses
        else p.spec.resource_claims[0].resource_claim_name
    )
    return resource_api(cluster).read_namespaced_resource_claim(name, ns)


def device_health(pod: Any) -> list[tuple[str, str | None]]:
    """(health, message) of every device in the pod's ``allocatedResourcesStatus``."""
    return [
        (r.health, r.message)
        for status in pod.status.container_statuses or []
        for res in status.allocated_resources_status or []
        for r in res.resources or []
    ]


def allocated(claim: Any) -> list[str]:
    """The device names allocated to a claim."""
    return [r.device for r in claim.status.allocation.devices.results]


def delete_pod(cluster: Cluster, ns: str, name: str) -> None:
    """Delete a pod and wait until it is gone from the API server (the kubelet let it go)."""
    cluster.core.delete_namespaced_pod(name, ns)
    wait_pod_gone(cluster, ns, name)


def wait_pod_gone(cluster: Cluster, ns: str, name: str, timeout: float = 60) -> None:
    """Watch until the pod is gone from the API server (its containers stopped)."""
    deadline = time.monotonic() + timeout
    w = None
    from kubernetes import watch

    while time.monotonic() < deadline:
        items = cluster.core.list_namespaced_pod(ns, field_selector=f"metadata.name={name}")
        if not items.items:
            return
        w = watch.Watch()
        try:
            for ev in w.stream(
                cluster.core.list_namespaced_pod,
                ns,
                field_selector=f"metadata.name={name}",
                resource_version=items.metadata.resource_version,
                timeout_seconds=max(1, int(deadline - time.monotonic())),
            ):
                if ev["type"] == "DELETED":
                    return
        finally:
            w.stop()
    raise ClusterError(f"pod {ns}/{name} was not deleted in {timeout:g} s")


def release(cluster: Cluster, ns: str, drivers: list[DraDriver]) -> None:
    """Delete the namespace's pods while their drivers still run, and wait until every claim
    is unprepared (the drivers' CDI specs are gone); only then may the drivers stop.

    A driver stopped first leaves the kubelet unable to unprepare ("driver not registered"):
    it keeps retrying those pods, and a later test's kubelet restart meets them.
    """
    pods = cluster.core.list_namespaced_pod(ns).items
    if pods:
        for drv in drivers:
            if not drv.process.alive():  # a test stopped it: the kubelet needs it back
                drv.start()
    for pod in pods:
        with contextlib.suppress(client.ApiException):
            delete_pod(cluster, ns, pod.metadata.name)
    for drv in drivers:
        drv.wait_specs(lambda specs: not specs, f"{drv.name}: every claim unprepared")


def docs_yaml() -> list[dict[str, Any]]:
    """The YAML examples of the drivers' guides, section "Claims and pods", as documents: those
    of docs/nvidia-dra.md (the GPU driver), then those of docs/generic-dra.md (the /dev driver)."""
    docs = Path(__file__).resolve().parents[2] / "docs"
    found: list[dict[str, Any]] = []
    for name in ("nvidia-dra.md", "generic-dra.md"):
        text = (docs / name).read_text()
        section = text[text.index("## Claims and pods") :]
        end = section.find("\n## ", 1)
        section = section if end < 0 else section[:end]
        blocks = [b.split("```", 1)[0] for b in section.split("```yaml\n")[1:]]
        found += [d for b in blocks for d in yaml.safe_load_all(b) if d]
    return found


def share_one_claim(cluster: Cluster, ns: str, drv: DraDriver, device_class_name: str) -> None:
    """Two pods using one ResourceClaim: both containers get the same single CDI device, the
    driver prepares the claim once, and its spec stays until the second pod is gone."""
    create_claim(cluster, ns, "shared", claim_spec(request("dev", device_class_name)))
    run_claim_pod(cluster, ns, claim_pod("a", claim="shared"))
    run_claim_pod(cluster, ns, claim_pod("b", claim="shared"))
    kubelet = cluster.kubelet
    assert kubelet is not None
    ids = [
        [d["name"] for d in kubelet.created(ns, p, "main").get("cdiDevices") or []] for p in "ab"
    ]
    assert ids[0] == ids[1]
    assert len(ids[0]) == 1
    assert log_count(drv.log, PREPARED) == 1
    assert len(drv.cdi_specs()) == 1
    delete_pod(cluster, ns, "a")
    assert len(drv.cdi_specs()) == 1  # b still uses it
    delete_pod(cluster, ns, "b")
    drv.wait_specs(lambda specs: not specs, "the shared claim's spec removed")


def wait_unschedulable(cluster: Cluster, ns: str, name: str, timeout: float = 30) -> Any:
    def unschedulable(p: Any) -> bool:
        return any(
            c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable"
            for c in p.status.conditions or []
        )

    return cluster.wait_pod(ns, name, unschedulable, timeout, "Unschedulable")

"""Item 7: the Helm chart on the real components.

``helm template`` (the real helm) renders the chart; its ConfigMaps and DaemonSets are created
in the real API server; the real DaemonSet controller makes the pods, the real scheduler binds
them to the node the chart selects, and the real kubelet admits them: it sets up every volume
(checking each hostPath's type), asks the runtime to create the container, and the pod runs in
kd-fakecri. The runtime's record of that CreateContainer must carry the mounts and the
environment the chart rendered. kd-fakecri never pulls an image: its image service answers
every pull, so the chart's image name is used as rendered.

Paths the chart takes as values are pointed at this test cluster's (the kubelet's root dir is a
temp dir here, so its PodResources directory is too) and, where the chart would create a host
directory (DirectoryOrCreate), at a temp dir: nothing is created on this machine.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from deploy.helm import helm
from deploy.render import CHART, by_kind, container, daemonset, render
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from .cluster import NODE, Cluster, envs, wait_for

GPU_LABEL = "nvidia.com/gpu.present"


def _create(cluster: Cluster, ns: str, docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Create the rendered ConfigMaps and DaemonSets in ``ns``; the DaemonSets."""
    apps = client.AppsV1Api(cluster.api)
    kinds = sorted({d["kind"] for d in docs})
    assert kinds == ["ConfigMap", "DaemonSet"], kinds
    for cm in by_kind(docs, "ConfigMap"):
        cluster.core.create_namespaced_config_map(ns, cm)
    for ds in by_kind(docs, "DaemonSet"):
        apps.create_namespaced_daemon_set(ns, ds)
    return by_kind(docs, "DaemonSet")


def _running_pod(cluster: Cluster, ns: str, ds: dict[str, Any]) -> Any:
    """The DaemonSet's pod on ``NODE``, once the kubelet has it Running."""
    selector = ",".join(f"{k}={v}" for k, v in ds["spec"]["selector"]["matchLabels"].items())

    def running(p: Any) -> bool:
        return bool(p.status.phase == "Running" and p.spec.node_name == NODE)

    try:
        return wait_for(
            cluster.core.list_namespaced_pod,
            running,
            60,
            f"a Running pod of DaemonSet {ns}/{ds['metadata']['name']}",
            ns,
            label_selector=selector,
        )
    except Exception:
        for p in cluster.core.list_namespaced_pod(ns).items:
            print(f"pod {p.metadata.name}: {p.status.phase} {p.status.conditions}")
            for e in cluster.events(ns, p.metadata.name):
                print(f"  event {e.reason}: {e.message}")
        raise


def _check_record(cluster: Cluster, ns: str, ds: dict[str, Any], pod: Any) -> dict[str, Any]:
    """The runtime's CreateContainer record carries what the chart rendered."""
    rendered = container(ds)
    record = cluster.kubelet.created(ns, pod.metadata.name, rendered["name"])  # type: ignore[union-attr]
    assert not record.get("error"), record["error"]
    got_env = envs(record)
    for e in rendered["env"]:
        if "value" in e:
            assert got_env.get(e["name"]) == e["value"], e["name"]
        elif e["name"] == "POD_UID":  # the DRA drivers' sockets are named by it
            assert e["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.uid"}}, e
            assert got_env.get("POD_UID") == pod.metadata.uid
        else:  # the downward API's node name (the DRA drivers' NODE_NAME)
            assert e["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}, e
            assert got_env.get(e["name"]) == NODE, e["name"]
    volumes = {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}
    mounts = {m["container_path"]: m for m in record["mounts"]}
    for m in rendered["volumeMounts"]:
        got = mounts[m["mountPath"]]
        assert bool(got.get("readonly")) == bool(m.get("readOnly")), m["mountPath"]
        vol = volumes[m["name"]]
        if "hostPath" in vol:
            assert got["host_path"] == vol["hostPath"]["path"], m["mountPath"]
        # CRI MountPropagation: 0 private, 1 host-to-container, 2 bidirectional
        want = _PROPAGATION[m.get("mountPropagation", "None")]
        assert got.get("propagation", 0) == want, m["mountPath"]
    # kd-fakecri records no command or args: those the kubelet sends are the pod's, which the
    # DaemonSet controller copied from the template; check them there (and in the record when
    # a runtime records them)
    [spec] = [c for c in pod.spec.containers if c.name == rendered["name"]]
    assert spec.command == rendered["command"]
    assert spec.args == rendered["args"]
    assert spec.image == rendered["image"]
    for key in ("command", "args"):
        if key in record:
            assert record[key] == rendered[key]
    return record


_PROPAGATION = {"None": 0, "HostToContainer": 1, "Bidirectional": 2}


@contextlib.contextmanager
def _node_label(cluster: Cluster, key: str, value: str) -> Iterator[None]:
    cluster.core.patch_node(NODE, {"metadata": {"labels": {key: value}}})
    try:
        yield
    finally:
        with contextlib.suppress(ApiException):
            cluster.core.patch_node(NODE, {"metadata": {"labels": {key: None}}})


def _values(cluster: Cluster, tmp_path: Path) -> dict[str, str]:
    kubelet = cluster.kubelet
    assert kubelet is not None
    return {
        "podResourcesDir": str(kubelet.pod_resources_socket.parent),
        "nvidia.cdiDir": str(tmp_path / "cdi"),
        "nvidia.featuresDir": str(tmp_path / "features.d"),
    }


def test_default_chart_pod_runs_on_the_real_kubelet(
    cluster: Cluster, ns: str, tmp_path: Path
) -> None:
    docs = render(namespace=ns, values=_values(cluster, tmp_path))
    [ds] = _create(cluster, ns, docs)
    pod = _running_pod(cluster, ns, ds)
    assert pod.spec.priority_class_name == "system-node-critical"
    record = _check_record(cluster, ns, ds, pod)
    assert record["container"] == "plugin"
    assert envs(record)["KUBEDEVICE_LOG_FORMAT"] == "json"


def test_gpu_daemonset_runs_only_on_a_gpu_node(cluster: Cluster, ns: str, tmp_path: Path) -> None:
    docs = render(namespace=ns, values={"nvidia.enabled": "true", **_values(cluster, tmp_path)})
    apps = client.AppsV1Api(cluster.api)
    generic, gpu = (daemonset(docs, c) for c in ("generic", "nvidia"))
    _create(cluster, ns, docs)
    # the node has no GPU label: the DaemonSet wants no pod there
    _running_pod(cluster, ns, generic)
    status = apps.read_namespaced_daemon_set_status(gpu["metadata"]["name"], ns).status
    assert status.desired_number_scheduled == 0
    with _node_label(cluster, GPU_LABEL, "true"):
        pod = _running_pod(cluster, ns, gpu)
        assert pod.spec.runtime_class_name is None  # no RuntimeClass needed by default
        record = _check_record(cluster, ns, gpu, pod)
        assert envs(record)["NVIDIA_VISIBLE_DEVICES"] == "all"


def test_gpu_daemonset_with_mig_and_cdi_is_admitted(
    cluster: Cluster, ns: str, tmp_path: Path
) -> None:
    """MIG adds SYS_ADMIN (the API server must accept it with no privilege escalation); CDI
    mounts the driver root (a Directory the kubelet checks)."""
    driver = tmp_path / "driver"
    driver.mkdir()
    config = tmp_path / "gpu.yaml"
    config.write_text(
        "version: v1\nflags:\n  migStrategy: mixed\n  deviceListStrategy: [envvar, cdi-cri]\n"
    )
    docs = render(
        namespace=ns,
        values={
            "nvidia.enabled": "true",
            "generic.enabled": "false",
            "nvidia.driverRoot": str(driver),
            **_values(cluster, tmp_path),
        },
        set_files={"nvidia.config": config},
    )
    [gpu] = _create(cluster, ns, docs)
    with _node_label(cluster, "feature.node.kubernetes.io/pci-10de.present", "true"):
        pod = _running_pod(cluster, ns, gpu)
        record = _check_record(cluster, ns, gpu, pod)
    assert envs(record)["NVIDIA_MIG_MONITOR_DEVICES"] == "all"
    mounts = {m["container_path"]: m for m in record["mounts"]}
    assert mounts["/host/driver"]["host_path"] == str(driver)
    assert mounts["/host/driver"]["readonly"] is True


def test_helm_install_upgrade_with_reuse_values_and_uninstall(
    cluster: Cluster, ns: str, tmp_path: Path
) -> None:
    """The operations guide's upgrade path with the real helm against the real API server:
    OnDelete (rollingUpdate=null) survives a later ``--reuse-values`` upgrade, the upgrade does
    not roll the pod, and uninstall leaves nothing."""
    kube = ("--kubeconfig", str(cluster.admin_kubeconfig), "-n", ns)
    sets = [f"{k}={v}" for k, v in _values(cluster, tmp_path).items()]
    sets += ["updateStrategy.type=OnDelete", "updateStrategy.rollingUpdate=null"]
    helm("install", "kd", str(CHART), *kube, *(a for s in sets for a in ("--set", s)))
    apps = client.AppsV1Api(cluster.api)
    ds = apps.read_namespaced_daemon_set("kd-kubedevice", ns)
    assert ds.spec.update_strategy.to_dict() == {"type": "OnDelete", "rolling_update": None}
    pod = _running_pod(cluster, ns, {"metadata": {"name": "kd-kubedevice"},
                                     "spec": {"selector": {"matchLabels":
                                              ds.spec.selector.match_labels}}})  # fmt: skip
    proc = helm("upgrade", "kd", str(CHART), *kube, "--reuse-values", "--set", "image.tag=9.9.9")
    assert "STATUS: deployed" in proc.stdout
    ds = apps.read_namespaced_daemon_set("kd-kubedevice", ns)
    assert ds.spec.template.spec.containers[0].image == "kubedevice:9.9.9"
    assert ds.spec.update_strategy.type == "OnDelete"
    wait_for(
        apps.list_namespaced_daemon_set,
        lambda d: (
            d.metadata.name == "kd-kubedevice"
            and d.status.observed_generation == d.metadata.generation
        ),
        30,
        "the DaemonSet controller to see the upgrade",
        ns,
    )
    still = cluster.core.read_namespaced_pod(pod.metadata.name, ns)  # OnDelete: not rolled
    assert still.spec.containers[0].image == "kubedevice:0.1.0"
    helm("uninstall", "kd", *kube)
    assert apps.list_namespaced_daemon_set(ns).items == []
    names = [c.metadata.name for c in cluster.core.list_namespaced_config_map(ns).items]
    assert not [n for n in names if n.startswith("kd-")], names


@contextlib.contextmanager
def _create_dra(cluster: Cluster, ns: str, docs: list[dict[str, Any]]) -> Iterator[None]:
    """Create everything the chart rendered: the ServiceAccounts and ConfigMaps first (a pod
    naming a missing ServiceAccount is refused), then the RBAC, the DeviceClasses and the
    DaemonSets; the cluster-scoped objects are deleted afterwards."""
    apps = client.AppsV1Api(cluster.api)
    rbac = client.RbacAuthorizationV1Api(cluster.api)
    admission = client.AdmissionregistrationV1Api(cluster.api)
    resource = client.ResourceV1Api(cluster.api)
    kinds = sorted({d["kind"] for d in docs})
    assert kinds == [
        "ClusterRole", "ClusterRoleBinding", "ConfigMap", "DaemonSet", "DeviceClass",
        "ServiceAccount", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
    ], kinds  # fmt: skip
    for sa in by_kind(docs, "ServiceAccount"):
        cluster.core.create_namespaced_service_account(ns, sa)
    for cm in by_kind(docs, "ConfigMap"):
        cluster.core.create_namespaced_config_map(ns, cm)
    made: list[tuple[Any, str]] = []
    try:
        for role in by_kind(docs, "ClusterRole"):
            rbac.create_cluster_role(role)
            made.append((rbac.delete_cluster_role, role["metadata"]["name"]))
        for binding in by_kind(docs, "ClusterRoleBinding"):
            rbac.create_cluster_role_binding(binding)
            made.append((rbac.delete_cluster_role_binding, binding["metadata"]["name"]))
        for policy in by_kind(docs, "ValidatingAdmissionPolicy"):
            admission.create_validating_admission_policy(policy)
            made.append((admission.delete_validating_admission_policy, policy["metadata"]["name"]))
        for pb in by_kind(docs, "ValidatingAdmissionPolicyBinding"):
            admission.create_validating_admission_policy_binding(pb)
            made.append(
                (admission.delete_validating_admission_policy_binding, pb["metadata"]["name"])
            )
        for cls in by_kind(docs, "DeviceClass"):
            made_cls = resource.create_device_class(cls)
            made.append((resource.delete_device_class, cls["metadata"]["name"]))
            # the API server kept the field (DRAExtendedResource is on in 1.36)
            assert made_cls.spec.extended_resource_name == cls["spec"]["extendedResourceName"]
        for ds in by_kind(docs, "DaemonSet"):
            apps.create_namespaced_daemon_set(ns, ds)
        yield
    finally:
        for delete, name in reversed(made):
            with contextlib.suppress(ApiException):
                delete(name)


def test_dra_daemonsets_run_on_the_real_kubelet(cluster: Cluster, ns: str, tmp_path: Path) -> None:
    """Both DRA drivers' DaemonSets, default values otherwise: each pod is admitted and Running
    on the GPU-labelled node, with its hostPath volumes (the kubelet's plugin directories, the
    CDI dir, /dev, /sys and for the GPU driver the driver root's /usr) set up as rendered."""
    kubelet = cluster.kubelet
    assert kubelet is not None
    docs = render(
        namespace=ns,
        release=f"dra-{ns[-5:]}",  # its own ClusterRole names
        values={
            "dra.nvidia.enabled": "true",
            "dra.generic.enabled": "true",
            # this cluster's kubelet root dir (plugins_registry/ must exist: type Directory)
            "dra.kubeletDir": str(kubelet.root),
            "dra.cdiDir": str(tmp_path / "cdi"),  # DirectoryOrCreate: not the machine's own
        },
    )
    gpu, gen = daemonset(docs, "dra-nvidia"), daemonset(docs, "dra-generic")
    with contextlib.ExitStack() as stack:
        stack.enter_context(_create_dra(cluster, ns, docs))
        stack.enter_context(_node_label(cluster, GPU_LABEL, "true"))
        pods = {name: _running_pod(cluster, ns, ds) for name, ds in (("gpu", gpu), ("gen", gen))}
        records = {
            "gpu": _check_record(cluster, ns, gpu, pods["gpu"]),
            "gen": _check_record(cluster, ns, gen, pods["gen"]),
        }
    assert pods["gpu"].spec.runtime_class_name is None  # no RuntimeClass needed by default
    for name, ds in (("gpu", gpu), ("gen", gen)):
        pod, record = pods[name], records[name]
        assert pod.spec.service_account_name == ds["metadata"]["name"]
        assert pod.spec.node_selector == {"kubernetes.io/os": "linux"}
        assert envs(record)["NODE_NAME"] == NODE
        mounts = {m["container_path"]: m["host_path"] for m in record["mounts"]}
        assert mounts[f"{kubelet.root}/plugins_registry"] == f"{kubelet.root}/plugins_registry"
        assert mounts[f"{kubelet.root}/plugins"] == f"{kubelet.root}/plugins"
        assert mounts["/var/run/cdi"] == str(tmp_path / "cdi")
        assert "/" not in mounts.values()  # never the host's root
    assert (tmp_path / "cdi").is_dir()  # the kubelet created it (DirectoryOrCreate)
    gpu_mounts = {m["container_path"]: m for m in records["gpu"]["mounts"]}
    assert gpu_mounts["/host/driver/usr"]["host_path"] == "/usr"  # driverRoot "/": /usr only
    assert gpu_mounts["/host/driver/usr"]["readonly"] is True
    assert envs(records["gpu"])["NVIDIA_VISIBLE_DEVICES"] == "all"

"""The GPU plugin daemon in-process against the kubelet emulator, on the fake NVML."""

from __future__ import annotations

import asyncio
import json
import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from kubedevice.errors import AdmissionError, ConfigError, NvmlError
from kubedevice.kubelet import Emulator
from kubedevice.nvidia.backend import EventKind, HealthEvent
from kubedevice.nvidia.config import Config, parse_config
from kubedevice.nvidia.fake import CONTROL_ENV, send_control
from kubedevice.nvidia.metrics import METRIC_PREFIX
from kubedevice.nvidia.runner import GpuPlugins

from .conftest import pod

GPU = "nvidia.com/gpu"


def _config(**sections: Any) -> Config:
    return parse_config({"version": "v1", **sections})


def _plugins(host: Any, dp_dir: Path, config: Config, **kw: Any) -> GpuPlugins:
    return GpuPlugins(config, host.nvml, device_plugin_dir=dp_dir, overrides=host.overrides(), **kw)


def _health(emu: Emulator, resource: str, device: str) -> str | None:
    status = emu.node().resources.get(resource)
    if status is None:
        return None
    return next((d.health for d in status.devices if d.id == device), None)


async def test_eight_gpus_allocate_with_nodes_and_env_and_recover_from_an_xid(
    emu: Emulator, dp_dir: Path, gpu_host: Any
) -> None:
    host = gpu_host("dgx-8gpu")
    gpus = host.nvml.machine.gpus
    cfg = _config(health={"quietPeriod": "200ms"})
    async with _plugins(host, dp_dir, cfg):
        status = await emu.wait_for_resource(GPU, allocatable=8, timeout=5)
        numa = {d.id: d.numa for d in status.devices}
        assert numa[gpus[0].info.uuid] == (0,)
        assert numa[gpus[7].info.uuid] == (1,)
        admitted = await emu.apply_pod(pod("train", GPU, 1))
        main = admitted.container("main")
        (uuid,) = main.devices[GPU]
        minor = next(g.info.minor for g in gpus if g.info.uuid == uuid)
        runtime = main.runtime
        assert runtime.envs == {"NVIDIA_VISIBLE_DEVICES": uuid}
        nodes = [d.host_path for d in runtime.devices]
        assert nodes[0] == f"/dev/nvidia{minor}"
        assert "/dev/nvidiactl" in nodes
        assert "/dev/nvidia-uvm" in nodes
        assert runtime.conflicts == ()

        host.nvml.inject(HealthEvent(EventKind.XID, uuid, 48))
        await emu.wait_until(lambda: _health(emu, GPU, uuid) == "Unhealthy", 1.0)
        assert emu.node().allocatable()[GPU] == 7
        # application XIDs change nothing; the quiet period passes and it is Healthy again
        await emu.wait_until(lambda: _health(emu, GPU, uuid) == "Healthy", 3.0)


@pytest.mark.parametrize(
    ("strategy", "check"),
    [
        (
            "volume-mounts",
            lambda rt, ids: (
                rt.envs == {"NVIDIA_VISIBLE_DEVICES": "/var/run/nvidia-container-devices"}
                and sorted(m.container_path for m in rt.mounts)
                == sorted(f"/var/run/nvidia-container-devices/{i}" for i in ids)
                and all(m.host_path == "/dev/null" and m.read_only for m in rt.mounts)
            ),
        ),
        (
            "cdi-cri",
            lambda rt, ids: (
                sorted(rt.cdi_devices) == sorted(f"nvidia.com/gpu={i}" for i in ids) and not rt.envs
            ),
        ),
        (
            "cdi-annotations",
            lambda rt, ids: (
                len(rt.annotations) == 1
                and next(iter(rt.annotations)).startswith("cdi.k8s.io/kubedevice-nvidia_")
                and sorted(next(iter(rt.annotations.values())).split(","))
                == sorted(f"nvidia.com/gpu={i}" for i in ids)
            ),
        ),
    ],
)
async def test_device_list_strategies(
    emu: Emulator, dp_dir: Path, gpu_host: Any, strategy: str, check: Any
) -> None:
    host = gpu_host("pcie-4gpu")
    cfg = _config(flags={"deviceListStrategy": strategy})
    async with _plugins(host, dp_dir, cfg):
        await emu.wait_for_resource(GPU, allocatable=4, timeout=5)
        main = (await emu.apply_pod(pod("p", GPU, 2))).container("main")
        ids = list(main.devices[GPU])
        assert check(main.runtime, ids), main.runtime
        assert len(main.runtime.devices) >= 3  # device nodes are always given


async def test_cdi_spec_names_every_gpu_by_uuid_and_index(
    emu: Emulator, dp_dir: Path, gpu_host: Any
) -> None:
    host = gpu_host("pcie-4gpu")
    lib = host.root / "driver" / "usr" / "lib" / "x86_64-linux-gnu"
    lib.mkdir(parents=True)
    (lib / "libcuda.so.570.124.06").write_text("elf")
    (lib / "libcuda.so.1").symlink_to("libcuda.so.570.124.06")
    (lib / "libnvidia-ml.so.1").symlink_to("/etc/passwd")  # leads out of the driver root
    cfg = _config(flags={"deviceListStrategy": "cdi-cri", "hostDriverRoot": "/run/nvidia/driver"})
    async with _plugins(host, dp_dir, cfg):
        await emu.wait_for_resource(GPU, allocatable=4, timeout=5)
        spec = json.loads((host.cdi / "kubedevice-nvidia.json").read_text())
    assert spec["kind"] == "nvidia.com/gpu"
    assert spec["cdiVersion"] == "0.5.0"
    names = [d["name"] for d in spec["devices"]]
    uuids = [g.info.uuid for g in host.nvml.machine.gpus]
    assert names == [n for u, i in zip(uuids, range(4), strict=True) for n in (u, str(i))]
    first = spec["devices"][0]["containerEdits"]["deviceNodes"]
    assert [n["path"] for n in first] == ["/dev/nvidia0"]
    common = spec["containerEdits"]
    assert {n["path"] for n in common["deviceNodes"]} >= {"/dev/nvidiactl", "/dev/nvidia-uvm"}
    mounts = {m["containerPath"]: m["hostPath"] for m in common["mounts"]}
    assert mounts == {
        "/usr/lib/x86_64-linux-gnu/libcuda.so.1": (
            "/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libcuda.so.1"
        ),
        "/usr/lib/x86_64-linux-gnu/libcuda.so.570.124.06": (
            "/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libcuda.so.570.124.06"
        ),
        # also where a Fedora/RHEL/UBI image's loader looks
        "/usr/lib64/libcuda.so.1": "/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libcuda.so.1",
        "/usr/lib64/libcuda.so.570.124.06": (
            "/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libcuda.so.570.124.06"
        ),
    }


async def test_time_slicing_replicas_renamed_and_requests_over_one_refused(
    emu: Emulator, dp_dir: Path, gpu_host: Any
) -> None:
    host = gpu_host("pcie-4gpu")
    cfg = _config(
        sharing={
            "timeSlicing": {
                "renameByDefault": True,
                "failRequestsGreaterThanOne": True,
                "resources": [{"name": GPU, "replicas": 4}],
            }
        }
    )
    shared = "nvidia.com/gpu.shared"
    async with _plugins(host, dp_dir, cfg) as plugins:
        status = await emu.wait_for_resource(shared, allocatable=16, timeout=5)
        assert plugins.resources == [shared]
        assert all("::" in d.id for d in status.devices)
        one = (await emu.apply_pod(pod("one", shared, 1))).container("main")
        (replica,) = one.devices[shared]
        assert one.runtime.envs["NVIDIA_VISIBLE_DEVICES"] == replica.split("::")[0]
        with pytest.raises(AdmissionError, match="failRequestsGreaterThanOne"):
            await emu.apply_pod(pod("two", shared, 2))


async def test_replicas_spread_without_refusal(emu: Emulator, dp_dir: Path, gpu_host: Any) -> None:
    host = gpu_host("pcie-4gpu")
    cfg = _config(sharing={"timeSlicing": {"resources": [{"name": GPU, "replicas": 2}]}})
    async with _plugins(host, dp_dir, cfg):
        await emu.wait_for_resource(GPU, allocatable=8, timeout=5)
        main = (await emu.apply_pod(pod("two", GPU, 2))).container("main")
        gpus = {i.split("::")[0] for i in main.devices[GPU]}
        assert len(gpus) == 2  # two replicas on two different GPUs
        assert len(main.runtime.envs["NVIDIA_VISIBLE_DEVICES"].split(",")) == 2


async def test_one_replica_pods_spread_over_idle_gpus(
    emu: Emulator, dp_dir: Path, gpu_host: Any
) -> None:
    host = gpu_host("pcie-4gpu")
    cfg = _config(sharing={"timeSlicing": {"resources": [{"name": GPU, "replicas": 4}]}})
    async with _plugins(host, dp_dir, cfg):
        await emu.wait_for_resource(GPU, allocatable=16, timeout=5)
        gpus = []
        for n in range(4):
            main = (await emu.apply_pod(pod(f"p{n}", GPU, 1))).container("main")
            gpus.append(main.runtime.envs["NVIDIA_VISIBLE_DEVICES"])
        assert len(set(gpus)) == 4  # one GPU each, none left idle


async def test_a_fake_machines_numa_nodes_reach_the_kubelet_without_a_sysfs(
    emu: Emulator, dp_dir: Path, gpu_host: Any
) -> None:
    host = gpu_host("mig-mixed")
    overrides = {**host.overrides(), "sys_root": str(host.root / "no-sys")}
    async with GpuPlugins(_config(), host.nvml, device_plugin_dir=dp_dir, overrides=overrides):
        status = await emu.wait_for_resource(GPU, allocatable=4, timeout=5)
    index = {g.info.uuid: g.info.index for g in host.nvml.machine.gpus}
    numa = {index[d.id]: d.numa for d in status.devices}
    assert numa == {0: (0,), 1: (0,), 2: (1,), 3: (1,)}  # the machine's own NUMA nodes


async def test_mig_mixed_serves_one_resource_per_profile(
    emu: Emulator, dp_dir: Path, gpu_host: Any
) -> None:
    host = gpu_host("mig-mixed")
    async with _plugins(host, dp_dir, _config(flags={"migStrategy": "mixed"})) as plugins:
        assert sorted(plugins.resources) == [
            GPU,
            "nvidia.com/mig-1g.18gb",
            "nvidia.com/mig-1g.35gb",
            "nvidia.com/mig-2g.35gb",
            "nvidia.com/mig-3g.71gb",
            "nvidia.com/mig-4g.71gb",
        ]
        await emu.wait_for_resource("nvidia.com/mig-1g.18gb", allocatable=4, timeout=5)
        await emu.wait_for_resource(GPU, allocatable=1, timeout=5)
        await emu.wait_for_resource("nvidia.com/mig-3g.71gb", allocatable=2, timeout=5)
        main = (await emu.apply_pod(pod("small", "nvidia.com/mig-3g.71gb", 1))).container("main")
        (mig_uuid,) = main.devices["nvidia.com/mig-3g.71gb"]
        assert mig_uuid.startswith("MIG-")
        nodes = [d.host_path for d in main.runtime.devices]
        assert any(n.startswith("/dev/nvidia-caps/nvidia-cap") for n in nodes)
        assert main.runtime.envs == {"NVIDIA_VISIBLE_DEVICES": mig_uuid}


async def test_mig_single_on_mixed_profiles_is_a_clear_error(dp_dir: Path, gpu_host: Any) -> None:
    host = gpu_host("mig-mixed")
    with pytest.raises(ConfigError, match="'single' needs every GPU MIG-enabled with one MIG"):
        async with _plugins(host, dp_dir, _config(flags={"migStrategy": "single"})):
            pass


async def test_reload_is_all_or_nothing(emu: Emulator, dp_dir: Path, gpu_host: Any) -> None:
    host = gpu_host("mig-mixed")
    async with _plugins(host, dp_dir, _config()) as plugins:
        await emu.wait_for_resource(GPU, allocatable=4, timeout=5)
        with pytest.raises(ConfigError, match="'single' needs"):
            await plugins.reload(_config(flags={"migStrategy": "single"}))
        assert plugins.resources == [GPU]  # the old config keeps running
        assert plugins.config.flags.mig_strategy == "none"
        await plugins.reload(_config(flags={"migStrategy": "mixed"}))
        await emu.wait_for_resource("nvidia.com/mig-2g.35gb", allocatable=2, timeout=5)
        await emu.wait_for_resource(GPU, allocatable=1, timeout=5)


async def test_reload_with_a_socket_name_clash_changes_nothing(
    emu: Emulator, dp_dir: Path, gpu_host: Any
) -> None:
    host = gpu_host("mig-mixed")
    mig3 = "nvidia.com/mig-3g.71gb"
    feature_file = host.features / "kubedevice-nvidia"
    mixed = {"migStrategy": "mixed"}
    async with _plugins(host, dp_dir, _config(flags=mixed)) as plugins:
        await emu.wait_for_resource(mig3, allocatable=2, timeout=5)
        before = feature_file.read_text()
        resources = list(plugins.resources)
        # nvidia.com-mig/3g.71gb is another resource, but its socket is mig-3g.71gb's
        clash = {
            "name": "nvidia.com/mig-1g.18gb",
            "replicas": 2,
            "rename": "nvidia.com-mig/3g.71gb",
        }
        bad = _config(flags=mixed, sharing={"timeSlicing": {"resources": [clash]}})
        with pytest.raises(ConfigError, match=r"socket name 'nvidia\.com-mig-3g\.71gb\.sock'"):
            await plugins.reload(bad)
        assert plugins.resources == resources
        assert plugins.config.sharing.time_slicing.resources == []
        assert feature_file.read_text() == before  # no gpu.replicas=2, no -SHARED
        main = (await emu.apply_pod(pod("small", mig3, 1))).container("main")
        assert main.devices[mig3][0].startswith("MIG-")  # mig-3g.71gb still served


async def test_reload_with_a_too_long_socket_path_keeps_serving_gpus(
    emu: Emulator, dp_dir: Path, gpu_host: Any
) -> None:
    host = gpu_host("pcie-4gpu")
    long_name = f"{'a' * 60}.example.com/{'g' * 60}"
    async with _plugins(host, dp_dir, _config()) as plugins:
        await emu.wait_for_resource(GPU, allocatable=4, timeout=5)
        renamed = {"name": GPU, "replicas": 2, "rename": long_name}
        with pytest.raises(
            ConfigError,
            match=r"^sharing\.timeSlicing: nvidia\.com/gpu would be advertised as a+\.example"
            r"\.com/g+, whose socket path .* is longer than 107 bytes",
        ):
            await plugins.reload(_config(sharing={"timeSlicing": {"resources": [renamed]}}))
        assert plugins.resources == [GPU]
        assert plugins.server.resource_names == (GPU,)
        main = (await emu.apply_pod(pod("one", GPU, 1))).container("main")
        assert main.devices[GPU][0].startswith("GPU-")


async def test_reload_undone_when_the_cdi_spec_cannot_be_written(
    emu: Emulator, dp_dir: Path, gpu_host: Any
) -> None:
    host = gpu_host("pcie-4gpu")
    blocker = host.root / "cdi-blocker"
    blocker.write_text("")
    overrides = {k: v for k, v in host.overrides().items() if k != "cdi_dir"}
    async with GpuPlugins(_config(), host.nvml, device_plugin_dir=dp_dir, overrides=overrides) as (
        plugins
    ):
        await emu.wait_for_resource(GPU, allocatable=4, timeout=5)
        shared = {"renameByDefault": True, "resources": [{"name": GPU, "replicas": 2}]}
        bad = _config(
            flags={"deviceListStrategy": "cdi-cri", "cdiDir": str(blocker / "cdi")},
            sharing={"timeSlicing": shared},
        )
        with pytest.raises(ConfigError, match="cannot write the CDI spec"):
            await plugins.reload(bad)
        assert plugins.server.resource_names == (GPU,)  # gpu.shared was added, then undone
        assert plugins.resources == [GPU]
        main = (await emu.apply_pod(pod("one", GPU, 1))).container("main")
        assert main.runtime.envs["NVIDIA_VISIBLE_DEVICES"].startswith("GPU-")


async def test_no_driver_fails_or_serves_zero_gpus(
    emu: Emulator, dp_dir: Path, gpu_host: Any
) -> None:
    host = gpu_host("no-driver")
    with pytest.raises(NvmlError, match="DriverNotLoaded"):
        async with _plugins(host, dp_dir, _config()):
            pass
    cfg = _config(flags={"failOnInitError": False})
    async with _plugins(host, dp_dir, cfg) as plugins:
        status = await emu.wait_for_resource(GPU, timeout=5)
        assert status.capacity == 0
        assert plugins._monitor is None  # no event thread, nothing spinning


async def test_four_gpu_pod_gets_the_best_nvlink_clique(
    emu: Emulator, dp_dir: Path, gpu_host: Any
) -> None:
    host = gpu_host("dgx-8gpu")
    index = {g.info.uuid: g.info.index for g in host.nvml.machine.gpus}
    async with _plugins(host, dp_dir, _config()):
        await emu.wait_for_resource(GPU, allocatable=8, timeout=5)
        first = (await emu.apply_pod(pod("a", GPU, 4))).container("main")
        # GPUs 0-3: a full-strength NVLink clique (4-7 has degraded links)
        assert sorted(index[u] for u in first.devices[GPU]) == [0, 1, 2, 3]
        second = (await emu.apply_pod(pod("b", GPU, 2))).container("main")
        # of what is left, a pair with 18 links (not 5-6: 6 links, nor 4-7: 12)
        assert sorted(index[u] for u in second.devices[GPU]) in ([4, 5], [4, 6], [5, 7], [6, 7])


async def test_node_labels_written_and_updated_on_reload(
    emu: Emulator, dp_dir: Path, gpu_host: Any
) -> None:
    host = gpu_host("dgx-8gpu")
    feature_file = host.features / "kubedevice-nvidia"
    async with _plugins(host, dp_dir, _config()) as plugins:
        await emu.wait_for_resource(GPU, allocatable=8, timeout=5)
        labels = _labels(feature_file)
        assert labels["nvidia.com/gpu.count"] == "8"
        assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
        assert labels["nvidia.com/gpu.compute.major"] == "9"
        assert labels["nvidia.com/gpu.replicas"] == "1"
        await plugins.reload(
            _config(sharing={"timeSlicing": {"resources": [{"name": GPU, "replicas": 3}]}})
        )
        labels = _labels(feature_file)
        assert labels["nvidia.com/gpu.replicas"] == "3"
        assert labels["nvidia.com/gpu.sharing-strategy"] == "time-slicing"


def _labels(path: Path) -> dict[str, str]:
    lines = [line for line in path.read_text().splitlines() if not line.startswith("#")]
    return dict(line.split("=", 1) for line in lines)


async def test_metrics_carry_the_pods_labels_health_and_xids(
    dp_dir: Path, sock_dir: Path, gpu_host: Any
) -> None:
    host = gpu_host("dgx-8gpu")
    async with Emulator(dp_dir, control_socket=False) as emu:
        overrides = {**host.overrides(), "pod_resources_socket": str(emu.pod_resources_socket)}
        cfg = _config(health={"quietPeriod": "1h"})
        plugins = GpuPlugins(
            cfg,
            host.nvml,
            device_plugin_dir=dp_dir,
            overrides=overrides,
            metrics_address="127.0.0.1:0",
        )
        async with plugins:
            await emu.wait_for_resource(GPU, allocatable=8, timeout=5)
            main = (await emu.apply_pod(pod("train", GPU, 1))).container("main")
            (uuid,) = main.devices[GPU]
            index = next(g.info.index for g in host.nvml.machine.gpus if g.info.uuid == uuid)
            host.nvml.set_sample(uuid, utilization_gpu=77)
            host.nvml.inject(HealthEvent(EventKind.XID, uuid, 48))
            await emu.wait_until(lambda: _health(emu, GPU, uuid) == "Unhealthy", 1.0)
            url = plugins.metrics_url
            assert url is not None
            text = await asyncio.to_thread(_scrape, url)
    held = f'container="main",gpu="{index}",namespace="default",pod="train",uuid="{uuid}"'
    util = [line for line in text.splitlines() if line.startswith("kubedevice_nvidia_gpu_util")]
    assert any(held in line and line.endswith(" 77.0") for line in util), util
    health = [
        line for line in text.splitlines() if line.startswith("kubedevice_nvidia_gpu_healthy")
    ]
    assert any(held in line and line.endswith(" 0.0") for line in health), health
    assert sum(line.endswith(" 1.0") for line in health) == 7
    assert f'kubedevice_nvidia_gpu_xid_errors_total{{uuid="{uuid}",xid="48"}} 1.0' in text or any(
        "xid_errors_total" in line and uuid in line and 'xid="48"' in line
        for line in text.splitlines()
    )


async def test_metrics_answer_200_after_control_messages_of_the_wrong_types(
    dp_dir: Path, sock_dir: Path, gpu_host: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    ctl = sock_dir / "nvml.sock"
    monkeypatch.setenv(CONTROL_ENV, str(ctl))
    host = gpu_host("pcie-4gpu")
    u = [g.info.uuid for g in host.nvml.machine.gpus]
    async with Emulator(dp_dir, control_socket=False) as emu:
        overrides = {**host.overrides(), "pod_resources_socket": str(emu.pod_resources_socket)}
        plugins = GpuPlugins(
            _config(health={"quietPeriod": "1h"}),
            host.nvml,
            device_plugin_dir=dp_dir,
            overrides=overrides,
            metrics_address="127.0.0.1:0",
        )
        async with plugins:
            await emu.wait_for_resource(GPU, allocatable=4, timeout=5)
            main = (await emu.apply_pod(pod("held", GPU, 1))).container("main")
            (held,) = main.devices[GPU]
            for values in (
                {"utilization_gpu": "busy"},
                {"memory_used": -1},
                {"power_mw": 10**30},
                {"temperature_c": 1.5},
                {"processes": [{"pid": "x"}]},
                {"processes": "all"},
                {"remapped_rows_pending": 3},
                {"no_such_field": 1},
            ):
                send_control(ctl, {"op": "sample", "uuid": held, "values": values})
            send_control(ctl, {"op": "xid", "uuid": held, "xid": "48"})
            send_control(ctl, {"op": "sample", "uuid": held, "values": ["utilization_gpu"]})
            send_control(ctl, {"op": "sample", "uuid": held, "values": {"utilization_gpu": 61}})
            victim = next(x for x in u if x != held)
            send_control(ctl, {"op": "xid", "uuid": victim, "xid": 48})  # after all the others
            await emu.wait_until(lambda: _health(emu, GPU, victim) == "Unhealthy", 5.0)
            url = plugins.metrics_url
            assert url is not None
            status, text = await asyncio.to_thread(_get, url)
            assert _health(emu, GPU, held) == "Healthy"  # the bad xid did nothing
    assert status == 200
    lines = text.splitlines()
    util = [line for line in lines if line.startswith(f"{METRIC_PREFIX}_utilization_percent")]
    assert any(f'uuid="{held}"' in line and line.endswith(" 61.0") for line in util), util
    assert any("xid_errors" in line and victim in line for line in lines)


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def _scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return resp.read().decode()  # type: ignore[no-any-return]


async def test_unwritable_labels_dir_is_logged_and_gpus_still_served(
    emu: Emulator, dp_dir: Path, gpu_host: Any, caplog: pytest.LogCaptureFixture
) -> None:
    host = gpu_host("pcie-4gpu")
    blocker = host.root / "not-a-dir"
    blocker.write_text("")
    overrides = {**host.overrides(), "features_dir": str(blocker / "features.d")}
    plugins = GpuPlugins(_config(), host.nvml, device_plugin_dir=dp_dir, overrides=overrides)
    async with plugins:
        await emu.wait_for_resource(GPU, allocatable=4, timeout=5)
    assert any("node labels not written" in r.getMessage() for r in caplog.records)


async def test_labels_removed_when_switched_off_or_without_nvml(
    emu: Emulator, dp_dir: Path, gpu_host: Any
) -> None:
    host = gpu_host("pcie-4gpu")
    feature_file = host.features / "kubedevice-nvidia"
    async with _plugins(host, dp_dir, _config()) as plugins:
        await emu.wait_for_resource(GPU, allocatable=4, timeout=5)
        assert feature_file.exists()
        await plugins.reload(_config(flags={"featuresDir": None}))
        assert plugins.config.flags.features_dir == str(host.features)  # the CLI flag wins
        assert feature_file.exists()
    # a stale file of an earlier run disappears when NVML does not start
    nodriver = gpu_host("no-driver")
    overrides = {**nodriver.overrides(), "features_dir": str(host.features)}
    cfg = _config(flags={"failOnInitError": False})
    async with GpuPlugins(cfg, nodriver.nvml, device_plugin_dir=dp_dir, overrides=overrides):
        assert not feature_file.exists()  # removed during start-up, before serving


async def test_fifos_at_the_feature_file_and_cdi_spec_never_block(
    emu: Emulator, dp_dir: Path, gpu_host: Any
) -> None:
    host = gpu_host("pcie-4gpu")
    host.features.mkdir()
    host.cdi.mkdir()
    os.mkfifo(host.features / "kubedevice-nvidia")
    os.mkfifo(host.cdi / "kubedevice-nvidia.json")
    cfg = _config(flags={"deviceListStrategy": "cdi-cri"})
    async with asyncio.timeout(30):  # a guard: on a blocking open the start never returns
        async with _plugins(host, dp_dir, cfg):
            await emu.wait_for_resource(GPU, allocatable=4, timeout=5)
    assert "nvidia.com/gpu.count=4" in (host.features / "kubedevice-nvidia").read_text()
    assert json.loads((host.cdi / "kubedevice-nvidia.json").read_text())["devices"]


async def test_labels_describe_nvidia_com_gpu_itself(
    emu: Emulator, dp_dir: Path, gpu_host: Any
) -> None:
    host = gpu_host("mig-mixed")
    feature_file = host.features / "kubedevice-nvidia"
    mixed = {"migStrategy": "mixed"}
    for profile in ("nvidia.com/mig-1g.18gb", "nvidia.com/mig-7g.141gb"):  # one is not here
        sharing = {"timeSlicing": {"resources": [{"name": profile, "replicas": 2}]}}
        async with _plugins(host, dp_dir, _config(flags=mixed, sharing=sharing)):
            await emu.wait_for_resource(GPU, allocatable=1, timeout=5)
            labels = _labels(feature_file)
        assert labels["nvidia.com/gpu.replicas"] == "1"
        assert labels["nvidia.com/gpu.sharing-strategy"] == "none"
        assert not labels["nvidia.com/gpu.product"].endswith("-SHARED")
    assert labels["nvidia.com/mig-1g.18gb.replicas"] == "1"
    sharing = {"timeSlicing": {"resources": [{"name": "nvidia.com/mig-1g.18gb", "replicas": 2}]}}
    async with _plugins(host, dp_dir, _config(flags=mixed, sharing=sharing)):
        labels = _labels(feature_file)
    assert labels["nvidia.com/mig-1g.18gb.replicas"] == "2"
    assert labels["nvidia.com/mig-1g.18gb.sharing-strategy"] == "time-slicing"
    assert labels["nvidia.com/mig-3g.71gb.replicas"] == "1"


async def test_labels_follow_a_reloaded_features_dir(
    emu: Emulator, dp_dir: Path, gpu_host: Any, tmp_path: Path
) -> None:
    host = gpu_host("pcie-4gpu")
    overrides = {k: v for k, v in host.overrides().items() if k != "features_dir"}
    first, second = tmp_path / "nfd-a", tmp_path / "nfd-b"
    cfg = _config(flags={"featuresDir": str(first)})
    async with GpuPlugins(cfg, host.nvml, device_plugin_dir=dp_dir, overrides=overrides) as p:
        await emu.wait_for_resource(GPU, allocatable=4, timeout=5)
        assert (first / "kubedevice-nvidia").exists()
        await p.reload(_config(flags={"featuresDir": str(second)}))
        assert not (first / "kubedevice-nvidia").exists()
        assert (second / "kubedevice-nvidia").exists()
        await p.reload(_config(flags={"featuresDir": None}))
        assert not (second / "kubedevice-nvidia").exists()


async def test_reload_asks_nvml_for_the_topology_only_when_sys_root_changes(
    emu: Emulator, dp_dir: Path, gpu_host: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    host = gpu_host("dgx-8gpu")
    index = {g.info.uuid: g.info.index for g in host.nvml.machine.gpus}
    asked: list[tuple[str, str]] = []
    link = host.nvml.link

    def counting_link(a: str, b: str) -> Any:
        asked.append((a, b))
        return link(a, b)

    monkeypatch.setattr(host.nvml, "link", counting_link)
    async with _plugins(host, dp_dir, _config()) as plugins:
        await emu.wait_for_resource(GPU, allocatable=8, timeout=5)
        assert len(asked) == 28  # every pair of 8 GPUs, once
        await plugins.reload(_config(health={"quietPeriod": "200ms"}))
        assert plugins.config.health.quiet_period == 0.2
        assert len(asked) == 28  # the GPUs did not change: NVML is not asked again
        # the kept topology still steers allocation to the NVLink clique
        first = (await emu.apply_pod(pod("a", GPU, 4))).container("main")
        assert sorted(index[u] for u in first.devices[GPU]) == [0, 1, 2, 3]

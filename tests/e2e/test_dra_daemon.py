"""The DRA drivers' daemon side on the real API server, controller-manager and kubelet:
one instance per node, a Node created again, slice names across drivers and nodes, SIGHUP."""

from __future__ import annotations

import contextlib
import signal
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client

from .cluster import Cluster, wait_for
from .dra import (
    REGISTERED,
    GenericDra,
    claim_pod,
    claim_spec,
    create_template,
    device_class,
    log_count,
    release,
    request,
    resource_api,
    run_claim_pod,
    wait_file,
    wait_slices,
)

pytestmark = pytest.mark.timeout(360)

CONFIG = """\
version: v1
resources:
  - name: example.com/e2e
    groups:
      - name: e2e
        paths:
          - path: /dev/e2e*
"""


@pytest.fixture
def dev_dra(cluster: Cluster, ns: str) -> Iterator[Callable[..., GenericDra]]:
    made: list[GenericDra] = []

    def make(*nodes: str, start: bool = True, **kwargs: Any) -> GenericDra:
        d = GenericDra(cluster, kwargs.pop("config", CONFIG), **kwargs)
        made.append(d)
        for node in nodes:
            d.host.add_char_device(node)
        if start:
            d.start()
        return d

    yield make
    release(cluster, ns, [d for d in made if d.process.alive()])
    for d in made:
        d.close()


@contextlib.contextmanager
def a_node(cluster: Cluster, name: str) -> Iterator[str]:
    """A Node object without a kubelet (a driver may publish for it); deleted afterwards."""
    cluster.core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
    try:
        yield name
    finally:
        with contextlib.suppress(client.ApiException):
            cluster.core.delete_node(name)


def _slices(cluster: Cluster, driver: str, node: str) -> list[Any]:
    return [
        s
        for s in resource_api(cluster)
        .list_resource_slice(field_selector=f"spec.driver={driver}")
        .items
        if s.spec.node_name == node
    ]


def test_a_second_instance_refuses_to_start_and_the_first_keeps_serving(
    cluster: Cluster, ns: str, dev_dra: Callable[..., GenericDra]
) -> None:
    first = dev_dra("/dev/e2e0")
    wait_slices(cluster, first.driver, lambda n: len(n) == 1, "1 device")
    second = dev_dra("/dev/e2e0", "/dev/e2e1", start=False)  # the same driver, the same node
    second.start(wait=False)
    assert second.process.popen is not None
    code = second.process.popen.wait(60)
    assert code == 2
    lock = cluster.kubelet.root / "plugins" / first.driver / "driver.lock"  # type: ignore[union-attr]
    [line] = [ln for ln in second.log.read_text().splitlines() if ln.startswith("error:")]
    assert line.startswith(
        f"error: another instance of DRA driver {first.driver} is running on this node: "
        f"it holds {lock} (pid {first.process.pid}"
    ), line
    assert log_count(second.log, REGISTERED) == 0
    # the first still serves: a pod with a claim runs, its slices are as they were
    first.process.check_alive()
    assert wait_slices(cluster, first.driver, lambda n: len(n) == 1, "still 1 device")
    is_e2e = f'device.driver == "{first.driver}"'
    with device_class(cluster, is_e2e) as cls:
        create_template(cluster, ns, "one", claim_spec(request("dev", cls)))
        run_claim_pod(cluster, ns, claim_pod("p", template="one"))


def test_slices_follow_a_node_deleted_and_created_again(
    cluster: Cluster, dev_dra: Callable[..., GenericDra]
) -> None:
    """The real garbage collector deletes slices owned by a Node's old UID; the driver
    publishes them again owned by the new one."""
    name = f"kd-again-{uuid.uuid4().hex[:6]}"
    driver = f"again-{uuid.uuid4().hex[:4]}.example.com"
    with a_node(cluster, name):
        old_uid = cluster.core.read_node(name).metadata.uid
        dev_dra("/dev/e2e0", driver=driver, node=name)
        wait_for(
            resource_api(cluster).list_resource_slice,
            lambda _s: any(
                o.uid == old_uid
                for s in _slices(cluster, driver, name)
                for o in s.metadata.owner_references or []
            ),
            60,
            "a slice owned by the Node",
        )
        cluster.core.delete_node(name)
        cluster.core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
        new_uid = cluster.core.read_node(name).metadata.uid
        assert new_uid != old_uid

        def owned_by_new(_s: object) -> bool:
            slices = _slices(cluster, driver, name)
            return bool(slices) and all(
                [o.uid for o in s.metadata.owner_references or []] == [new_uid] for s in slices
            )

        # the GC deletes the old slices; the driver's next check (30 s) publishes again
        wait_for(
            resource_api(cluster).list_resource_slice,
            owned_by_new,
            120,
            "the slices owned by the new Node",
        )


def test_slice_names_of_two_drivers_on_two_nodes_never_collide(
    cluster: Cluster, dev_dra: Callable[..., GenericDra]
) -> None:
    base = f"dgx{uuid.uuid4().hex[:5]}"
    # "<node>-<driver>": the same text for both pairs
    pairs = [(base, "a100-gpu.example.com"), (f"{base}-a100", "gpu.example.com")]
    with a_node(cluster, pairs[0][0]), a_node(cluster, pairs[1][0]):
        for node, driver in pairs:
            dev_dra("/dev/e2e0", driver=driver, node=node)
        for node, driver in pairs:
            wait_for(
                resource_api(cluster).list_resource_slice,
                lambda _s, n=node, d=driver: len(_slices(cluster, d, n)) == 1,
                60,
                f"the pool of {driver} on {node}",
            )
        names = {_slices(cluster, d, n)[0].metadata.name for n, d in pairs}
        assert len(names) == 2


def test_sighup_reloads_the_config_all_or_nothing(
    cluster: Cluster, dev_dra: Callable[..., GenericDra]
) -> None:
    drv = dev_dra("/dev/e2e0", "/dev/other0")
    wait_slices(cluster, drv.driver, lambda n: len(n) == 1, "1 device")
    pid = drv.process.pid
    # a bad config: one error line, the driver keeps serving what it had
    drv.config.write_text("version: v1\nresources:\n  - name: example.com/e2e\n    groups: []\n")
    drv.process.popen.send_signal(signal.SIGHUP)  # type: ignore[union-attr]
    wait_file(drv.log, lambda p: log_count(p, "SIGHUP: the config is not reloaded") == 1, 30)
    assert "resources[0].groups" in drv.log.read_text().split("SIGHUP: the config is not")[1]
    drv.process.check_alive()
    # a good one: the new devices are published, the same process goes on
    registered = log_count(drv.log, REGISTERED)
    drv.config.write_text(
        CONFIG + "  - name: example.com/other\n    groups:\n      - name: other\n"
        "        paths:\n          - path: /dev/other*\n"
    )
    drv.process.popen.send_signal(signal.SIGHUP)  # type: ignore[union-attr]
    wait_slices(cluster, drv.driver, lambda n: len(n) == 2, "2 devices after the reload")
    drv.wait_registered(registered + 1)
    drv.process.check_alive()
    assert drv.process.pid == pid
    assert drv.stop() == 0  # and it still stops cleanly

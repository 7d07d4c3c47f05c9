"""The rolling-upgrade cut-off scenario of ``test_cutoff.py`` (two driver instances, A and
B, in one process), run as a program of its own: its event loop is the only one the process
ever has, as in a driver.

gRPC's asyncio stack keeps one completion queue and one poller thread for the whole process
and binds every event loop that ever used it; a pytest process makes a loop per test. Run
inside pytest after other gRPC tests, about 1 run of this scenario in 11 lost gRPC's
completions on the test's loop (the loop idle in epoll, neither the server's answer nor
the client's own 20 s deadline delivered) until pytest's 60 s timeout; 0 in 30 runs with
a single loop. Arguments: kubelet dir, kubeconfig, node, claim namespace, name, UID.
Exit 0: every check held; else the failed check's traceback."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from dra import clients
from dra.fakes import gpus, server
from dra.test_cutoff import CUT, UID_A, UID_B, _cut_off, _Held, _still_waiting


async def main(kdir: Path, kubeconfig: Path, node_name: str, ref: tuple[str, str, str]) -> None:
    uid = ref[2]
    a_driver, b_driver = _Held(gpus(2)), _Held(gpus(2))
    a_driver.holds = 1
    async with (
        server(a_driver, kdir, kubeconfig, node_name, pod_uid=UID_A) as a,
        server(b_driver, kdir, kubeconfig, node_name, pod_uid=UID_B) as b,
    ):
        first = asyncio.ensure_future(clients.prepare(a.settings.dra_socket, [ref], timeout=CUT))
        await asyncio.wait_for(a_driver.entered.wait(), 10)
        await _cut_off(first)
        retry = asyncio.ensure_future(clients.prepare(b.settings.dra_socket, [ref], timeout=20))
        assert await _still_waiting(retry), "B did not wait for A's cut-off hook"
        a_driver.gate.set()
        assert (await retry).claims[uid].error == ""
        assert b_driver.prepared == []  # answered from A's record
        assert b_driver.unprepared == []
        assert a_driver.unprepared == []
        assert b.claims is not None
        assert [dict(d) for d in b.claims.checkpoint.claims[uid].data] == [{"by": "hook"}]


if __name__ == "__main__":
    kdir, kubeconfig, node, ns, name, uid = sys.argv[1:7]
    asyncio.run(main(Path(kdir), Path(kubeconfig), node, (ns, name, uid)))
    print("ok")

"""The harness's own process handling (no cluster needed)."""

from __future__ import annotations

import os
from pathlib import Path

from .cluster import Process, tail_since

_forks: list[int] = []
_watching = [False]


def _before_fork() -> None:
    if _watching[0]:
        _forks.append(os.getpid())


os.register_at_fork(before=_before_fork)


def test_a_process_starts_without_running_fork_handlers(tmp_path: Path) -> None:
    # Forking with at-fork handlers (a preexec_fn makes Python fork instead of vfork) runs
    # gRPC's too when this process has used gRPC: they restarted an event-engine poller in the
    # child, which then hung before exec now and then (a plugin, or the kubelet, never started).
    p = Process("true", ["true"], tmp_path / "true.log", tmp_path / "cwd")
    _watching[0] = True
    try:
        p.start()
    finally:
        _watching[0] = False
    assert p.popen is not None
    assert p.popen.wait(timeout=30) == 0
    assert _forks == []


def test_a_process_runs_in_its_own_directory(tmp_path: Path) -> None:
    p = Process("pwd", ["pwd"], tmp_path / "pwd.log", tmp_path / "own")
    p.start()
    assert p.popen is not None
    assert p.popen.wait(timeout=30) == 0
    assert (tmp_path / "pwd.log").read_text().splitlines()[-1] == str(tmp_path / "own")


def test_tail_since_shows_only_what_came_after_the_mark(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_text("old 1\nold 2\n")
    mark = log.stat().st_size
    assert tail_since(log, mark) == ""
    with log.open("a") as f:
        f.write("new 1\nnew 2\nnew 3\n")
    assert tail_since(log, mark) == "new 1\nnew 2\nnew 3"
    assert tail_since(log, mark, lines=2) == "new 2\nnew 3"

"""kubedevice.ports.free_port: ports no outgoing connection can take between pick and bind."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from kubedevice import ports


def test_ports_come_from_outside_the_ephemeral_range_and_are_bindable() -> None:
    low, high = ports.ephemeral_range()
    picked = [ports.free_port() for _ in range(200)]
    assert len(set(picked)) == len(picked), "a port was handed out twice"
    assert all(not low <= p <= high for p in picked)
    for p in picked[:20]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))  # raises if it was not free


def test_a_held_or_already_handed_out_port_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    first = ports.free_port()
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        taken = held.getsockname()[1]
        spare = ports.free_port()
        draws = iter([taken, first, spare])
        monkeypatch.setattr(ports.random, "randint", lambda a, b: next(draws))
        monkeypatch.setattr(ports, "_handed_out", {first})
        assert ports.free_port(ephemeral=(60000, 60999)) == spare


def test_no_gap_outside_the_range_falls_back_to_a_kernel_pick() -> None:
    p = ports.free_port(ephemeral=(1024, 65535))
    with socket.socket() as s:
        s.bind(("127.0.0.1", p))


@pytest.mark.parametrize("text", ["", "garbage", "70000 80000", "5 3", "\xff"])
def test_an_unreadable_range_file_means_the_linux_default(tmp_path: Path, text: str) -> None:
    f = tmp_path / "range"
    f.write_text(text)
    assert ports.ephemeral_range(f) == (32768, 60999)
    assert ports.ephemeral_range(tmp_path / "missing") == (32768, 60999)


def test_the_range_file_is_read() -> None:
    f = Path("/proc/sys/net/ipv4/ip_local_port_range")
    if not f.exists():
        pytest.skip("no /proc/sys/net/ipv4/ip_local_port_range on this system")
    low, high = (int(x) for x in f.read_text().split())
    assert ports.ephemeral_range() == (low, high)

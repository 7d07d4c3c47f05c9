"""``kubedevice run`` / ``kubedevice validate`` as real subprocesses."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Any

import yaml

from generic.gen_kubelet import KubeletDouble
from kubedevice.generic import FakeHost

KUBEDEVICE = [str(Path(sys.executable).parent / "kubedevice")]
ROOT = Path(__file__).resolve().parents[2]


async def _exec(*args: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        *KUBEDEVICE, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode is not None
    return proc.returncode, out.decode()


def _doc(host: FakeHost, path: str) -> dict[str, Any]:
    return {
        "version": "v1",
        "devRoot": str(host.dev_root),
        "sysRoot": str(host.sys_root),
        "resources": [{"name": "example.com/serial", "groups": [{"paths": [{"path": path}]}]}],
    }


async def test_run_with_bad_config_exits_nonzero_naming_the_field(
    host: FakeHost, sock_dir: Path
) -> None:
    bad = host.root / "bad.yaml"
    bad.write_text(
        "version: v1\nresources:\n  - name: example.com/x\n    groups:\n"
        "      - paths: [{path: /dev/x}]\n        count: 0\n"
    )
    code, out = await _exec("run", "--config", str(bad), "--device-plugin-dir", str(sock_dir))
    assert code == 2
    assert f"{bad}: resources[0].groups[0].count: must be >= 1 (got 0)" in out
    assert os.listdir(sock_dir) == []


async def test_validate(host: FakeHost) -> None:
    good = host.root / "good.yaml"
    good.write_text(yaml.safe_dump(_doc(host, "/dev/ttyUSB*")))
    code, out = await _exec("validate", str(good))
    assert (code, out.strip()) == (0, f"{good}: ok (1 resource(s): example.com/serial)")
    bad = host.root / "bad.yaml"
    bad.write_text("version: v1\nresources: []\nextra: 1\n")
    code, out = await _exec("validate", str(bad))
    assert code == 2
    assert out.strip().splitlines() == [
        f"error: {bad}: resources: must have at least 1 item(s) (got 0)",
        f"{bad}: extra: unknown key (allowed: devRoot, evictOn, keepUnhealthySeconds, resources, "
        "sysRoot, version)",
    ]


async def test_run_registers_reloads_on_sighup_and_exits_0_on_sigterm(
    host: FakeHost, kubelet: KubeletDouble, sock_dir: Path
) -> None:
    host.add_char_device("/dev/ttyUSB0")
    host.add_char_device("/dev/ttyACM0")
    # The config is a symlink to a file elsewhere: editing the target does not touch the
    # watched directory, so only SIGHUP can make the daemon notice.
    real_dir = host.root / "real"
    real_dir.mkdir()
    real = real_dir / "config.yaml"

    def doc(path: str) -> str:  # no devRoot/sysRoot: --dev-root/--sys-root give them
        d = _doc(host, path)
        del d["devRoot"], d["sysRoot"]
        return yaml.safe_dump(d)

    real.write_text(doc("/dev/ttyUSB*"))
    conf_dir = host.root / "conf"
    conf_dir.mkdir()
    (conf_dir / "config.yaml").symlink_to(real)
    proc = await asyncio.create_subprocess_exec(
        *KUBEDEVICE,
        "run",
        "--config",
        str(conf_dir / "config.yaml"),
        "--device-plugin-dir",
        str(sock_dir),
        "--dev-root",
        str(host.dev_root),
        "--sys-root",
        str(host.sys_root),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with asyncio.timeout(30):
            await kubelet.wait("example.com/serial", lambda s: s == {"ttyUSB0": "Healthy"})
            assert (sock_dir / "example.com-serial.sock").is_socket()
            assert (sock_dir / "example.com-serial.sock").stat().st_mode & 0o777 == 0o600
            real.write_text(doc("/dev/tty[UA]*"))
            proc.send_signal(signal.SIGHUP)
            await kubelet.wait("example.com/serial", lambda s: len(s) == 2)
            host.remove("/dev/ttyACM0")
            await kubelet.wait("example.com/serial", lambda s: s == {"ttyUSB0": "Healthy"})
            proc.send_signal(signal.SIGTERM)
            assert await proc.wait() == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.stderr is not None
    log = (await proc.stderr.read()).decode()
    assert "config reloaded" in log
    assert not (sock_dir / "example.com-serial.sock").exists()


async def test_run_with_bad_metrics_address_exits_2(host: FakeHost, sock_dir: Path) -> None:
    good = host.root / "good.yaml"
    good.write_text(yaml.safe_dump(_doc(host, "/dev/ttyUSB*")))
    code, out = await _exec(
        "run",
        "--config",
        str(good),
        "--device-plugin-dir",
        str(sock_dir),
        "--metrics-address",
        "localhost:http",
    )
    assert code == 2
    assert out.splitlines()[-1] == (
        "error: metrics address: expected HOST:PORT with a port 0-65535 (got 'localhost:http')"
    )
    assert "Traceback" not in out


async def test_validate_huge_integer_is_one_line_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "big.yaml"
    bad.write_text(
        "version: v1\nresources:\n- name: example.com/x\n  groups:\n"
        f"  - paths: [{{path: /dev/x}}]\n    count: {'9' * 5000}\n"
    )
    code, out = await _exec("validate", str(bad))
    assert code == 2, out
    assert out == (
        f"error: {bad}: resources[0].groups[0].count: out of range (got an integer of "
        "5000 digits)\n"
    )


async def test_run_with_metrics_port_out_of_range_exits_2(host: FakeHost, sock_dir: Path) -> None:
    config = host.root / "c.yaml"
    config.write_text(yaml.safe_dump(_doc(host, "/dev/ttyUSB*")))
    code, out = await _exec(
        "run", "-c", str(config), "--device-plugin-dir", str(sock_dir),
        "--metrics-address", "127.0.0.1:99999",
    )  # fmt: skip
    assert code == 2, out
    assert "Traceback" not in out
    assert "127.0.0.1:99999" in out
    assert "port" in out
    assert os.listdir(sock_dir) == []

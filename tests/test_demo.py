"""`kubedevice demo` runs end to end as a real process: the README's main-job command."""

from __future__ import annotations

import subprocess
import sys


def test_demo_runs_every_step_and_exits_zero() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "kubedevice", "--log-level", "warning", "demo"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    # capacity shown, pods admitted and one rejected with the kubelet's reason
    assert "demo.kubedevice.io/serial  3         3" in out
    assert "pod/modem (1 x demo.kubedevice.io/serial) admitted" in out
    assert "pod/greedy (1 x demo.kubedevice.io/serial) REJECTED: UnexpectedAdmissionError" in out
    # unplug turns the allocated device Unhealthy; it comes back; restart re-registers
    assert "ttyUSB0  Unhealthy" in out
    assert "Healthy again after" in out
    assert "registered again after" in out
    # the runtime view and the clean stop
    assert "env     SERIAL_PORTS=/dev/ttyUSB0" in out
    assert "device  /dev/ttyUSB0 -> /dev/ttyUSB0 rw" in out
    assert "exit code 0; sockets left in the plugin dir: kubelet.sock" in out
    assert "demo finished in" in out

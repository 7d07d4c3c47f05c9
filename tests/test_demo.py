"""`kubedevice demo` runs end to end as a real process: the README's main-job command."""

from __future__ import annotations

import re
import subprocess
import sys

# a log line of the text format (the JSON format starts with '{"')
_LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\d[ T]\d\d:\d\d|\{\")|\b(INFO|WARNING|ERROR|DEBUG)\b")


def test_demo_runs_every_step_and_exits_zero() -> None:
    # as `make demo` runs it: default log level, stdout and stderr on one terminal
    proc = subprocess.run(
        [sys.executable, "-m", "kubedevice", "demo"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=60,
        check=False,
    )
    out = proc.stdout
    assert proc.returncode == 0, out
    # the narration owns the terminal: no log line interleaves with it
    assert [line for line in out.splitlines() if _LOG_LINE.search(line)] == []
    assert "log files: " in out
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


async def test_a_timed_out_step_names_the_time_it_waited() -> None:
    import asyncio

    import pytest

    from kubedevice.demo.generic import DemoError, DemoResult, timed

    result = DemoResult()
    # the step's own timeout (here 0.6 s), not the default STEP_TIMEOUT_S (10 s)
    with pytest.raises(DemoError) as err:
        await timed("nothing", asyncio.wait_for(asyncio.Event().wait(), 0.6), result)
    assert str(err.value) == "timed out after 1s waiting for: nothing"
    assert result.timings == {}

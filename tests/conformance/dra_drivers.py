"""Our DRA drivers as the DRA kit starts them, and the kit as a real process.

``k8s_bin()`` finds the Kubernetes binaries as the other tiers do (``$KUBEDEVICE_K8S_BIN``,
else ``../shared/k8s/unpack.sh``); without them a test is skipped with one line (with
``CI`` set it fails). Each driver command comes with the kit options it needs: the
generic driver and the GPU driver run on fake ``/dev`` trees, so ``--host-root`` names the
tree's root (the CDI specs' device nodes are found there).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from kubedevice.generic import FakeHost

ROOT = Path(__file__).resolve().parents[2]
KUBEDEVICE = str(Path(sys.executable).with_name("kubedevice"))
SUMMARY = re.compile(r"^(\d+) passed, (\d+) failed, (\d+) skipped", re.MULTILINE)
#: The templates every driver below takes (the kit fills them in).
COMMON = ["--node-name", "{node}", "--kubeconfig", "{kubeconfig}",
          "--kubelet-dir", "{kubelet_dir}", "--cdi-dir", "{cdi_dir}"]  # fmt: skip

GENERIC_CONFIG = """\
version: v1
resources:
  - name: example.com/kit
    groups:
      - name: kit
        paths:
          - path: /dev/kit*
"""


def k8s_bin() -> Path:
    """The Kubernetes binaries' directory (skips the test without them)."""
    from e2e.cluster import HOW_TO_GET, find_binaries

    found = find_binaries(ROOT)
    if found is None:
        if os.environ.get("CI"):
            pytest.fail(f"CI is set: {HOW_TO_GET}", pytrace=False)
        pytest.skip(HOW_TO_GET)
    return found


def generic(tmp: Path, devices: int = 10) -> tuple[list[str], list[str]]:
    """``kubedevice run --dra`` on a fake host: (kit options, driver command)."""
    host = FakeHost(tmp / "host")
    for i in range(devices):
        host.add_char_device(f"/dev/kit{i}")
    (tmp / "config.yaml").write_text(GENERIC_CONFIG)
    command = [KUBEDEVICE, "run", "--dra", "--config", str(tmp / "config.yaml"),
               "--dev-root", str(host.dev_root), "--sys-root", str(host.sys_root),
               "--pod-uid", "{pod_uid}", *COMMON]  # fmt: skip
    return ["--host-root", str(host.root)], command


def gpu(tmp: Path, machine: str = "dgx-8gpu") -> tuple[list[str], list[str]]:
    """``kubedevice nvidia dra`` on the fake NVML: (kit options, driver command)."""
    from kubedevice.nvidia.fake import FakeNvml, write_fake_dev, write_fake_sysfs

    nvml = FakeNvml.from_file(machine)
    write_fake_dev(nvml, tmp / "dev")
    write_fake_sysfs(nvml, tmp / "sys")
    nvml.close()
    (tmp / "gpu.yaml").write_text("version: v1\n")
    command = [KUBEDEVICE, "nvidia", "dra", "--config", str(tmp / "gpu.yaml"),
               "--nvml", f"fake:{machine}", "--dev-root", str(tmp / "dev"),
               "--sys-root", str(tmp / "sys"), "--pod-uid", "{pod_uid}", *COMMON]  # fmt: skip
    return ["--host-root", str(tmp)], command


def example() -> tuple[list[str], list[str]]:
    """examples/dra_minimal.py (its device nodes are /dev/null): (kit options, command)."""
    return (["--claim-config", '{"greeting": "hi"}'],
            [sys.executable, str(ROOT / "examples" / "dra_minimal.py"), *COMMON])  # fmt: skip


def run_kit(
    bin_dir: Path | None, kit: list[str], command: list[str], log: Path, timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    """``kubedevice conformance --dra [--k8s-bin BIN] --log LOG KIT... -- COMMAND`` as a real
    process (``bin_dir`` None: ``kit`` names the API server, ``--kubeconfig``).

    Past ``timeout`` the kit is interrupted (SIGINT: it stops the driver and its API server,
    SIGKILL 30 s later); its stderr then ends with a line that says so, after each case's
    line as it ended, so that :func:`explain` tells how far it got.
    """
    where = ["--k8s-bin", str(bin_dir)] if bin_dir is not None else []
    args = [KUBEDEVICE, "conformance", "--dra", *where, "--log", str(log), *kit, "--", *command]
    with subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          cwd=ROOT) as proc:  # fmt: skip
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)
            try:
                out, err = proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, err = proc.communicate()
            err += f"\n(the test interrupted the kit: it ran past {timeout:.0f} s)\n"
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


def explain(proc: subprocess.CompletedProcess[str], log: Path, lines: int = 30) -> str:
    """What a kit run that a test did not expect says: its exit status, every FAIL line (case
    ID and evidence), its stderr's last lines and the driver log's tail: a CI log that shows
    this says what broke."""
    failed = [line for line in proc.stdout.splitlines() if line.startswith("FAIL")]
    err = proc.stderr.splitlines()[-lines:]
    try:
        tail = log.read_text(errors="replace").splitlines()[-lines:]
    except OSError as exc:
        tail = [f"(no driver log: {exc})"]
    return "\n".join([
        f"kit exit status {proc.returncode}; {len(failed)} failed cases:", *failed,
        f"--- summary: {(SUMMARY.search(proc.stdout) or [''])[0] or '(no summary)'}",
        f"--- kit stderr, last {len(err)} lines:", *err,
        f"--- driver log ({log}), last {len(tail)} lines:", *tail,
    ])  # fmt: skip


def summary(out: str) -> tuple[int, int, int]:
    """(passed, failed, skipped) of a run's output."""
    m = SUMMARY.search(out)
    assert m is not None, out
    return int(m[1]), int(m[2]), int(m[3])


def rows(out: str) -> dict[str, tuple[str, str]]:
    """The table: case id -> (RESULT, EVIDENCE)."""
    table = {}
    for line in out.splitlines():
        parts = line.split(None, 3)
        if len(parts) >= 3 and parts[0] in ("PASS", "FAIL", "SKIP"):
            table[parts[2]] = (parts[0], parts[3] if len(parts) > 3 else "")
    return table

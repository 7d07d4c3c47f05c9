"""examples/dra_minimal.py as a real process: registration, slices, a prepared claim, SIGTERM.

docs/dra.md shows the example verbatim.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import signal
import subprocess
import sys
import textwrap
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
from dependencies import closure
from packaging.utils import canonicalize_name

from dra import clients
from dra.api import Api
from dra.conftest import create_claim, result
from dra.fakes import wait_for_path

pytestmark = pytest.mark.timeout(90)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "dra_minimal.py"
DRIVER = "counter.example.com"


def test_docs_embed_the_example_verbatim() -> None:
    doc = (ROOT / "docs" / "dra.md").read_text()
    code = EXAMPLE.read_text().split('"""', 2)[2].strip()
    assert "```python\n# examples/dra_minimal.py: python examples/dra_minimal.py " in doc
    assert code in doc


def _start(*args: str, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(EXAMPLE), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "NODE_NAME": "", **env},
    )


@pytest.fixture
def driver_process(kdir: Path, kubeconfig: Path, node_name: str) -> Iterator[subprocess.Popen]:
    proc = _start(
        "--node-name",
        node_name,
        "--kubeconfig",
        str(kubeconfig),
        "--kubelet-dir",
        str(kdir),
        "--cdi-dir",
        str(kdir / "cdi"),
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)


async def test_example_driver_end_to_end(
    driver_process: subprocess.Popen, kdir: Path, node_name: str, api: Api
) -> None:
    reg_sock = kdir / "plugins_registry" / f"{DRIVER}-reg.sock"
    await wait_for_path(reg_sock, timeout=30)
    info = await clients.register(reg_sock)
    assert info.endpoint == str(kdir / "plugins" / DRIVER / "dra.sock")
    api.wait_for_slices(DRIVER, node_name, devices=4)

    claim = create_claim(
        api,
        "default",
        f"ex-{node_name}",
        results=[result("gpu", DRIVER, node_name, "counter-2")],
        config=[
            {
                "source": "FromClass",
                "opaque": {"driver": DRIVER, "parameters": {"greeting": "from the class"}},
            },
            {
                "source": "FromClaim",
                "requests": ["gpu"],
                "opaque": {"driver": DRIVER, "parameters": {"greeting": "hi"}},
            },
        ],
    )
    uid = claim["metadata"]["uid"]
    answer = await clients.prepare(
        Path(info.endpoint), [("default", claim["metadata"]["name"], uid)]
    )
    assert answer.claims[uid].error == ""
    assert list(answer.claims[uid].devices[0].cdi_device_ids) == [
        f"k8s.{DRIVER}/claim={uid}-counter-2"
    ]
    spec = json.loads((kdir / "cdi" / f"k8s.{DRIVER}-claim_{uid}.json").read_text())
    assert spec["devices"][0]["containerEdits"]["env"] == ["COUNTER=2", "GREETING=hi"]

    driver_process.send_signal(signal.SIGTERM)
    output, _ = driver_process.communicate(timeout=30)
    assert driver_process.returncode == 0, output
    assert not reg_sock.exists()
    assert "Traceback" not in output


def _plain_install() -> set[str]:
    """The distributions ``pip install kubedevice`` installs (no extra)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {"kubedevice", *closure(project["dependencies"])}


#: Refuses every module of a distribution installed here that a plain install would not
#: have (the dev tools, the official Kubernetes client, ...).
_PLAIN = textwrap.dedent(
    """
    import importlib.abc, runpy, sys

    class _PlainInstall(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in BLOCKED:
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, _PlainInstall())
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")
    """
)


async def test_example_runs_on_a_plain_install(
    kdir: Path, kubeconfig: Path, node_name: str, api: Api
) -> None:
    """What the README promises: ``pip install kubedevice`` then examples/dra_minimal.py
    publishes its devices on a real API server (plain kubeconfig: no official client)."""
    plain = _plain_install()
    blocked = sorted(
        top
        for top, dists in importlib.metadata.packages_distributions().items()
        if not any(canonicalize_name(d) in plain for d in dists)
    )
    assert "kubernetes" in blocked  # the dev venv has it; a plain install must not need it
    args = ["--node-name", node_name, "--kubeconfig", str(kubeconfig),
            "--kubelet-dir", str(kdir), "--cdi-dir", str(kdir / "cdi")]  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-c", f"BLOCKED = {set(blocked)!r}\n" + _PLAIN, str(EXAMPLE), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "NODE_NAME": ""},
    )
    try:
        api.wait_for_slices(DRIVER, node_name, devices=4)
    except BaseException:
        proc.kill()
        output, _ = proc.communicate(timeout=30)
        raise AssertionError(f"exit {proc.returncode}: {output}") from None
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, output
    assert "Traceback" not in output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--node-name", "Bad_Node"], "node name 'Bad_Node' is not a DNS subdomain"),
        ([], "no node name: pass --node-name or set $NODE_NAME"),
        (["--driver-name", "UPPER.example.com", "--node-name", "n"], "driver name 'UPPER"),
        (
            ["--node-name", "n", "--kubeconfig", "/nonexistent/kubeconfig"],
            "kubeconfig /nonexistent/kubeconfig does not exist",
        ),
    ],
    ids=["bad-node", "no-node", "bad-driver", "no-kubeconfig"],
)
def test_bad_options_are_one_line_and_exit_2(args: list[str], message: str) -> None:
    proc = _start(*args)
    output, _ = proc.communicate(timeout=30)
    assert proc.returncode == 2, output
    assert message in output
    assert "Traceback" not in output
    assert len(output.strip().splitlines()) == 1, output


async def test_cleanup_flag_removes_slices_and_specs_and_exits_0(
    driver_process: subprocess.Popen, kdir: Path, kubeconfig: Path, node_name: str, api: Api
) -> None:
    await wait_for_path(kdir / "plugins_registry" / f"{DRIVER}-reg.sock", timeout=30)
    api.wait_for_slices(DRIVER, node_name, devices=4)
    driver_process.send_signal(signal.SIGTERM)
    driver_process.communicate(timeout=30)
    (kdir / "cdi").mkdir(exist_ok=True)
    (kdir / "cdi" / f"k8s.{DRIVER}-claim_gone.json").write_text("{}")
    args = ["--node-name", node_name, "--kubeconfig", str(kubeconfig), "--cdi-dir"]
    proc = _start(*args, str(kdir / "cdi"), "--cleanup")
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, output
    assert "removed 2 ResourceSlices and CDI specs" in output
    assert api.slices(DRIVER, node_name) == []
    assert list((kdir / "cdi").iterdir()) == []


def test_flags_become_options() -> None:
    import kubedevice.dra as dra

    args = dra.argument_parser().parse_args(
        [
            "--driver-name",
            "x.example.com",
            "--node-name",
            "n1",
            "--kubelet-dir",
            "/k",
            "--no-health",
        ]
    )
    assert dra.options_from_args(args) == dra.DriverOptions(
        driver_name="x.example.com",
        node_name="n1",
        kubelet_dir=Path("/k"),
        health=False,
    )


def test_log_format_from_the_environment_as_the_sdk_has_it() -> None:
    proc = _start("--node-name", "Bad_Node", KUBEDEVICE_LOG_FORMAT="json")
    output, _ = proc.communicate(timeout=30)
    assert proc.returncode == 2, output
    line = json.loads(output.strip())
    assert line["msg"] == "node name 'Bad_Node' is not a DNS subdomain"
    proc = _start("--node-name", "n", KUBEDEVICE_LOG_FORMAT="yaml")
    output, _ = proc.communicate(timeout=30)
    assert proc.returncode == 2, output
    assert output.strip() == "error: KUBEDEVICE_LOG_FORMAT='yaml' is not one of text, json"


def test_a_bad_request_policy_is_one_line_and_exit_2(
    tmp_path: Path, kdir: Path, kubeconfig: Path, node_name: str
) -> None:
    """The example with a request policy the API server would refuse: the driver stops with
    one line naming the device and the capacity, no traceback."""
    source = EXAMPLE.read_text()
    capacity = 'capacity={"memory": "1Gi"},'
    assert capacity in source
    bad = tmp_path / "bad_policy.py"
    bad.write_text(
        source.replace(
            capacity,
            capacity + ' request_policies={"memory": dra.RequestPolicy(default="1Gi")},',
        )
    )
    proc = subprocess.Popen(
        [sys.executable, str(bad), "--node-name", node_name, "--kubeconfig", str(kubeconfig),
         "--kubelet-dir", str(kdir), "--cdi-dir", str(kdir / "cdi")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "NODE_NAME": ""},
    )  # fmt: skip
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2, output
    assert "Traceback" not in output
    [line] = [x for x in output.splitlines() if "ERROR" in x or "error" in x]
    assert "device counter-0: capacity memory: a requestPolicy needs" in line, output

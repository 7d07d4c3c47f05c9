"""Helpers for the inspect tests: constants, a Pod manifest, running the command."""

from __future__ import annotations

import asyncio
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kubelet"))

from rawplugin import RawPlugin

from kubedevice.demo.generic import pod_manifest
from kubedevice.kubelet import Emulator

ROOT = Path(__file__).resolve().parents[2]
FOO = "example.com/foo"
BAR = "example.com/bar"
COUNTER = "example.com/counter"


def pod(name: str, resource: str, n: int, container: str = "c") -> dict[str, Any]:
    """A one-container Pod manifest in namespace ``team`` asking for ``n`` of ``resource``."""
    return pod_manifest(name, resource, n, namespace="team", container=container, image="x")


@dataclass
class Node:
    """The node under inspection."""

    emu: Emulator
    dp_dir: Path
    pr_socket: Path
    foo: RawPlugin
    bar: RawPlugin


async def run_inspect(
    dp_dir: Path, *extra: str, pr_socket: Path | None = None, cwd: Path | None = None
) -> tuple[int, str, str]:
    """Run ``kubedevice inspect`` as a process (in ``cwd``); (exit status, stdout, stderr)."""
    args = [sys.executable, "-m", "kubedevice", "inspect", "--device-plugin-dir", str(dp_dir)]
    if pr_socket is not None:
        args += ["--pod-resources-socket", str(pr_socket)]
    proc = await asyncio.create_subprocess_exec(
        *args, *extra, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=cwd
    )
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def inspect_json(dp_dir: Path, *extra: str) -> tuple[int, dict[str, Any], str]:
    """``kubedevice inspect -o json``: (exit status, document, stderr)."""
    rc, out, err = await run_inspect(dp_dir, "-o", "json", *extra)
    return rc, json.loads(out), err

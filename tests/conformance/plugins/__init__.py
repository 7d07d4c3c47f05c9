"""Plugin programs the conformance tests run as real processes.

``fixture_plugin.py`` never uses the SDK (raw ``grpc.aio``); ``sdk_repaired.py`` is an SDK
plugin whose preferred-allocation hook answers wrongly; ``kit_driver.py`` is a DRA driver
that uses neither the DRA kit nor the conformance kit.
"""

from __future__ import annotations

import sys
from pathlib import Path

FIXTURE = Path(__file__).parent / "fixture_plugin.py"


def fixture_cmd(*flags: str) -> list[str]:
    """argv that starts the independent fixture plugin with ``flags``."""
    return [sys.executable, str(FIXTURE), "--device-plugin-dir", "{dir}", *flags]


SDK_REPAIRED = Path(__file__).parent / "sdk_repaired.py"


KIT_DRIVER = Path(__file__).parent / "kit_driver.py"


def kit_driver_cmd(*flags: str) -> list[str]:
    """argv that starts the independent DRA kit driver (templates for the DRA kit) with
    ``--break`` ``flags``."""
    broken = [x for flag in flags for x in ("--break", flag)]
    return [sys.executable, str(KIT_DRIVER), "--node-name", "{node}", "--kubeconfig",
            "{kubeconfig}", "--kubelet-dir", "{kubelet_dir}", "--cdi-dir", "{cdi_dir}",
            "--pod-uid", "{pod_uid}", *broken]  # fmt: skip

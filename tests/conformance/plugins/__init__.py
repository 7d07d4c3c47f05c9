"""Plugin programs the conformance tests run as real processes.

``fixture_plugin.py`` never uses the SDK (raw ``grpc.aio``); ``sdk_repaired.py`` is an SDK
plugin whose preferred-allocation hook answers wrongly.
"""

from __future__ import annotations

import sys
from pathlib import Path

FIXTURE = Path(__file__).parent / "fixture_plugin.py"


def fixture_cmd(*flags: str) -> list[str]:
    """argv that starts the independent fixture plugin with ``flags``."""
    return [sys.executable, str(FIXTURE), "--device-plugin-dir", "{dir}", *flags]


SDK_REPAIRED = Path(__file__).parent / "sdk_repaired.py"

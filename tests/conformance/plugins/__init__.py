"""Plugin programs the conformance tests run as real processes (never the SDK)."""

from __future__ import annotations

import sys
from pathlib import Path

FIXTURE = Path(__file__).parent / "fixture_plugin.py"


def fixture_cmd(*flags: str) -> list[str]:
    """argv that starts the independent fixture plugin with ``flags``."""
    return [sys.executable, str(FIXTURE), "--device-plugin-dir", "{dir}", *flags]

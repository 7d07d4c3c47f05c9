"""The committed generated code is exactly what `make proto` produces from the .proto files."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_committed_generated_code_is_fresh(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts/genproto.py"), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    generated = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    assert len(generated) == 4 * 6, generated  # 6 protos, 4 files each
    stale = [
        str(rel)
        for rel in generated
        if (ROOT / "src" / rel).read_bytes() != (tmp_path / rel).read_bytes()
    ]
    assert not stale, f"generated code is stale, run `make proto`: {stale}"

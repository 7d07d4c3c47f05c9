"""The catalogue is complete: documented in docs/conformance.md, and each case can fail."""

from __future__ import annotations

import re
from pathlib import Path

from kubedevice.conformance.catalogue import CASES
from kubedevice.conformance.dra import DRA_CASES

from .test_fixture_plugins import BROKEN

DOC = Path(__file__).resolve().parents[2] / "docs" / "conformance.md"
ROW = re.compile(r"^\| `([a-z0-9-]+)` \| (MUST|SHOULD) \|", re.MULTILINE)


DRA_ROW = re.compile(r"^\| `([a-z0-9-]+)` \| (MUST|SHOULD|INFO) \|", re.MULTILINE)
DRA_HEADING = "## DRA drivers: `kubedevice conformance --dra`"


def test_docs_list_every_case_with_its_level_in_order() -> None:
    device_plugins, _, _ = DOC.read_text().partition(DRA_HEADING)
    documented = ROW.findall(device_plugins)
    assert documented == [(c.id, c.level.value) for c in CASES]


def test_docs_list_every_dra_case_with_its_level_in_order() -> None:
    _, heading, dra = DOC.read_text().partition(DRA_HEADING)
    assert heading
    assert DRA_ROW.findall(dra) == [(c.id, c.level.value) for c in DRA_CASES]


def test_every_case_has_a_fixture_flag_that_fails_it() -> None:
    assert set(BROKEN.values()) == {c.id for c in CASES}

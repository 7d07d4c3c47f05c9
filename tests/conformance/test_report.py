"""Unit tests of the report model and its JUnit rendering (no plugin involved)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from kubedevice.conformance import CASES, CaseResult, Level, Outcome, Report, junit_xml
from kubedevice.conformance.catalogue import CASES_BY_ID


def _report(tmp: Path, outcomes: dict[str, Outcome]) -> Report:
    results = tuple(
        CaseResult(CASES_BY_ID[cid], out, f"evidence for {cid}", "example.com/x")
        for cid, out in outcomes.items()
    )
    log = tmp / "plugin.log"
    log.write_text("".join(f"line {i}\n" for i in range(50)))
    return Report(("plugin", "--x"), results, ("example.com/x",), log, 1.5)


def test_catalogue_levels_and_ids_are_unique() -> None:
    assert len({c.id for c in CASES}) == len(CASES)
    assert {c.level for c in CASES} == {Level.MUST, Level.SHOULD}
    assert all(c.section for c in CASES)


def test_summary_ok_and_strict(tmp_path: Path) -> None:
    rep = _report(
        tmp_path,
        {
            "registration-valid": Outcome.PASS,
            "allocate-unknown-refused": Outcome.FAIL,
            "allocate-unhealthy-refused": Outcome.SKIP,
        },
    )
    assert rep.summary() == "1 passed, 1 failed, 1 skipped"
    assert rep.ok()
    assert not rep.ok(strict=True)
    assert rep.failed_case_ids() == {"allocate-unknown-refused"}
    assert rep.get("allocate-unknown-refused").id == "allocate-unknown-refused[example.com/x]"
    must = _report(tmp_path, {"registration-valid": Outcome.FAIL})
    assert not must.ok()
    assert rep.log_tail(2) == "line 48\nline 49\n"
    table = rep.format_table().splitlines()
    assert table[0].split()[:3] == ["RESULT", "LEVEL", "CASE"]
    assert table[2].startswith("FAIL    SHOULD  allocate-unknown-refused[example.com/x]")


def test_junit_has_one_testcase_per_case(tmp_path: Path) -> None:
    rep = _report(
        tmp_path,
        {
            "registration-valid": Outcome.PASS,
            "allocate-healthy": Outcome.FAIL,
            "preferred-allocation": Outcome.SKIP,
        },
    )
    root = ET.fromstring(junit_xml(rep))
    suite = root.find("testsuite")
    assert suite is not None
    assert (suite.get("tests"), suite.get("failures"), suite.get("skipped")) == ("3", "1", "1")
    cases = {c.get("name"): c for c in suite.findall("testcase")}
    assert set(cases) == {
        f"{cid}[example.com/x]"
        for cid in ("registration-valid", "allocate-healthy", "preferred-allocation")
    }
    failed = cases["allocate-healthy[example.com/x]"]
    failure = failed.find("failure")
    assert failure is not None
    assert failure.get("message") == "evidence for allocate-healthy"
    level = failed.find("properties/property[@name='level']")
    assert level is not None
    assert level.get("value") == "MUST"
    assert cases["preferred-allocation[example.com/x]"].find("skipped") is not None


def test_log_tail_counts_lines_by_newline_only(tmp_path: Path) -> None:
    rep = _report(tmp_path, {})
    rep.log_path.write_bytes(b"first\nprogress 10%\rprogress 100%\nbad \xff byte\nno newline")
    assert rep.log_tail(3) == "progress 10%\rprogress 100%\nbad \ufffd byte\nno newline"
    assert rep.log_tail(0) == ""
    rep.log_path.write_bytes(b"")
    assert rep.log_tail() == ""


def test_log_tail_of_a_huge_log_reads_only_its_end(tmp_path: Path) -> None:
    rep = _report(tmp_path, {})
    with rep.log_path.open("wb") as fh:
        fh.write(b"x" * (3 << 20) + b"\n")  # one 3 MB line, then the lines that matter
        fh.write(b"".join(b"line %d\n" % i for i in range(5)))
    assert rep.log_tail(5) == "".join(f"line {i}\n" for i in range(5))
    assert rep.log_tail(100).startswith("line 0\n")  # the cut first line is not shown

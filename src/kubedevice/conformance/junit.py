"""JUnit XML for a conformance :class:`~kubedevice.conformance.report.Report`.

One ``testcase`` per case (and resource); failed cases get a ``failure`` element, skipped
ones a ``skipped`` element, and every case carries its level (MUST/SHOULD) and contract
section as properties.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from kubedevice.conformance.report import Outcome, Report

__all__ = ["junit_xml", "write_junit"]


def junit_xml(report: Report, *, suite_name: str = "kubedevice-conformance") -> str:
    """Render ``report`` as a JUnit XML document (a ``testsuites`` root with one suite)."""
    root = ET.Element("testsuites")
    suite = ET.SubElement(
        root,
        "testsuite",
        name=suite_name,
        tests=str(len(report.results)),
        failures=str(report.failed),
        errors="0",
        skipped=str(report.skipped),
        time=f"{report.duration_s:.3f}",
    )
    props = ET.SubElement(suite, "properties")
    ET.SubElement(props, "property", name="command", value=" ".join(report.command))
    ET.SubElement(props, "property", name="plugin_log", value=str(report.log_path))
    for result in report.results:
        case = ET.SubElement(
            suite,
            "testcase",
            classname=f"conformance.{result.resource or 'plugin'}",
            name=result.id,
            time=f"{result.duration_s:.3f}",
        )
        cprops = ET.SubElement(case, "properties")
        ET.SubElement(cprops, "property", name="level", value=result.level.value)
        ET.SubElement(cprops, "property", name="section", value=result.case.section)
        if result.outcome is Outcome.FAIL:
            fail = ET.SubElement(case, "failure", message=result.evidence, type=result.level.value)
            fail.text = f"{result.level.value} {result.case.title}: {result.evidence}"
        elif result.outcome is Outcome.SKIP:
            ET.SubElement(case, "skipped", message=result.evidence)
        else:
            ET.SubElement(case, "system-out").text = result.evidence
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def write_junit(report: Report, path: str | Path) -> None:
    """Write :func:`junit_xml` of ``report`` to ``path`` (UTF-8)."""
    Path(path).write_text(junit_xml(report), encoding="utf-8")

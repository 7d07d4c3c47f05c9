"""Conformance kit (kubelet side): run a device plugin against the emulator and judge it.

Built on :mod:`kubedevice.kubelet`; never imports the SDK, so it works on any plugin, in
any language, started as a command. Entry points: :func:`check_plugin` (sync) and
:func:`run_conformance` (async) return a :class:`Report`; :func:`junit_xml` renders one.
The cases and their MUST/SHOULD levels are listed in :data:`CASES` and docs/conformance.md.
"""

from kubedevice.conformance.catalogue import CASES as CASES, Case as Case, Level as Level
from kubedevice.conformance.junit import junit_xml as junit_xml, write_junit as write_junit
from kubedevice.conformance.report import (
    CaseResult as CaseResult,
    Outcome as Outcome,
    Report as Report,
)
from kubedevice.conformance.runner import (
    check_plugin as check_plugin,
    run_conformance as run_conformance,
)

__all__ = [
    "CASES",
    "Case",
    "CaseResult",
    "Level",
    "Outcome",
    "Report",
    "check_plugin",
    "junit_xml",
    "run_conformance",
    "write_junit",
]

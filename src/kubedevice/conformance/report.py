"""The result of a conformance run: one :class:`CaseResult` per case (and resource), and views.

Owns the outcome model, the summary line, the text table and the log tail; nothing here
talks to a plugin.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path

from kubedevice.conformance.catalogue import Case, Level

__all__ = ["CaseResult", "Outcome", "Report"]

#: How much of the end of the plugin's log :meth:`Report.log_tail` reads at most.
_TAIL_BYTES = 1 << 20


class Outcome(enum.Enum):
    """What a case concluded."""

    PASS = "pass"
    FAIL = "fail"
    SKIP = "skip"


@dataclass(frozen=True)
class CaseResult:
    """One case's outcome with its evidence: a one-line account of what was observed."""

    case: Case
    outcome: Outcome
    evidence: str
    resource: str | None = None
    duration_s: float = 0.0

    @property
    def id(self) -> str:
        """``case-id`` or ``case-id[resource]`` for per-resource cases."""
        return self.case.id if self.resource is None else f"{self.case.id}[{self.resource}]"

    @property
    def level(self) -> Level:
        """MUST or SHOULD, from the catalogue."""
        return self.case.level


@dataclass(frozen=True)
class Report:
    """Everything a conformance run found. Tests inspect it; the CLI renders it."""

    command: tuple[str, ...]
    results: tuple[CaseResult, ...]
    resources: tuple[str, ...]
    log_path: Path
    duration_s: float

    def _count(self, outcome: Outcome) -> int:
        return sum(1 for r in self.results if r.outcome is outcome)

    @property
    def passed(self) -> int:
        """Number of passed cases."""
        return self._count(Outcome.PASS)

    @property
    def failed(self) -> int:
        """Number of failed cases (MUST and SHOULD)."""
        return self._count(Outcome.FAIL)

    @property
    def skipped(self) -> int:
        """Number of skipped cases."""
        return self._count(Outcome.SKIP)

    def failures(self, level: Level | None = None) -> list[CaseResult]:
        """Failed cases, optionally only those of one level."""
        return [
            r
            for r in self.results
            if r.outcome is Outcome.FAIL and (level is None or r.level is level)
        ]

    def failed_case_ids(self) -> set[str]:
        """Catalogue ids of the failed cases, resource suffix dropped (handy in tests)."""
        return {r.case.id for r in self.failures()}

    def ok(self, *, strict: bool = False) -> bool:
        """True without MUST failures (and, with ``strict``, without SHOULD failures)."""
        return not (self.failures(Level.MUST) or (strict and self.failures()))

    def get(self, case_id: str, resource: str | None = None) -> CaseResult:
        """The result of ``case_id`` (for ``resource`` if given, else the first one)."""
        for r in self.results:
            if r.case.id == case_id and (resource is None or r.resource == resource):
                return r
        raise KeyError(f"no result for case {case_id!r} (resource {resource!r})")

    def summary(self) -> str:
        """``12 passed, 1 failed, 1 skipped``."""
        return f"{self.passed} passed, {self.failed} failed, {self.skipped} skipped"

    def format_table(self) -> str:
        """A plain-text table: outcome, level, case id, evidence."""
        rows = [(r.outcome.value.upper(), r.level.value, r.id, r.evidence) for r in self.results]
        head = ("RESULT", "LEVEL", "CASE", "EVIDENCE")
        widths = [max(len(row[i]) for row in [head, *rows]) for i in range(3)]
        lines = []
        for row in [head, *rows]:
            cells = [cell.ljust(w) for cell, w in zip(row[:3], widths, strict=True)]
            lines.append("  ".join([*cells, row[3]]).rstrip())
        return "\n".join(lines)

    def log_tail(self, lines: int = 20) -> str:
        """The last ``lines`` lines of the plugin's output ("" when the log is gone).

        Lines end at ``\n`` only (a ``\r`` inside a line, as progress output writes, does
        not split it, so it cannot push a real line out of the tail); a last line without
        a newline counts; bytes that are not UTF-8 are replaced.
        """
        try:
            with self.log_path.open("rb") as fh:
                size = fh.seek(0, 2)
                fh.seek(max(0, size - _TAIL_BYTES))
                data = fh.read()
        except OSError:
            return ""
        if len(data) == _TAIL_BYTES and size > _TAIL_BYTES:
            data = data.partition(b"\n")[2]  # the first line was cut by the seek
        ended = data.endswith(b"\n")
        parts = (data[:-1] if ended else data).split(b"\n") if data else []
        tail = parts[-lines:] if lines > 0 else []
        if not tail:
            return ""
        return (b"\n".join(tail) + (b"\n" if ended else b"")).decode("utf-8", "replace")

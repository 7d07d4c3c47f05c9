"""The safe ``{name}`` template syntax of the generic plugin's config (envs, CDI names, checks).

A template is literal text with ``{variable}`` placeholders taken from a fixed set per use
site; ``{{`` and ``}}`` stand for literal braces. There is no expression evaluation, no
attribute access and no format spec: anything else is a config error found at load time.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "CDI_VARIABLES",
    "CHECK_VARIABLES",
    "ENV_VARIABLES",
    "Template",
    "TemplateError",
]

#: Variables available in ``envs`` and ``annotations`` values (rendered per allocation).
ENV_VARIABLES = frozenset({"ids", "devices", "paths", "hostPaths", "count", "resource"})
#: Variables available in ``cdiDevices`` entries and ``containerPath`` (rendered per device).
CDI_VARIABLES = frozenset({"id", "name"})
#: Variables available in health checks (sysfs attribute path, command argv).
CHECK_VARIABLES = frozenset({"id", "name", "path"})

_TOKEN = re.compile(r"\{\{|\}\}|\{([^{}]*)\}|[{}]")


class TemplateError(ValueError):
    """A template that does not parse or names a variable that is not available."""


@dataclass(frozen=True, slots=True)
class Template:
    """A parsed template: alternating literal text and variable names."""

    source: str
    parts: tuple[tuple[bool, str], ...]  # (is_variable, text-or-name)

    @classmethod
    def parse(cls, source: str, allowed: frozenset[str]) -> Template:
        """Parse ``source``; raise :class:`TemplateError` naming the first bad placeholder."""
        parts: list[tuple[bool, str]] = []
        pos = 0
        literal: list[str] = []
        for match in _TOKEN.finditer(source):
            literal.append(source[pos : match.start()])
            pos = match.end()
            token = match.group(0)
            if token == "{{":
                literal.append("{")
            elif token == "}}":
                literal.append("}")
            elif token in ("{", "}"):
                raise TemplateError(
                    f"unbalanced {token!r} at offset {match.start()} (write {token * 2} for a "
                    "literal brace)"
                )
            else:
                name = match.group(1)
                if name not in allowed:
                    raise TemplateError(
                        f"unknown template variable {{{name}}}; expected one of "
                        + ", ".join("{" + v + "}" for v in sorted(allowed))
                    )
                if literal:
                    parts.append((False, "".join(literal)))
                    literal = []
                parts.append((True, name))
        literal.append(source[pos:])
        text = "".join(literal)
        if text:
            parts.append((False, text))
        return cls(source, tuple(parts))

    @property
    def variables(self) -> frozenset[str]:
        """The variable names this template uses."""
        return frozenset(text for is_var, text in self.parts if is_var)

    def render(self, values: Mapping[str, str]) -> str:
        """Substitute ``values`` (every used variable must be present)."""
        return "".join(values[text] if is_var else text for is_var, text in self.parts)

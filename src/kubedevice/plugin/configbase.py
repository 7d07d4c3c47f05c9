"""What the plugins' YAML configs share: model settings, path and name checks, one-line errors.

Models refuse unknown keys, are frozen, strict and camelCase in YAML. A pydantic
:class:`~pydantic.ValidationError` becomes one line per problem naming the source file,
the field path (``resources[0].groups[1].count``) and what was expected.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import PurePosixPath
from typing import Annotated, Any, Final

from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationError
from pydantic.alias_generators import to_camel
from pydantic_core import ErrorDetails

from kubedevice.errors import InvalidResourceNameError
from kubedevice.plugin import validate_resource_name
from kubedevice.plugin.yamlfile import HugeInt

__all__ = [
    "STRICT_MODEL_CONFIG",
    "AbsPath",
    "ResourceName",
    "absolute_path",
    "describe_input",
    "format_validation_error",
    "resource_name",
]


#: The ``model_config`` of config models: frozen, strict, no unknown keys, camelCase in YAML.
STRICT_MODEL_CONFIG: Final = ConfigDict(
    extra="forbid",
    frozen=True,
    alias_generator=to_camel,
    validate_by_alias=True,
    validate_by_name=False,
    strict=True,
    allow_inf_nan=False,
)


def absolute_path(value: str) -> str:
    """Check that ``value`` is an absolute path without ``..`` (a pydantic validator)."""
    p = PurePosixPath(value)
    if not p.is_absolute():
        raise ValueError(f"must be an absolute path (got {value!r})")
    if ".." in p.parts:
        raise ValueError(f"must not contain '..' (got {value!r})")
    return value


AbsPath = Annotated[str, AfterValidator(absolute_path)]


def resource_name(value: str) -> str:
    """Check that ``value`` is a valid extended resource name (a pydantic validator)."""
    try:
        validate_resource_name(value)
    except InvalidResourceNameError as exc:
        raise ValueError(exc.reason) from None
    return value


ResourceName = Annotated[str, AfterValidator(resource_name)]


def _loc_text(loc: Sequence[int | str]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "(top level)"


def _allowed_keys(loc: Sequence[int | str], root: type[BaseModel]) -> list[str]:
    model: Any = root
    for part in loc[:-1]:
        if isinstance(part, int) or model is None:
            continue
        field = next((f for f in model.model_fields.values() if f.alias == part), None)
        if field is None:
            return []
        model = _inner_model(field.annotation)
    if model is None:
        return []
    return sorted(f.alias for f in model.model_fields.values() if f.alias)


def _inner_model(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _inner_model(arg)
        if found is not None:
            return found
    return None


_TYPE_NAMES = {
    "string_type": "a string",
    "int_type": "an integer",
    "float_type": "a number",
    "bool_type": "true or false",
    "list_type": "a list",
    "dict_type": "a mapping",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
}


def describe_input(value: Any) -> str:
    """``value`` as an error message shows it after "got" (long texts are shortened)."""
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, HugeInt):
        return str(value)
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:60]}... ({len(text)} characters)"


def _message(err: ErrorDetails, root: type[BaseModel]) -> str:
    kind = err["type"]
    ctx: dict[str, Any] = dict(err.get("ctx") or {})
    value = err.get("input")
    if kind == "missing":
        return "required field is missing"
    if isinstance(value, HugeInt) and kind != "string_type":
        return f"out of range (got {value})"
    if kind == "extra_forbidden":
        allowed = _allowed_keys(err["loc"], root)
        return "unknown key" + (f" (allowed: {', '.join(allowed)})" if allowed else "")
    if kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        op = {
            "greater_than_equal": ">=",
            "greater_than": ">",
            "less_than_equal": "<=",
            "less_than": "<",
        }[kind]
        bound = next(iter(ctx.values()))
        if isinstance(bound, float):
            bound = f"{bound:g}"
        return f"must be {op} {bound} (got {describe_input(value)})"
    if kind == "too_short":
        return (
            f"must have at least {ctx.get('min_length')} item(s) (got {ctx.get('actual_length')})"
        )
    if kind == "literal_error":
        return f"must be {ctx.get('expected')} (got {describe_input(value)})"
    if kind in _TYPE_NAMES:
        return f"expected {_TYPE_NAMES[kind]} (got {describe_input(value)})"
    if kind == "value_error":
        return str(ctx.get("error", err["msg"]))
    if kind in ("finite_number",):
        return f"must be a finite number (got {describe_input(value)})"
    return f"{err['msg']} (got {describe_input(value)})"


def _error_loc(err: ErrorDetails) -> tuple[tuple[int | str, ...], str | None]:
    """The field path of ``err``, and a message override for keys that are not strings."""
    loc = tuple(err["loc"])
    if len(loc) >= 2 and loc[-1] == "[key]":  # a dict key of the wrong type
        return loc[:-2], f"key {loc[-2]!r} must be a string"
    if err["type"] == "invalid_key" and loc:  # a model key of the wrong type
        return loc[:-1], f"key {loc[-1]!r} must be a string"
    return loc, None


def format_validation_error(source: str, exc: ValidationError, root: type[BaseModel]) -> str:
    """One line per error: ``<source>: <field path>: <what was expected>``.

    ``root`` is the root model validated (for the allowed keys of an unknown-key error).
    """
    lines = []
    for err in exc.errors(include_url=False):
        loc, override = _error_loc(err)
        if override is not None:
            lines.append(f"{source}: {_loc_text(loc)}: {override}")
            continue
        msg = _message(err, root)
        # model-level validators report "resources[0].name: ..." themselves.
        if err["type"] == "value_error" and re.match(r"^[A-Za-z]+(?:[\[.][^ ]*)?: ", msg):
            sub, _, msg = msg.partition(": ")
            prefix = _loc_text(loc)
            path = f"{prefix}.{sub}" if loc and not sub.startswith("[") else prefix + sub
            if not loc:
                path = sub
            lines.append(f"{source}: {path}: {msg}")
            continue
        lines.append(f"{source}: {_loc_text(loc)}: {msg}")
    return "\n".join(lines)

"""What the plugins' YAML configs share: path and name checks, one-line errors naming the file.

Models are :mod:`kubedevice.plugin.schema` dataclasses (frozen, strict, camelCase in YAML,
no unknown keys). :func:`parse_model` turns a :class:`~kubedevice.plugin.schema.SchemaError`
into a :class:`~kubedevice.errors.ConfigError` of one line per problem naming the source
file, the field path (``resources[0].groups[1].count``) and what was expected.
"""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Annotated, Any, TypeVar

from kubedevice.errors import ConfigError, InvalidResourceNameError
from kubedevice.plugin import validate_resource_name
from kubedevice.plugin.schema import Check, Model, SchemaError, build, describe_input, loc_text

__all__ = [
    "AbsPath",
    "ResourceName",
    "absolute_path",
    "describe_input",
    "format_schema_error",
    "parse_model",
    "resource_name",
]

M = TypeVar("M", bound=Model)


def absolute_path(value: str) -> str:
    """Check that ``value`` is an absolute path without ``..`` (a field check)."""
    p = PurePosixPath(value)
    if not p.is_absolute():
        raise ValueError(f"must be an absolute path (got {describe_input(value)})")
    if ".." in p.parts:
        raise ValueError(f"must not contain '..' (got {describe_input(value)})")
    return value


AbsPath = Annotated[str, Check(absolute_path)]


def resource_name(value: str) -> str:
    """Check that ``value`` is a valid extended resource name (a field check)."""
    try:
        validate_resource_name(value)
    except InvalidResourceNameError as exc:
        raise ValueError(exc.reason) from None
    return value


ResourceName = Annotated[str, Check(resource_name)]


def format_schema_error(source: str, exc: SchemaError) -> str:
    """One line per problem: ``<source>: <field path>: <what was expected>``."""
    return "\n".join(f"{source}: {loc_text(p.path)}: {p.message}" for p in exc.problems)


def parse_model(cls: type[M], data: Any, source: str) -> M:
    """``data`` (parsed YAML from ``source``) as a ``cls``.

    Raises:
        ConfigError: One line per problem, naming ``source`` and the field.
    """
    try:
        return build(cls, data)
    except SchemaError as exc:
        raise ConfigError(format_schema_error(source, exc)) from None

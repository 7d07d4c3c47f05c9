"""Typed config models from parsed YAML: frozen dataclasses, strict checks, every error found.

A config model is a frozen, keyword-only dataclass deriving from :class:`Model`. Its YAML
keys are the camelCase form of the field names (``per_match`` -> ``perMatch``; a field's
``metadata={"alias": ...}`` overrides it). :func:`build` turns parsed YAML into a model,
checking what the type hints say and nothing looser: a string is never a number, ``1`` is
never ``true``, unknown keys are refused. Constraints ride on ``Annotated``
(:class:`Ge`, :class:`Gt`, :class:`Le`, :class:`MinLen`, :class:`Check`, :class:`Before`),
and a model's :meth:`Model.check` sees the whole object once its fields are valid.

Every problem is collected, in field order, as a path (``resources[0].groups[1].count``)
and a sentence; :class:`SchemaError` carries them all. The module imports only the standard
library: it is what keeps a validation library out of the plugin daemons' memory.
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Final, Literal, TypeVar, Union

from kubedevice.yamlfile import HugeInt

__all__ = [
    "Before",
    "Check",
    "Ge",
    "Gt",
    "Le",
    "MinLen",
    "Model",
    "Problem",
    "SchemaError",
    "build",
    "describe_input",
    "dump",
    "loc_text",
]


@dataclass(frozen=True)
class Ge:
    """The value must be ``>=`` this bound."""

    bound: float


@dataclass(frozen=True)
class Gt:
    """The value must be ``>`` this bound."""

    bound: float


@dataclass(frozen=True)
class Le:
    """The value must be ``<=`` this bound."""

    bound: float


@dataclass(frozen=True)
class MinLen:
    """The list must have at least this many items."""

    length: int


@dataclass(frozen=True)
class Check:
    """A check run on the converted value: returns it (possibly normalised) or raises ValueError."""

    fn: Callable[[Any], Any]


@dataclass(frozen=True)
class Before:
    """A conversion run on the raw YAML value before the type check (may raise ValueError)."""

    fn: Callable[[Any], Any]


Path = tuple[int | str, ...]


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the input: where (a field path) and what."""

    path: Path
    message: str


class SchemaError(ValueError):
    """Parsed YAML that does not fit its model; ``problems`` lists every finding."""

    def __init__(self, problems: list[Problem]) -> None:
        super().__init__("; ".join(f"{loc_text(p.path)}: {p.message}" for p in problems))
        self.problems = problems


class Model:
    """Base of config models (each one a ``@dataclass(frozen=True, kw_only=True)``)."""

    __slots__ = ()

    #: Field table, built on first use: (name, YAML key, type, has a default).
    _schema_fields: ClassVar[tuple[tuple[str, str, Any, bool], ...]]
    #: YAML keys are the camelCase form of the field names; ``False``: the names as they are.
    camel_keys: ClassVar[bool] = True

    def check(self) -> None:
        """Checks across fields, run once every field is valid.

        Raises:
            ValueError: Its text is the message; a text starting with a sub-path and ``": "``
                (``"resources[1].name: ..."``) is reported at that sub-path.
        """

    @classmethod
    def from_data(cls, data: Any) -> typing.Self:
        """Build the model from parsed YAML.

        Raises:
            SchemaError: Every problem found.
        """
        return build(cls, data)


_INVALID: Final = object()


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def _fields(cls: type[Model]) -> tuple[tuple[str, str, Any, bool], ...]:
    cached = cls.__dict__.get("_schema_fields")
    if cached is not None:
        return cached  # type: ignore[no-any-return]
    hints = typing.get_type_hints(cls, include_extras=True)
    table = tuple(
        (
            f.name,
            f.metadata.get("alias", _camel(f.name) if cls.camel_keys else f.name),
            hints[f.name],
            f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING,
        )
        for f in dataclasses.fields(cls)  # type: ignore[arg-type]
        if f.init
    )
    cls._schema_fields = table
    return table


M = TypeVar("M", bound=Model)


def build(cls: type[M], data: Any) -> M:
    """``data`` (parsed YAML) as a ``cls``.

    Raises:
        SchemaError: Every problem found, in field order.
    """
    problems: list[Problem] = []
    value = _convert(cls, data, (), problems)
    if problems:
        raise SchemaError(problems)
    return value  # type: ignore[no-any-return]


def dump(obj: Model) -> dict[str, Any]:
    """``obj`` as YAML data (the inverse of :func:`build`)."""
    out: dict[str, Any] = {}
    for name, alias, _, _ in _fields(type(obj)):
        out[alias] = _dump_value(getattr(obj, name))
    return out


def _dump_value(value: Any) -> Any:
    if isinstance(value, Model):
        return dump(value)
    if isinstance(value, list | tuple):
        return [_dump_value(v) for v in value]
    if isinstance(value, dict):
        return {k: _dump_value(v) for k, v in value.items()}
    return value


def describe_input(value: Any) -> str:
    """``value`` as an error message shows it after "got" (long texts are shortened)."""
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, HugeInt):
        return str(value)
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**30:
        # never str() it: past 4,300 digits Python refuses, with a hint meant for programmers
        return f"an integer of about {int(abs(value).bit_length() * math.log10(2)) + 1} digits"
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:60]}... ({len(text)} characters)"


def loc_text(path: Path) -> str:
    """A field path as users read it: ``resources[0].groups[1].count``."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "(top level)"


_TYPE_NAMES: Final = {str: "a string", int: "an integer", float: "a number", bool: "true or false"}
_SUB_PATH = re.compile(r"^([A-Za-z]+(?:[\[.][^ ]*)?|\[\d+\][^ ]*): ")


def _bound_text(bound: float) -> str:
    return f"{bound:g}" if isinstance(bound, float) else str(bound)


def _literal_text(choices: tuple[Any, ...]) -> str:
    texts = [repr(c) for c in choices]
    return texts[0] if len(texts) == 1 else f"{', '.join(texts[:-1])} or {texts[-1]}"


def _convert(tp: Any, value: Any, path: Path, problems: list[Problem]) -> Any:
    """``value`` checked against ``tp``; :data:`_INVALID` (with problems added) if it fails."""
    metadata: tuple[Any, ...] = ()
    raw = value  # what the message shows: 1, not the 1.0 it became
    if typing.get_origin(tp) is typing.Annotated:
        metadata = tp.__metadata__
        tp = tp.__origin__
    for item in metadata:
        if isinstance(item, Before):
            try:
                value = item.fn(value)
            except ValueError as exc:
                problems.append(Problem(path, str(exc)))
                return _INVALID
    value = _convert_type(tp, value, path, problems)
    if value is _INVALID:
        return _INVALID
    for item in metadata:
        message = _constraint(item, value, raw)
        if isinstance(item, Check) and message is None:
            try:
                value = item.fn(value)
            except ValueError as exc:
                message = str(exc)
        if message is not None:
            problems.append(Problem(path, message))
            return _INVALID
    return value


def _constraint(item: Any, value: Any, raw: Any) -> str | None:
    """The message of a failed bound on ``value`` (converted from ``raw``), or ``None``."""
    if isinstance(item, Ge) and not value >= item.bound:
        return f"must be >= {_bound_text(item.bound)} (got {describe_input(raw)})"
    if isinstance(item, Gt) and not value > item.bound:
        return f"must be > {_bound_text(item.bound)} (got {describe_input(raw)})"
    if isinstance(item, Le) and not value <= item.bound:
        return f"must be <= {_bound_text(item.bound)} (got {describe_input(raw)})"
    if isinstance(item, MinLen) and len(value) < item.length:
        return f"must have at least {item.length} item(s) (got {len(value)})"
    return None


def _convert_type(tp: Any, value: Any, path: Path, problems: list[Problem]) -> Any:
    origin = typing.get_origin(tp)
    if origin is Union or origin is types.UnionType:
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        rest = [a for a in args if a is not type(None)]
        if len(rest) != 1:
            raise TypeError(f"unsupported union {tp!r}")  # a schema bug, not bad input
        return _convert(rest[0], value, path, problems)
    if origin is Literal:
        choices = typing.get_args(tp)
        if any(type(value) is type(c) and value == c for c in choices):
            return value
        problems.append(
            Problem(path, f"must be {_literal_text(choices)} (got {describe_input(value)})")
        )
        return _INVALID
    if origin is list:
        return _convert_list(typing.get_args(tp)[0], value, path, problems)
    if origin is dict:
        key_type, value_type = typing.get_args(tp)
        return _convert_dict(key_type, value_type, value, path, problems)
    if origin is tuple:
        return _convert_tuple(typing.get_args(tp), value, path, problems)
    if isinstance(tp, type) and issubclass(tp, Model):
        return _convert_model(tp, value, path, problems)
    if tp is Any:
        return value
    return _convert_scalar(tp, value, path, problems)


def _convert_scalar(tp: Any, value: Any, path: Path, problems: list[Problem]) -> Any:
    if isinstance(value, HugeInt) and tp in (int, float):
        problems.append(Problem(path, f"out of range (got {value})"))
        return _INVALID
    if tp is float and isinstance(value, int | float) and not isinstance(value, bool):
        if isinstance(value, float) and not math.isfinite(value):
            problems.append(Problem(path, f"must be a finite number (got {describe_input(value)})"))
            return _INVALID
        try:
            return float(value)
        except OverflowError:  # an int past float's range
            problems.append(Problem(path, f"out of range (got {describe_input(value)})"))
            return _INVALID
    if tp is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if tp in (str, bool) and type(value) is tp:
        return value
    if tp not in _TYPE_NAMES:
        raise TypeError(f"unsupported field type {tp!r}")  # a schema bug, not bad input
    problems.append(Problem(path, f"expected {_TYPE_NAMES[tp]} (got {describe_input(value)})"))
    return _INVALID


def _convert_list(item_type: Any, value: Any, path: Path, problems: list[Problem]) -> Any:
    if not isinstance(value, list):
        problems.append(Problem(path, f"expected a list (got {describe_input(value)})"))
        return _INVALID
    out = [_convert(item_type, v, (*path, i), problems) for i, v in enumerate(value)]
    return _INVALID if any(v is _INVALID for v in out) else out


def _convert_tuple(args: tuple[Any, ...], value: Any, path: Path, problems: list[Problem]) -> Any:
    if not isinstance(value, list | tuple) or len(value) != len(args):
        problems.append(
            Problem(path, f"expected a list of {len(args)} items (got {describe_input(value)})")
        )
        return _INVALID
    out = [
        _convert(t, v, (*path, i), problems)
        for i, (t, v) in enumerate(zip(args, value, strict=True))
    ]
    return _INVALID if any(v is _INVALID for v in out) else tuple(out)


def _key_problem(key: Any, key_type: Any) -> str | None:
    if key_type is str:
        return None if isinstance(key, str) else f"key {describe_input(key)} must be a string"
    if key_type is int:
        if isinstance(key, int) and not isinstance(key, bool):
            return None
        hint = ""
        if isinstance(key, str) and re.fullmatch(r"\s*[+-]?\d+\s*", key):
            hint = f" (write {key.strip()} without quotes)"
        return f"key {describe_input(key)} must be an integer{hint}"
    raise TypeError(f"unsupported key type {key_type!r}")  # a schema bug, not bad input


def _convert_dict(
    key_type: Any, value_type: Any, value: Any, path: Path, problems: list[Problem]
) -> Any:
    if not isinstance(value, Mapping):
        problems.append(Problem(path, f"expected a mapping (got {describe_input(value)})"))
        return _INVALID
    out: dict[Any, Any] = {}
    ok = True
    for key, item in value.items():
        message = _key_problem(key, key_type)
        if message is not None:
            problems.append(Problem(path, message))
            ok = False
            continue
        converted = _convert(value_type, item, (*path, key), problems)
        ok = ok and converted is not _INVALID
        out[key] = converted
    return out if ok else _INVALID


def _convert_model(cls: type[Model], value: Any, path: Path, problems: list[Problem]) -> Any:
    if not isinstance(value, Mapping):
        problems.append(Problem(path, f"expected a mapping (got {describe_input(value)})"))
        return _INVALID
    table = _fields(cls)
    before = len(problems)
    for key in value:
        if not isinstance(key, str):
            problems.append(Problem(path, f"key {describe_input(key)} must be a string"))
    if len(problems) > before:
        return _INVALID
    kwargs: dict[str, Any] = {}
    for name, alias, tp, has_default in table:
        if alias in value:
            converted = _convert(tp, value[alias], (*path, alias), problems)
            if converted is not _INVALID:
                kwargs[name] = converted
        elif not has_default:
            problems.append(Problem((*path, alias), "required field is missing"))
    known = {alias for _, alias, _, _ in table}
    unknown = [k for k in value if k not in known]
    if unknown:
        allowed = f" (allowed: {', '.join(sorted(known))})" if known else ""
        problems.extend(Problem((*path, k), f"unknown key{allowed}") for k in unknown)
    if len(problems) > before:
        return _INVALID
    obj = cls(**kwargs)
    try:
        obj.check()
    except ValueError as exc:
        message = str(exc)
        match = _SUB_PATH.match(message)
        if match is None:
            problems.append(Problem(path, message))
        else:
            problems.append(Problem((*path, *_parse_path(match.group(1))), message[match.end() :]))
        return _INVALID
    return obj


def _parse_path(text: str) -> Path:
    """``"paths[0].optional"`` -> ``("paths", 0, "optional")``."""
    out: list[int | str] = []
    for name, index in re.findall(r"([^.\[\]]+)|\[(\d+)\]", text):
        out.append(int(index) if index else name)
    return tuple(out)

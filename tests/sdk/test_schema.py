"""plugin/schema.py on its own: strict types, every problem with its path, the round trip."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, Literal

import pytest

from kubedevice.plugin.schema import (
    Before,
    Check,
    Ge,
    Le,
    MinLen,
    Model,
    SchemaError,
    build,
    dump,
    loc_text,
)
from kubedevice.yamlfile import HugeInt


@dataclass(frozen=True, kw_only=True)
class Inner(Model):
    pair: tuple[int, int] = (0, 0)
    level: Literal["low", "high"] | None = None


def _upper(value: str) -> str:
    if not value:
        raise ValueError("must not be empty")
    return value.upper()


@dataclass(frozen=True, kw_only=True)
class Outer(Model):
    max_count: Annotated[int, Ge(1), Le(10)]
    ratio: float = 1.0
    name: Annotated[str, Check(_upper)] = "X"
    tags: Annotated[list[str], MinLen(1)] = field(default_factory=lambda: ["t"])
    by_code: dict[int, str] = field(default_factory=dict)
    inner: Inner = field(default_factory=Inner)
    extra: Any = None
    size: Annotated[int, Before(lambda v: len(v) if isinstance(v, str) else v)] = 0

    def check(self) -> None:
        if self.name == "BAD":
            raise ValueError("tags[0]: not with the name BAD")


@dataclass(frozen=True, kw_only=True)
class Snake(Model):
    camel_keys: ClassVar[bool] = False
    gi_id: int


def _problems(data: Any, cls: type[Model] = Outer) -> list[str]:
    with pytest.raises(SchemaError) as info:
        build(cls, data)
    return [f"{loc_text(p.path)}: {p.message}" for p in info.value.problems]


def test_a_valid_document_builds_and_dumps_back() -> None:
    data = {
        "maxCount": 3,
        "ratio": 2,
        "name": "ab",
        "tags": ["a", "b"],
        "byCode": {79: "x"},
        "inner": {"pair": [1, 2], "level": "low"},
        "extra": {"any": ["thing"]},
        "size": "four",
    }
    obj = build(Outer, data)
    assert isinstance(obj.ratio, float)
    assert (obj.name, obj.inner.pair, obj.size) == ("AB", (1, 2), 4)
    assert dump(obj) == {
        **data,
        "ratio": 2.0,
        "name": "AB",
        "inner": {"pair": [1, 2], "level": "low"},
        "size": 4,
    }


def test_every_problem_is_reported_with_its_path_in_field_order() -> None:
    assert _problems(
        {
            "maxCount": 0,
            "ratio": True,
            "tags": [],
            "byCode": {"7": 1},
            "inner": {"pair": [1]},
            "x": 1,
        }
    ) == [
        "maxCount: must be >= 1 (got 0)",
        "ratio: expected a number (got True)",
        "tags: must have at least 1 item(s) (got 0)",
        "byCode: key '7' must be an integer (write 7 without quotes)",
        "inner.pair: expected a list of 2 items (got a list)",
        "x: unknown key (allowed: byCode, extra, inner, maxCount, name, ratio, size, tags)",
    ]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({}, "maxCount: required field is missing"),
        ({"maxCount": "3"}, "maxCount: expected an integer (got '3')"),
        ({"maxCount": 1.0}, "maxCount: expected an integer (got 1.0)"),
        ({"maxCount": HugeInt(40)}, "maxCount: out of range (got an integer of 40 digits)"),
        ({"maxCount": 10**5000}, "maxCount: must be <= 10 (got an integer of about 5001 digits)"),
        (
            {"maxCount": 1, "ratio": 10**400},
            "ratio: out of range (got an integer of about 401 digits)",
        ),
        ({"maxCount": 1, "ratio": float("nan")}, "ratio: must be a finite number (got nan)"),
        ({"maxCount": 1, "name": ""}, "name: must not be empty"),
        (
            {"maxCount": 1, "inner": {"level": "mid"}},
            "inner.level: must be 'low' or 'high' (got 'mid')",
        ),
        ({"maxCount": 1, "inner": []}, "inner: expected a mapping (got a list)"),
        ({"maxCount": 1, 5: 1}, "(top level): key 5 must be a string"),
        ({"maxCount": 1, "name": "bad"}, "tags[0]: not with the name BAD"),
    ],
)
def test_one_problem(data: Any, message: str) -> None:
    assert _problems(data) == [message]


def test_snake_case_models_use_the_field_names() -> None:
    assert build(Snake, {"gi_id": 2}).gi_id == 2
    assert _problems({"giId": 2}, Snake) == [
        "gi_id: required field is missing",
        "giId: unknown key (allowed: gi_id)",
    ]

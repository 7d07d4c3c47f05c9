"""Stable ID sanitising and the ``{name}`` template syntax."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, strategies as st

from kubedevice.generic.ids import replica_id, sanitize_id, split_replica
from kubedevice.generic.templates import ENV_VARIABLES, Template, TemplateError

_ID = re.compile(r"[A-Za-z0-9._-]{1,63}")


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("ttyUSB0", "ttyUSB0"), ("dri/renderD128", "dri-renderD128"), ("/fuse", "fuse")],
)
def test_sanitize_plain(raw: str, expected: str) -> None:
    assert sanitize_id(raw) == expected


@given(st.text(min_size=1, max_size=200))
def test_sanitize_is_valid_and_deterministic(raw: str) -> None:
    out = sanitize_id(raw)
    assert _ID.fullmatch(out)
    assert sanitize_id(raw) == out


def test_lossy_inputs_do_not_collide() -> None:
    assert sanitize_id("a/b-c") != sanitize_id("a-b/c")
    assert sanitize_id("a b") != sanitize_id("a_b")
    assert sanitize_id("x" * 100) != sanitize_id("x" * 101)


def test_replicas_round_trip() -> None:
    assert replica_id("fuse", 3, 10) == "fuse::3"
    assert replica_id("fuse", 0, 1) == "fuse"
    assert split_replica("fuse::3") == ("fuse", 3)
    assert split_replica("fuse") == ("fuse", 0)


def test_template_render_and_escapes() -> None:
    tpl = Template.parse("{{ids}}={ids};n={count}", ENV_VARIABLES)
    assert tpl.variables == {"ids", "count"}
    assert tpl.render({"ids": "a,b", "count": "2"}) == "{ids}=a,b;n=2"


@pytest.mark.parametrize(
    ("source", "message"),
    [
        (
            "{bad}",
            "unknown template variable {bad}; expected one of {count}, {devices}, "
            "{hostPaths}, {ids}, {paths}, {resource}",
        ),
        (
            "{ids.__class__}",
            "unknown template variable {ids.__class__}; expected one of "
            "{count}, {devices}, {hostPaths}, {ids}, {paths}, {resource}",
        ),
        ("a}", "unbalanced '}' at offset 1 (write }} for a literal brace)"),
    ],
)
def test_template_errors(source: str, message: str) -> None:
    with pytest.raises(TemplateError) as info:
        Template.parse(source, ENV_VARIABLES)
    assert str(info.value) == message

"""Manifest parsing and the API server's validation messages."""

from __future__ import annotations

import json
from fractions import Fraction
from typing import Any

import pytest
from kubelet_helpers import pod_manifest

from kubedevice.errors import ManifestError
from kubedevice.kubelet.pods import format_quantity, load_manifests, parse_pod, parse_quantity

R = "example.com/foo"


def _with_resources(resources: dict[str, Any], field: str = "containers") -> dict[str, Any]:
    return {
        "kind": "Pod",
        "metadata": {"name": "p"},
        "spec": {
            "containers": [{"name": "c", "image": "x", "resources": resources}]
            if field == "containers"
            else [{"name": "app", "image": "x"}],
            **(
                {"initContainers": [{"name": "c", "image": "x", "resources": resources}]}
                if field == "initContainers"
                else {}
            ),
        },
    }


@pytest.mark.parametrize(
    ("resources", "message"),
    [
        (
            {"limits": {R: 2}, "requests": {R: 1}},
            'Pod "p" is invalid: spec.containers[0].resources.requests: '
            'Invalid value: "1": must be equal to example.com/foo limit of 2',
        ),
        (
            {"limits": {R: "500m"}},
            'Pod "p" is invalid: spec.containers[0].resources.limits[example.com/foo]: '
            "Invalid value: resource.Quantity{i:resource.int64Amount{value:500, scale:-3}, "
            'd:resource.infDecAmount{Dec:(*inf.Dec)(nil)}, s:"500m", Format:"DecimalSI"}: '
            "must be an integer",
        ),
        (
            {"limits": {R: 0.5}, "requests": {R: 0.5}},
            'Pod "p" is invalid: [spec.containers[0].resources.limits[example.com/foo]: '
            "Invalid value: resource.Quantity{i:resource.int64Amount{value:5, scale:-1}, "
            'd:resource.infDecAmount{Dec:(*inf.Dec)(nil)}, s:"", Format:"DecimalSI"}: '
            "must be an integer, spec.containers[0].resources.requests[example.com/foo]: "
            "Invalid value: resource.Quantity{i:resource.int64Amount{value:5, scale:-1}, "
            'd:resource.infDecAmount{Dec:(*inf.Dec)(nil)}, s:"", Format:"DecimalSI"}: '
            "must be an integer]",
        ),
        (
            {"limits": {R: -1}},
            'Pod "p" is invalid: spec.containers[0].resources.limits[example.com/foo]: '
            'Invalid value: "-1": must be greater than or equal to 0',
        ),
        (
            {"requests": {R: 1}},
            'Pod "p" is invalid: spec.containers[0].resources.limits: Required value: '
            "Limit must be set for non overcommitable resources",
        ),
        (
            {"limits": {R: "abc"}},
            'Pod "p" is invalid: spec.containers[0].resources.limits[example.com/foo]: '
            'Invalid value: "abc": quantities must match the regular expression '
            "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'",
        ),
        (
            {"limits": {"Example.com/foo": 1}},
            'Pod "p" is invalid: spec.containers[0].resources.limits[Example.com/foo]: '
            'Invalid value: "Example.com/foo": doesn\'t follow extended resource name standard',
        ),
    ],
    ids=[
        "req-ne-limit",
        "fraction",
        "fraction-both",
        "negative",
        "request-only",
        "bad-qty",
        "bad-name",
    ],
)
def test_validation_messages(resources: dict[str, Any], message: str) -> None:
    with pytest.raises(ManifestError) as err:
        parse_pod(_with_resources(resources))
    assert str(err.value) == message


def test_init_container_path() -> None:
    with pytest.raises(ManifestError, match=r"spec\.initContainers\[0\]\.resources\.limits"):
        parse_pod(_with_resources({"limits": {R: -2}}, "initContainers"))


def test_limits_only_and_cpu_ignored() -> None:
    spec = parse_pod(
        _with_resources({"limits": {R: "2", "cpu": "500m"}, "requests": {R: 2, "cpu": "100m"}})
    )
    assert spec.containers[0].limits == {R: 2}
    assert spec.namespace == "default"
    assert spec.uid


def test_kinds_and_order() -> None:
    spec = parse_pod(
        pod_manifest("p", init=[("i", {})], sidecars=[("s", {})], containers=[("a", {})])
    )
    assert [(c.name, c.kind) for c in spec.containers] == [
        ("i", "init"),
        ("s", "sidecar"),
        ("a", "app"),
    ]


@pytest.mark.parametrize(
    ("manifest", "fragment"),
    [
        (
            {"kind": "Pod", "metadata": {}, "spec": {"containers": [{"name": "c"}]}},
            "metadata.name: Required value",
        ),
        ({"kind": "Pod", "metadata": {"name": "p"}, "spec": {}}, "spec.containers: Required value"),
        (
            {
                "kind": "Pod",
                "metadata": {"name": "p"},
                "spec": {"containers": [{"name": "c"}, {"name": "c"}]},
            },
            'spec.containers[1].name: Duplicate value: "c"',
        ),
        ({"kind": "Deployment", "metadata": {"name": "p"}}, 'only kind "Pod" is supported'),
        (
            {
                "kind": "Pod",
                "metadata": {"name": "Bad_Name"},
                "spec": {"containers": [{"name": "c"}]},
            },
            "RFC 1123 subdomain",
        ),
    ],
)
def test_other_validation(manifest: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ManifestError) as err:
        parse_pod(manifest)
    assert fragment in str(err.value)


def test_load_multi_document_yaml_and_json() -> None:
    text = "kind: Pod\nmetadata: {name: a}\n---\nkind: Pod\nmetadata: {name: b}\n"
    assert [d["metadata"]["name"] for d in load_manifests(text)] == ["a", "b"]
    assert load_manifests(json.dumps({"kind": "List", "items": [{"kind": "Pod"}]})) == [
        {"kind": "Pod"}
    ]
    with pytest.raises(ManifestError):
        load_manifests("a: [unclosed")
    with pytest.raises(ManifestError):
        load_manifests("")


@pytest.mark.parametrize(
    ("raw", "text"),
    [
        ("1", "1"),
        (2, "2"),
        ("1000", "1k"),
        ("1500", "1500"),
        ("0.5", "500m"),
        ("2Ki", "2Ki"),
        ("1e3", "1e3"),
    ],
)
def test_quantity_canonical(raw: Any, text: str) -> None:
    assert format_quantity(parse_quantity(raw)) == text


@pytest.mark.timeout(20)
@pytest.mark.parametrize(
    ("raw", "value"),
    [
        ("1e999999999", 2**63 - 1),  # computing 10**999999999 would hang the emulator
        ("-1e999999999", -(2**63 - 1)),
        (10**30, 2**63 - 1),
        ("99999999999999999999Ei", 2**63 - 1),
        ("1e-999999999", Fraction(1, 10**9)),  # rounded up to 1n, like ParseQuantity
        ("1e-12", Fraction(1, 10**9)),
        ("9223372036854775807", 2**63 - 1),
    ],
)
def test_quantities_capped_like_the_api_server(raw: Any, value: Fraction) -> None:
    assert parse_quantity(raw).value == value


def test_huge_limit_is_capped_and_exponent_overflow_refused() -> None:
    spec = parse_pod(_with_resources({"limits": {R: "1e999999999"}}))
    assert spec.containers[0].limits == {R: 2**63 - 1}
    with pytest.raises(ManifestError, match="unable to parse quantity's suffix"):
        parse_pod(_with_resources({"limits": {R: "1e99999999999"}}))
    with pytest.raises(ManifestError, match="must be an integer"):
        parse_pod(_with_resources({"limits": {R: "1e-999999999"}}))


def test_non_string_resource_name_is_a_validation_error() -> None:
    with pytest.raises(ManifestError) as err:
        parse_pod(_with_resources({"limits": {1: 2}}))  # YAML `1: 2` gives an int key
    assert str(err.value) == (
        'Pod "p" is invalid: spec.containers[0].resources.limits[1]: '
        'Invalid value: "1": must be a standard resource for containers'
    )


def test_hugepages_request_needs_a_limit() -> None:
    # IsOvercommitAllowed is false for huge pages as for extended resources
    with pytest.raises(ManifestError, match="Limit must be set for non overcommitable"):
        parse_pod(_with_resources({"requests": {"hugepages-2Mi": "2Mi"}}))
    spec = parse_pod(_with_resources({"requests": {"cpu": 1}}))  # cpu may be overcommitted
    assert spec.containers[0].limits == {}


def test_manifest_uid_is_ignored() -> None:
    m = pod_manifest("p", {R: 1})
    m["metadata"]["uid"] = "same"
    a, b = parse_pod(m), parse_pod(m)
    assert "same" not in (a.uid, b.uid)  # the API server assigns a fresh UID on create
    assert a.uid != b.uid


def test_aliasing_limit_counts_every_document() -> None:
    # each document expands to about 300,000 nodes (under the limit); four together exceed it
    doc = "a: &a [0,0,0,0,0,0,0,0]\n" + "".join(
        f"{c}: &{c} [{','.join([f'*{p}'] * 8)}]\n" for p, c in zip("abcde", "bcdef", strict=True)
    )
    assert len(load_manifests(doc)) == 1
    with pytest.raises(ManifestError, match="excessive aliasing"):
        load_manifests("---\n".join([doc] * 4))

"""Config validation: every error names the file, the field path and what was expected."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kubedevice.errors import ConfigError
from kubedevice.generic import load_config, parse_config
from kubedevice.generic.config import Config

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _generic_examples() -> list[Path]:
    """``examples/*.yaml`` except Kubernetes manifests (``apiVersion:``), e.g. pod specs."""
    return [
        p
        for p in sorted(EXAMPLES.glob("*.yaml"))
        if "\napiVersion:" not in "\n" + p.read_text(encoding="utf-8")
    ]


def _res(**group: Any) -> dict[str, Any]:
    g: dict[str, Any] = {"paths": [{"path": "/dev/x"}]}
    g.update(group)
    return {"version": "v1", "resources": [{"name": "example.com/x", "groups": [g]}]}


def _with(res: dict[str, Any], **top: Any) -> dict[str, Any]:
    out = _res()
    out["resources"][0].update(res)
    out.update(top)
    return out


BAD: list[tuple[str, Any, str]] = [
    ("not-a-mapping", [1, 2], "c.yaml: (top level): expected a mapping (got a list)"),
    (
        "bad-version",
        {"version": "v2", "resources": []},
        "c.yaml: version: unsupported version 'v2' (supported: 'v1')",
    ),
    (
        "missing-version",
        {"resources": [{"name": "example.com/x", "groups": [{"paths": [{"path": "/dev/x"}]}]}]},
        "c.yaml: version: required field is missing",
    ),
    (
        "no-resources",
        {"version": "v1", "resources": []},
        "c.yaml: resources: must have at least 1 item(s) (got 0)",
    ),
    (
        "unknown-top-key",
        {**_res(), "devroot": "/x"},
        "c.yaml: devroot: unknown key (allowed: devRoot, evictOn, keepUnhealthySeconds, resources, "
        "sysRoot, version)",
    ),
    (
        "unknown-group-key",
        _res(cont=1),
        "c.yaml: resources[0].groups[0].cont: unknown key (allowed: annotations, cdiDevices, "
        "count, envs, health, mounts, name, paths, perMatch, shares, usb)",
    ),
    ("count-zero", _res(count=0), "c.yaml: resources[0].groups[0].count: must be >= 1 (got 0)"),
    (
        "count-string",
        _res(count="2"),
        "c.yaml: resources[0].groups[0].count: expected an integer (got '2')",
    ),
    (
        "bad-resource-name",
        _with({"name": "Example.com/x"}),
        "c.yaml: resources[0].name: the domain 'Example.com' is not a DNS-1123 subdomain "
        "(lower-case a-z, 0-9, '-' and '.', starting and ending with an alphanumeric character)",
    ),
    (
        "resource-name-no-domain",
        _with({"name": "serial"}),
        "c.yaml: resources[0].name: it has no domain: an extended resource name looks like "
        "'example.com/name'",
    ),
    (
        "path-outside-dev",
        _res(paths=[{"path": "/etc/passwd"}]),
        "c.yaml: resources[0].groups[0].paths[0].path: must be a path under /dev/ "
        "(got '/etc/passwd')",
    ),
    (
        "path-relative",
        _res(paths=[{"path": "ttyUSB0"}]),
        "c.yaml: resources[0].groups[0].paths[0].path: must be an absolute path under /dev "
        "(got 'ttyUSB0')",
    ),
    (
        "path-dotdot",
        _res(paths=[{"path": "/dev/../etc/x"}]),
        "c.yaml: resources[0].groups[0].paths[0].path: must not contain '..' (got '/dev/../etc/x')",
    ),
    (
        "bad-permissions",
        _res(paths=[{"path": "/dev/x", "permissions": "rx"}]),
        "c.yaml: resources[0].groups[0].paths[0].permissions: must be a non-empty combination of "
        "'r', 'w', 'm' (got 'rx')",
    ),
    (
        "no-paths-no-usb",
        _res(paths=[]),
        "c.yaml: resources[0].groups[0]: needs exactly one of 'paths' or 'usb'",
    ),
    (
        "paths-and-usb",
        _res(usb=[{"vendor": "0403"}]),
        "c.yaml: resources[0].groups[0]: needs exactly one of 'paths' or 'usb'",
    ),
    (
        "usb-vendor-int",
        _res(paths=[], usb=[{"vendor": 403}]),
        "c.yaml: resources[0].groups[0].usb[0].vendor: expected a string (got 403)",
    ),
    (
        "usb-vendor-hex",
        _res(paths=[], usb=[{"vendor": "04g3"}]),
        "c.yaml: resources[0].groups[0].usb[0].vendor: must be 4 hexadecimal digits, e.g. '0403' "
        "(got '04g3')",
    ),
    (
        "env-unknown-var",
        _res(envs={"A": "{foo}"}),
        "c.yaml: resources[0].groups[0].envs.A: unknown template variable {foo}; expected one of "
        "{count}, {devices}, {hostPaths}, {ids}, {paths}, {resource}",
    ),
    (
        "env-unbalanced",
        _res(envs={"A": "x{ids"}),
        "c.yaml: resources[0].groups[0].envs.A: unbalanced '{' at offset 1 (write {{ for a literal "
        "brace)",
    ),
    (
        "env-bad-name",
        _res(envs={"1A": "x"}),
        "c.yaml: resources[0].groups[0].envs: '1A' is not a valid environment variable name",
    ),
    (
        "cdi-unknown-var",
        _res(cdiDevices=["v.com/c={ids}"]),
        "c.yaml: resources[0].groups[0].cdiDevices[0]: unknown template variable {ids}; expected "
        "one of {id}, {name}",
    ),
    (
        "health-empty",
        _res(health={"periodSeconds": 1}),
        "c.yaml: resources[0].groups[0].health: needs 'sysfsAttribute' or 'command'",
    ),
    (
        "health-period",
        _res(health={"periodSeconds": 0, "command": {"argv": ["true"]}}),
        "c.yaml: resources[0].groups[0].health.periodSeconds: must be >= 0.01 (got 0)",
    ),
    (
        "health-argv-empty",
        _res(health={"command": {"argv": []}}),
        "c.yaml: resources[0].groups[0].health.command.argv: must have at least 1 item(s) (got 0)",
    ),
    (
        "health-timeout",
        _res(health={"command": {"argv": ["true"], "timeoutSeconds": -1}}),
        "c.yaml: resources[0].groups[0].health.command.timeoutSeconds: must be > 0 (got -1)",
    ),
    (
        "sysfs-outside",
        _res(health={"sysfsAttribute": {"path": "/proc/x", "expect": "1"}}),
        "c.yaml: resources[0].groups[0].health.sysfsAttribute.path: must be a path under /sys/ "
        "(got '/proc/x')",
    ),
    (
        "placement",
        _with({"placement": "random"}),
        "c.yaml: resources[0].placement: must be 'spread' or 'pack' (got 'random')",
    ),
    ("limit-zero", _with({"limit": 0}), "c.yaml: resources[0].limit: must be >= 1 (got 0)"),
    (
        "no-groups",
        _with({"groups": []}),
        "c.yaml: resources[0].groups: must have at least 1 item(s) (got 0)",
    ),
    (
        "group-name",
        _res(name="-bad"),
        "c.yaml: resources[0].groups[0].name: must be 1-32 characters of [A-Za-z0-9._-], starting "
        "and ending alphanumeric (got '-bad')",
    ),
    (
        "check-argv-unknown-var",
        _res(health={"command": {"argv": ["check", "{ids}"]}}),
        "c.yaml: resources[0].groups[0].health.command.argv[1]: unknown template variable {ids}; "
        "expected one of {id}, {name}, {path}",
    ),
    (
        "annotation-unknown-var",
        _res(annotations={"example.com/a": "{nope}"}),
        "c.yaml: resources[0].groups[0].annotations.example.com/a: unknown template variable "
        "{nope}; expected one of {count}, {devices}, {hostPaths}, {ids}, {paths}, {resource}",
    ),
    (
        "optional-primary",
        _res(paths=[{"path": "/dev/x", "optional": True}]),
        "c.yaml: resources[0].groups[0].paths[0].optional: must be false: with perMatch, "
        "paths[0] is the per-device path",
    ),
    (
        "shared-glob-container-path",
        _res(perMatch=False, paths=[{"path": "/dev/video*", "containerPath": "/dev/video"}]),
        "c.yaml: resources[0].groups[0].paths[0].containerPath: must contain {name} because the "
        "glob can match several nodes of one device",
    ),
    (
        "mount-relative",
        _res(mounts=[{"hostPath": "x", "containerPath": "/x"}]),
        "c.yaml: resources[0].groups[0].mounts[0].hostPath: must be an absolute path (got 'x')",
    ),
    (
        "mount-missing",
        _res(mounts=[{"hostPath": "/x"}]),
        "c.yaml: resources[0].groups[0].mounts[0].containerPath: required field is missing",
    ),
    (
        "dup-group",
        _with(
            {
                "groups": [
                    {"name": "g", "paths": [{"path": "/dev/a"}]},
                    {"name": "g", "paths": [{"path": "/dev/b"}]},
                ]
            }
        ),
        "c.yaml: resources[0].groups[1]: duplicate group name 'g'",
    ),
    (
        "dup-resource",
        {"version": "v1", "resources": [_res()["resources"][0]] * 2},
        "c.yaml: resources[1].name: duplicate resource name 'example.com/x'",
    ),
    (
        "keep-negative",
        {**_res(), "keepUnhealthySeconds": -1},
        "c.yaml: keepUnhealthySeconds: must be >= 0 (got -1)",
    ),
    (
        "snake-case-key",
        _res(per_match=False),
        "c.yaml: resources[0].groups[0].per_match: unknown key (allowed: annotations, cdiDevices, "
        "count, envs, health, mounts, name, paths, perMatch, shares, usb)",
    ),
    (
        "dev-root-relative",
        {**_res(), "devRoot": "dev"},
        "c.yaml: devRoot: must be an absolute path (got 'dev')",
    ),
    (
        "keep-infinite",
        {**_res(), "keepUnhealthySeconds": float("inf")},
        "c.yaml: keepUnhealthySeconds: must be a finite number (got inf)",
    ),
    (
        "container-path-template",
        _res(paths=[{"path": "/dev/x", "containerPath": "/dev/{bad}"}]),
        "c.yaml: resources[0].groups[0].paths[0].containerPath: unknown template variable {bad}; "
        "expected one of {id}, {name}",
    ),
    (
        "container-path-relative",
        _res(paths=[{"path": "/dev/x", "containerPath": "x"}]),
        "c.yaml: resources[0].groups[0].paths[0].containerPath: must be an absolute path (got 'x')",
    ),
    (
        "sysfs-template",
        _res(health={"sysfsAttribute": {"path": "/sys/{ids}", "expect": "1"}}),
        "c.yaml: resources[0].groups[0].health.sysfsAttribute.path: unknown template variable "
        "{ids}; expected one of {id}, {name}, {path}",
    ),
    (
        "argv-template",
        _res(health={"command": {"argv": ["x", "{count}"]}}),
        "c.yaml: resources[0].groups[0].health.command.argv[1]: unknown template variable {count}; "
        "expected one of {id}, {name}, {path}",
    ),
    (
        "count-too-big",
        _res(count=10001),
        "c.yaml: resources[0].groups[0].count: must be <= 10000 (got 10001)",
    ),
    (
        "bool-type",
        _res(perMatch="yes"),
        "c.yaml: resources[0].groups[0].perMatch: expected true or false (got 'yes')",
    ),
    (
        "list-type",
        _res(paths="x"),
        "c.yaml: resources[0].groups[0].paths: expected a list (got 'x')",
    ),
    (
        "mapping-type",
        _res(health=5),
        "c.yaml: resources[0].groups[0].health: expected a mapping (got 5)",
    ),
    (
        "dict-type",
        _res(envs=[]),
        "c.yaml: resources[0].groups[0].envs: expected a mapping (got a list)",
    ),
    (
        "number-type",
        _res(health={"periodSeconds": "x", "command": {"argv": ["x"]}}),
        "c.yaml: resources[0].groups[0].health.periodSeconds: expected a number (got 'x')",
    ),
    (
        "mount-dotdot",
        _res(mounts=[{"hostPath": "/a/../b", "containerPath": "/x"}]),
        "c.yaml: resources[0].groups[0].mounts[0].hostPath: must not contain '..' (got '/a/../b')",
    ),
    (
        "usb-product-hex",
        _res(paths=[], usb=[{"vendor": "0403", "product": "xyz"}]),
        "c.yaml: resources[0].groups[0].usb[0].product: must be 4 hexadecimal digits, e.g. '0403' "
        "(got 'xyz')",
    ),
    (
        "resource-not-mapping",
        {"version": "v1", "resources": [5]},
        "c.yaml: resources[0]: expected a mapping (got 5)",
    ),
]


@pytest.mark.parametrize(
    ("data", "message"), [(d, m) for _, d, m in BAD], ids=[i for i, _, _ in BAD]
)
def test_bad_config_message(data: Any, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(data, "c.yaml")
    assert str(info.value) == message


def test_several_errors_are_all_reported() -> None:
    data = _res(count=0, envs={"A": "{nope}"})
    with pytest.raises(ConfigError) as info:
        parse_config(data, "c.yaml")
    lines = str(info.value).splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("c.yaml: resources[0].groups[0].envs.A: unknown template variable")
    assert lines[1] == "c.yaml: resources[0].groups[0].count: must be >= 1 (got 0)"


def test_load_config_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(
        "version: v1\nresources:\n  - name: example.com/x\n    groups:\n"
        "      - paths: [{path: /dev/x}]\n        count: 0\n"
    )
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == f"{path}: resources[0].groups[0].count: must be >= 1 (got 0)"


def test_yaml_syntax_error(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("version: v1\nresources: [\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value).startswith(f"{path}: invalid YAML at line 3, column 1: ")


def test_yaml_duplicate_key_is_refused(tmp_path: Path) -> None:
    # PyYAML would silently keep the second 'resources' list and drop the first.
    path = tmp_path / "c.yaml"
    group = "    groups: [{paths: [{path: /dev/a}]}]\n"
    path.write_text(
        "version: v1\nresources:\n  - name: example.com/a\n"
        + group
        + "resources:\n  - name: example.com/b\n"
        + group
    )
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == f"{path}: invalid YAML at line 5, column 1: duplicate key 'resources'"


def test_yaml_merge_keys_may_be_overridden(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        "version: v1\nresources:\n  - name: example.com/a\n    groups:\n"
        "      - &base {paths: [{path: /dev/a}], count: 2}\n"
        "      - {<<: *base, name: b, count: 3}\n"
    )
    cfg = load_config(path)
    assert [g.count for g in cfg.resources[0].groups] == [2, 3]


def test_non_utf8_file(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_bytes(b"version: v1\n\xff\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == f"{path}: not UTF-8 text: invalid byte at offset 12"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        pytest.param(
            {**_res(), 1: 2}, "c.yaml: (top level): key 1 must be a string", id="top-level"
        ),
        pytest.param(
            _res(envs={1: "x"}),
            "c.yaml: resources[0].groups[0].envs: key 1 must be a string",
            id="envs",
        ),
    ],
)
def test_non_string_keys(data: Any, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(data, "c.yaml")
    assert str(info.value) == message


def test_empty_and_missing_file(tmp_path: Path) -> None:
    empty = tmp_path / "e.yaml"
    empty.write_text("")
    with pytest.raises(ConfigError) as info:
        load_config(empty)
    assert str(info.value) == (
        f"{empty}: (top level): empty file; expected a mapping with 'version' and 'resources'"
    )
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "missing.yaml")
    assert str(info.value) == f"{tmp_path / 'missing.yaml'}: cannot read: No such file or directory"


def test_defaults_and_camel_case() -> None:
    cfg = parse_config(_res(perMatch=False, cdiDevices=["v.com/c={name}"]))
    group = cfg.resources[0].groups[0]
    assert (cfg.dev_root, cfg.sys_root) == ("/dev", "/sys")
    assert cfg.keep_unhealthy_seconds == 3600
    assert group.per_match is False
    assert group.count == 1
    assert group.paths[0].permissions == "rw"
    assert cfg.resources[0].placement == "spread"


def test_usb_ids_are_lowercased() -> None:
    cfg = parse_config(_res(paths=[], usb=[{"vendor": "0A5C", "product": "21E8"}]))
    assert cfg.resources[0].groups[0].usb[0].vendor == "0a5c"
    assert cfg.resources[0].groups[0].usb[0].product == "21e8"


def test_with_roots_overrides() -> None:
    cfg = parse_config(_res())
    assert cfg.with_roots("/tmp/d", None).dev_root == "/tmp/d"
    assert cfg.with_roots(None, "/tmp/s").sys_root == "/tmp/s"
    assert cfg.with_roots().dev_root == "/dev"


@pytest.mark.parametrize("example", _generic_examples(), ids=lambda p: p.name)
def test_examples_are_valid(example: Path) -> None:
    assert isinstance(load_config(example), Config)


async def test_reload_without_a_file_is_refused() -> None:
    from kubedevice.generic import GenericPlugins

    plugins = GenericPlugins(parse_config(_res()))
    with pytest.raises(ConfigError, match="no config file to reload from"):
        await plugins.reload()


@pytest.mark.parametrize("digits", [40, 1000, 5000])
@pytest.mark.parametrize(
    ("where", "field"),
    [
        ("    count: {n}\n", "resources[0].groups[0].count"),
        ("    health: {{periodSeconds: {n}, command: {{argv: [x]}}}}\n", "periodSeconds"),
        ("  limit: -{n}\n", "resources[0].limit"),
    ],
)
def test_huge_integer_is_one_line_naming_the_field(
    tmp_path: Path, digits: int, where: str, field: str
) -> None:
    path = tmp_path / "c.yaml"
    body = where.format(n="9" * digits)
    group = "  - paths: [{path: /dev/x}]\n" + (body if not body.startswith("  limit") else "")
    top = body if body.startswith("  limit") else ""
    path.write_text(
        "version: v1\nresources:\n- name: example.com/x\n" + top + "  groups:\n" + group
    )
    with pytest.raises(ConfigError) as info:
        load_config(path)
    text = str(info.value)
    assert len(text.splitlines()) == 1
    assert field in text
    assert f"an integer of {digits} digits" in text
    assert len(text) < 300


def test_resource_names_sharing_a_socket_name_are_refused() -> None:
    doc = _res()
    doc["resources"].append({**doc["resources"][0]})
    doc["resources"][0]["name"] = "example.com/a-b"
    doc["resources"][1]["name"] = "example.com-a/b"
    with pytest.raises(ConfigError) as info:
        parse_config(doc, "c.yaml")
    assert str(info.value) == (
        "c.yaml: resources[1].name: 'example.com-a/b' maps to the socket name "
        "'example.com-a-b.sock', like 'example.com/a-b'; rename one of them"
    )


def test_limit_times_count_that_cannot_fit_the_kubelets_message_is_refused() -> None:
    doc = _res(count=10000)
    doc["resources"][0]["limit"] = 1000
    with pytest.raises(ConfigError) as info:
        parse_config(doc, "c.yaml")
    assert str(info.value).startswith(
        "c.yaml: resources[0].limit: 1000 devices x count 10000 = 10000000 device IDs can "
        "exceed the kubelet's 4 MiB ListAndWatch message"
    )
    doc = _res(count=10000)
    doc["resources"][0]["limit"] = 4  # 40,000 IDs always fit
    parse_config(doc, "c.yaml")


def _alias_bomb(levels: int) -> str:
    lines = ['l0: &l0 ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    for i in range(1, levels):
        lines.append(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]")
    return "\n".join(lines) + f"\nversion: v1\nresources: *l{levels - 1}\n"


def test_yaml_alias_bomb_is_refused_before_it_is_built(tmp_path: Path) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(_alias_bomb(9))  # 9**9 (387 million) strings from a 400-byte file
    assert path.stat().st_size < 1000
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == (f"{path}: aliases expand it to more than 100,000 nodes; refused")


def test_self_referencing_alias_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "loop.yaml"
    path.write_text("version: v1\nresources: &r [*r]\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value).startswith(f"{path}: ")
    assert len(str(info.value).splitlines()) == 1


def test_anchors_and_merge_keys_in_a_real_config_still_work(tmp_path: Path) -> None:
    path = tmp_path / "anchors.yaml"
    path.write_text(
        "version: v1\n"
        "resources:\n"
        "- name: example.com/a\n"
        "  groups: &g\n"
        "  - paths: [{path: /dev/x}]\n"
        "- name: example.com/b\n"
        "  groups: *g\n"
    )
    cfg = load_config(path)
    assert [r.name for r in cfg.resources] == ["example.com/a", "example.com/b"]


def test_a_long_list_is_too_large_not_an_alias_bomb(tmp_path: Path) -> None:
    path = tmp_path / "long.yaml"
    items = "".join(f"- d{i}\n" for i in range(300_000))
    path.write_text("version: v1\nresources:\n" + items)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    text = str(info.value)
    assert "alias" not in text
    assert text == (
        f"{path}: too large: more than 100,000 values (lists, mappings and scalars); refused"
    )


@pytest.mark.parametrize(
    ("group", "field"),
    [
        ({"count": 10**5000}, "resources[0].groups[0].count: must be <= 10000"),
        ({"envs": {"A": 10**5000}}, "resources[0].groups[0].envs.A: expected a string"),
        ({"envs": {10**5000: "x"}}, "resources[0].groups[0].envs: key an integer of"),
        (
            {"health": {"periodSeconds": 10**5000, "command": {"argv": ["x"]}}},
            "resources[0].groups[0].health.periodSeconds: out of range",
        ),
    ],
    ids=["count", "env-value", "env-key", "period"],
)
def test_huge_python_integers_never_show_pythons_own_hint(
    group: dict[str, Any], field: str
) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(_res(**group), "c.yaml")
    text = str(info.value)
    assert "set_int_max_str_digits" not in text
    assert text.startswith(f"c.yaml: {field}")
    assert "an integer of about 5001 digits" in text
    assert len(text.splitlines()) == 1


@pytest.mark.parametrize(
    ("health", "message"),
    [
        (
            {"periodSeconds": 1e-9, "command": {"argv": ["true"]}},
            "c.yaml: resources[0].groups[0].health.periodSeconds: must be >= 0.01 (got 1e-09)",
        ),
        (
            {"periodSeconds": 0.001, "sysfsAttribute": {"path": "/sys/x", "expect": "1"}},
            "c.yaml: resources[0].groups[0].health.periodSeconds: must be >= 0.01 (got 0.001)",
        ),
    ],
    ids=["command", "sysfs"],
)
def test_health_periods_that_would_busy_a_core_are_refused(
    health: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(_res(health=health), "c.yaml")
    assert str(info.value) == message

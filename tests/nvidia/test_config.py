"""The GPU plugin's YAML config: defaults, NVIDIA option names, one-line errors naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from kubedevice.errors import ConfigError
from kubedevice.nvidia.config import load_config, parse_config, parse_duration


def test_defaults_without_a_file() -> None:
    cfg = load_config(None)
    assert cfg.flags.mig_strategy == "none"
    assert cfg.flags.fail_on_init_error is True
    assert cfg.flags.device_list_strategy == ["envvar"]
    assert cfg.flags.device_id_strategy == "uuid"
    assert cfg.health.policy_for_xid(13) == "ignore"
    assert cfg.health.policy_for_xid(79) == "reset"
    assert cfg.health.policy_for_xid(48) == "quiet"  # not listed: the default policy
    assert cfg.sharing.time_slicing.replicas_of("nvidia.com/gpu") == 1


def test_nvidia_names_and_durations(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        """\
version: v1
flags:
  migStrategy: mixed
  failOnInitError: false
  deviceListStrategy: [cdi-cri, envvar]
  deviceIDStrategy: index
  nvidiaDriverRoot: /run/nvidia/driver
health:
  ignoredXids: [13]
  xidPolicies: {79: reset, 31: quiet}
  quietPeriod: 500ms
sharing:
  timeSlicing:
    renameByDefault: true
    failRequestsGreaterThanOne: true
    resources:
      - name: nvidia.com/gpu
        replicas: 4
"""
    )
    cfg = load_config(path)
    assert cfg.flags.mig_strategy == "mixed"
    assert cfg.flags.device_list_strategy == ["cdi-cri", "envvar"]
    assert cfg.flags.cdi_enabled
    assert cfg.flags.device_id_strategy == "index"
    assert cfg.flags.effective_host_driver_root == "/run/nvidia/driver"
    assert cfg.health.quiet_period == 0.5
    assert cfg.health.policy_for_xid(31) == "quiet"  # an explicit policy beats the default list
    assert cfg.health.policy_for_xid(43) == "quiet"  # no longer ignored: the list was replaced
    slicing = cfg.sharing.time_slicing
    assert slicing.replicas_of("nvidia.com/gpu") == 4
    assert slicing.advertised_name("nvidia.com/gpu") == "nvidia.com/gpu.shared"


def test_a_single_strategy_string_is_a_list() -> None:
    cfg = parse_config({"version": "v1", "flags": {"deviceListStrategy": "volume-mounts"}})
    assert cfg.flags.device_list_strategy == ["volume-mounts"]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"version": "v2"}, "c.yaml: version: unsupported version 'v2'"),
        ({"flags": {}}, "c.yaml: version: required field is missing"),
        (
            {"version": "v1", "flags": {"migStrategy": "all"}},
            "c.yaml: flags.migStrategy: must be 'none', 'single' or 'mixed' (got 'all')",
        ),
        (
            {"version": "v1", "flags": {"deviceIdStrategy": "uuid"}},
            "c.yaml: flags.deviceIdStrategy: unknown key (allowed: ",
        ),
        (
            {"version": "v1", "flags": {"deviceListStrategy": ["envvar", "envvar"]}},
            "c.yaml: flags.deviceListStrategy: lists a strategy twice",
        ),
        (
            {"version": "v1", "flags": {"deviceListStrategy": ["nvidia-runtime"]}},
            "c.yaml: flags.deviceListStrategy[0]: must be 'envvar', 'volume-mounts',",
        ),
        (
            {"version": "v1", "flags": {"nvidiaDriverRoot": "driver"}},
            "c.yaml: flags.nvidiaDriverRoot: must be an absolute path (got 'driver')",
        ),
        (
            {"version": "v1", "health": {"quietPeriod": "soon"}},
            "c.yaml: health.quietPeriod: expected a duration such as '30s'",
        ),
        (
            {"version": "v1", "health": {"xidPolicies": {79: "reboot"}}},
            "c.yaml: health.xidPolicies[79]: must be 'ignore', 'reset' or 'quiet' (got 'reboot')",
        ),
        (
            {
                "version": "v1",
                "sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu"}]}},
            },
            "c.yaml: sharing.timeSlicing.resources[0].replicas: required field is missing",
        ),
        (
            {
                "version": "v1",
                "sharing": {
                    "timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 1}]}
                },
            },
            "c.yaml: sharing.timeSlicing.resources[0].replicas: must be >= 2 (got 1)",
        ),
        (
            {
                "version": "v1",
                "sharing": {"timeSlicing": {"resources": [{"name": "amd.com/gpu", "replicas": 2}]}},
            },
            "c.yaml: sharing.timeSlicing.resources[0].name: must be nvidia.com/gpu or",
        ),
    ],
)
def test_errors_name_the_field(data: object, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(data, "c.yaml")
    assert str(info.value).startswith(message), str(info.value)
    assert "\n" not in str(info.value)  # one line for one mistake


def test_bad_yaml_and_empty_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: v1\nflags: [\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml: invalid YAML at line 3"):
        load_config(bad)
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    with pytest.raises(ConfigError, match=r"empty\.yaml: \(top level\): empty file"):
        load_config(empty)


def test_overrides_make_paths_absolute() -> None:
    cfg = load_config(None).with_overrides(dev_root="rel/dev", cdi_dir=None)
    assert cfg.flags.dev_root == str(Path("rel/dev").absolute())
    assert cfg.flags.cdi_dir == "/var/run/cdi"


@pytest.mark.parametrize(
    ("text", "seconds"), [("30s", 30.0), ("500ms", 0.5), ("2m", 120.0), ("1h", 3600.0), (7, 7.0)]
)
def test_durations(text: str | int, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    ("health", "message"),
    [
        ({"quietPeriod": 0}, "c.yaml: health.quietPeriod: must be >= 0.01 (got 0)"),
        ({"quietPeriod": "0ms"}, "c.yaml: health.quietPeriod: must be >= 0.01 (got '0ms')"),
        (
            {"resetCheckInterval": 1e-9},
            "c.yaml: health.resetCheckInterval: must be >= 0.01 (got 1e-09)",
        ),
        (
            {"resetCheckInterval": "5ms"},
            "c.yaml: health.resetCheckInterval: must be >= 0.01 (got '5ms')",
        ),
    ],
    ids=["quiet-zero", "quiet-0ms", "reset-1e-9", "reset-5ms"],
)
def test_health_timers_that_would_busy_a_core_are_refused(
    health: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({"version": "v1", "health": health}, "c.yaml")
    assert str(info.value) == message


def test_health_timers_at_the_lower_bound_are_accepted() -> None:
    cfg = parse_config(
        {"version": "v1", "health": {"quietPeriod": "10ms", "resetCheckInterval": 0.01}}
    )
    assert (cfg.health.quiet_period, cfg.health.reset_check_interval) == (0.01, 0.01)


def test_a_quoted_xid_key_is_not_called_a_string_problem(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text('version: v1\nhealth:\n  xidPolicies: {"79": reset}\n')
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == (
        f"{path}: health.xidPolicies: key '79' must be an integer (write 79 without quotes)"
    )


@pytest.mark.parametrize(
    "health",
    [
        {"xidPolicies": {-(10**5000): "reset"}},
        {"ignoredXids": [-(10**5000)]},
        {"quietPeriod": 10**5000},
    ],
    ids=["xid-key", "ignored-xid", "duration"],
)
def test_huge_integers_never_show_pythons_own_hint(health: dict[str, object]) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({"version": "v1", "health": health}, "c.yaml")
    text = str(info.value)
    assert "set_int_max_str_digits" not in text
    assert "an integer of about 5001 digits" in text
    assert text.startswith("c.yaml: health.")
    assert len(text.splitlines()) == 1


def test_a_300000_item_list_is_too_large_and_aliases_only_when_used(tmp_path: Path) -> None:
    path = tmp_path / "long.yaml"
    xids = "".join(f"    - {i % 256}\n" for i in range(300_000))
    path.write_text(f"version: v1\nhealth:\n  ignoredXids:\n{xids}")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == (
        f"{path}: too large: more than 100,000 values (lists, mappings and scalars); refused"
    )
    # the same bulk made of aliases says so (a 1,000-item list used 300 times)
    block = "[" + ", ".join(["13"] * 1000) + "]"
    uses = "".join(f"  u{i}: *xids\n" for i in range(300))
    path.write_text(f"version: v1\nx-bulk:\n  base: &xids {block}\n{uses}")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == f"{path}: aliases expand it to more than 100,000 nodes; refused"

"""``kubedevice --help`` and every subcommand's help read as one family.

The test walks click's whole command tree (the lazily loaded subcommands included) and
checks, for every option:

* one concept, one flag: an option reading a known environment variable has that concept's
  flag name, no option uses a known synonym, and a flag that appears on several commands
  has the same help sentence, value type and environment variable on each of them (and,
  for the flags whose default never depends on the command, the same default);
* one style: a help sentence that says nothing of defaults or variables itself, then
  click's bracket ``[env var: X; default: Y]`` (variable first), with a default for every
  option that takes a value and is not required;

and, for every command: a one-line summary, and exit status 2 for a usage error. The top
level and each top-level command's ``--help`` also run as real processes.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from kubedevice.cli.main import SUBCOMMANDS, cli

KUBEDEVICE = str(Path(sys.executable).parent / "kubedevice")

#: environment variable -> the one flag that reads it
FLAG_OF_ENV = {
    "DP_DEVICE_PLUGIN_DIR": "--device-plugin-dir",
    "NODE_NAME": "--node-name",
    "POD_UID": "--pod-uid",
    "KUBECONFIG": "--kubeconfig",
    "KUBEDEVICE_NVML": "--nvml",
    "KUBEDEVICE_LOG_FORMAT": "--log-format",
    "KUBEDEVICE_LOG_LEVEL": "--log-level",
    "KUBEDEVICE_STOP_GRACE": "--stop-grace",
}

#: names that would say the same thing as one of ours in other words
SYNONYMS = {
    "--plugin-dir": "--device-plugin-dir",
    "--dp-dir": "--device-plugin-dir",
    "--socket-dir": "--device-plugin-dir",
    "--kubelet-root": "--kubelet-dir",
    "--root-dir": "--kubelet-dir",
    "--kubelet-root-dir": "--kubelet-dir",
    "--node": "--node-name",
    "--nodename": "--node-name",
    "--kube-config": "--kubeconfig",
    "--kubeconfig-path": "--kubeconfig",
    "--dev-dir": "--dev-root",
    "--devroot": "--dev-root",
    "--sys-dir": "--sys-root",
    "--sysroot": "--sys-root",
    "--cdi-root": "--cdi-dir",
    "--cdi-spec-dir": "--cdi-dir",
    "--metrics-addr": "--metrics-address",
    "--metrics-port": "--metrics-address",
    "--format": "--output",
    "--pod-resources": "--pod-resources-socket",
    "--podresources-socket": "--pod-resources-socket",
}

#: flags whose meaning is the command's own (a different file, a different wait)
OWN_MEANING = {"--config", "--timeout", "--output", "--namespace", "--driver-name", "--dra"}

#: flags whose default is the same wherever they appear (the others may default to a key
#: of the command's config file, or to a path next to another option)
SAME_DEFAULT = {
    "--device-plugin-dir",
    "--kubelet-dir",
    "--node-name",
    "--metrics-address",
    "--nvml",
    "--log-format",
    "--log-level",
}

BRACKET = re.compile(r"\s*\[(?P<inside>[^\[\]]*)\]$")


def _walk(
    cmd: click.Command, path: tuple[str, ...], parent: click.Context | None = None
) -> Iterator[tuple[tuple[str, ...], click.Command, click.Context]]:
    ctx = click.Context(cmd, info_name=path[-1], parent=parent)
    yield path, cmd, ctx
    if isinstance(cmd, click.Group):
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            assert sub is not None, name
            yield from _walk(sub, (*path, name), ctx)


COMMANDS = list(_walk(cli, ("kubedevice",)))


def _options() -> Iterator[tuple[str, click.Option, str, str]]:
    """(command, option, the help sentence, what the bracket holds) of every visible option."""
    for path, cmd, ctx in COMMANDS:
        for param in cmd.params:
            if not isinstance(param, click.Option) or param.hidden:
                continue
            record = param.get_help_record(ctx)
            assert record is not None
            text = record[1]
            m = BRACKET.search(text)
            sentence = text[: m.start()] if m else text
            yield " ".join(path), param, sentence, (m.group("inside") if m else "")


OPTIONS = [o for o in _options() if o[1].name not in {"help", "version"}]


def _flag(option: click.Option) -> str:
    return max(option.opts, key=len)


def test_the_walk_reaches_every_command() -> None:
    names = {path[1] for path, _, _ in COMMANDS if len(path) > 1}
    assert names == set(SUBCOMMANDS)
    assert len(COMMANDS) > len(SUBCOMMANDS)  # the groups' subcommands too
    assert len(OPTIONS) > 50


def test_one_concept_one_flag() -> None:
    problems = []
    for where, option, _, _ in OPTIONS:
        flag = _flag(option)
        for envvar in [option.envvar] if isinstance(option.envvar, str) else option.envvar or []:
            want = FLAG_OF_ENV.get(envvar)
            if want is None:
                problems.append(f"{where} {flag}: ${envvar} is not in FLAG_OF_ENV")
            elif want != flag:
                problems.append(f"{where} {flag} reads ${envvar}, which is {want}'s")
        for opt in option.opts:
            if opt in SYNONYMS:
                problems.append(f"{where} {opt}: call it {SYNONYMS[opt]}")
    assert not problems, "\n".join(problems)


def test_a_shared_flag_means_the_same_on_every_command() -> None:
    seen: dict[str, dict[tuple[object, ...], list[str]]] = defaultdict(lambda: defaultdict(list))
    for where, option, sentence, inside in OPTIONS:
        flag = _flag(option)
        default = re.search(r"default: (.*?)(;|$)", inside)
        key: tuple[object, ...] = (
            option.envvar,
            option.type.name,
            None if flag in OWN_MEANING else sentence,
            default and default.group(1) if flag in SAME_DEFAULT else None,
        )
        seen[flag][key].append(where)
    differ = {flag: dict(variants) for flag, variants in seen.items() if len(variants) > 1}
    assert not differ, "\n".join(
        f"{flag}:\n" + "\n".join(f"    {k}: {v}" for k, v in variants.items())
        for flag, variants in differ.items()
    )
    # the shared options really are shared (a typo would make a flag of its own)
    assert len(seen["--device-plugin-dir"]) == 1
    assert sum(len(v) for v in seen["--device-plugin-dir"].values()) >= 8


def test_every_help_text_says_its_default_and_env_var_in_one_style() -> None:
    problems = []
    for where, option, sentence, inside in OPTIONS:
        flag = _flag(option)
        if not sentence.strip():
            problems.append(f"{where} {flag}: no help text")
            continue
        if not sentence.rstrip().endswith((".", ")")):
            problems.append(f"{where} {flag}: the help is not a sentence: {sentence!r}")
        # what the bracket says is said only there
        for pattern, what in (
            (r"\bdefaults?\b(?! apply)", "a default"),
            (r"\(env\b|\benv var\b", "an env var"),
            (r"\$[A-Z_]{3,}", "a variable"),
            (r"\[", "a bracket"),
        ):
            if re.search(pattern, sentence, re.I):
                problems.append(f"{where} {flag}: the sentence names {what}: {sentence!r}")
        parts = [p.strip() for p in inside.split(";")] if inside else []
        labels = [p.split(":", 1)[0] for p in parts]
        if option.envvar and option.show_envvar is not True:
            problems.append(f"{where} {flag}: reads ${option.envvar} without saying so")
        if option.envvar and labels[:1] != ["env var"]:
            problems.append(f"{where} {flag}: the env var is not first in {inside!r}")
        takes_value = not option.is_flag and not option.count
        if takes_value and not option.required and not option.multiple:
            if "default" not in labels:
                problems.append(f"{where} {flag}: no default shown")
            elif "env var" in labels and labels.index("env var") > labels.index("default"):
                problems.append(f"{where} {flag}: default before env var")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(
    "path", [p for p, _, _ in COMMANDS], ids=[" ".join(p) for p, _, _ in COMMANDS]
)
def test_every_command_has_a_summary_and_exits_2_on_a_usage_error(path: tuple[str, ...]) -> None:
    [(cmd, _)] = [(c, x) for p, c, x in COMMANDS if p == path]
    summary = cmd.get_short_help_str(200)
    assert summary.endswith("."), summary
    assert "``" not in (cmd.help or ""), "reStructuredText in a command's help"
    result = CliRunner().invoke(cli, [*path[1:], "--no-such-option"])
    assert result.exit_code == 2, result.output
    assert "No such option" in result.output


def test_the_top_level_help_as_a_real_process() -> None:
    proc = subprocess.run(
        [KUBEDEVICE, "--help"], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    listed = re.findall(r"^  (\S+)\s", proc.stdout.split("Commands:", 1)[1], re.M)
    assert listed == sorted(SUBCOMMANDS)
    unwrapped = " ".join(proc.stdout.split())
    assert "[env var: KUBEDEVICE_LOG_FORMAT; default: text]" in unwrapped
    bad = subprocess.run(
        [KUBEDEVICE, "no-such-command"], capture_output=True, text=True, timeout=60, check=False
    )
    assert bad.returncode == 2
    assert "No such command 'no-such-command'" in bad.stderr


@pytest.mark.parametrize("name", sorted(SUBCOMMANDS))
def test_each_top_level_command_help_as_a_real_process(name: str) -> None:
    proc = subprocess.run(
        [KUBEDEVICE, name, "--help"], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"Usage: kubedevice {name} ")
    assert "--log-format [text|json]" in proc.stdout  # after the subcommand too


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "-c", "/nonexistent/devices.yaml"],
        ["validate", "/nonexistent/devices.yaml"],
        ["nvidia", "run", "-c", "/nonexistent/gpu.yaml"],
        ["nvidia", "info", "--nvml", "fake:/nonexistent/machine.json"],
        ["run", "--dra", "-c", "/nonexistent/devices.yaml"],
        ["advertise", "node-1", "no-count"],
        ["examples", "no-such-example.yaml"],
        ["conformance"],
        ["demo", "--workdir", "/proc/no-such-dir/demo"],
    ],
    ids=lambda argv: " ".join(argv),
)
def test_a_config_or_usage_error_exits_2_with_one_line(argv: list[str]) -> None:
    proc = subprocess.run(
        [KUBEDEVICE, *argv], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert proc.stderr.lower().lstrip().startswith(("error: ", "usage: ")), proc.stderr
    assert "Traceback" not in proc.stderr


def _argparse_options() -> Iterator[tuple[str, str, str, str]]:
    """(parser, flag, sentence, bracket) of the SDK's and the DRA kit's daemon parsers."""
    import kubedevice
    import kubedevice.dra as dra

    for name, parser in (
        ("kubedevice.argument_parser()", kubedevice.argument_parser()),
        ("kubedevice.dra.argument_parser()", dra.argument_parser()),
    ):
        for action in parser._actions:
            flag = max(action.option_strings, key=len, default="")
            if not flag or flag == "--help":
                continue
            text = action.help or ""
            m = BRACKET.search(text)
            yield name, flag, text[: m.start()] if m else text, m.group("inside") if m else ""


@pytest.mark.parametrize("option", list(_argparse_options()), ids=lambda o: f"{o[0]} {o[1]}")
def test_the_sdk_and_dra_kit_parsers_speak_as_the_command(
    option: tuple[str, str, str, str],
) -> None:
    """A plugin or driver built on the kit reads as the `kubedevice` command: a flag both
    have has the same help sentence, and defaults and variables are in the same bracket."""
    where, flag, sentence, inside = option
    if (where, flag) == ("kubedevice.argument_parser()", "--metrics-address"):
        # a device plugin serves /metrics only: the sentence drops the DRA driver's probes
        assert sentence.rstrip() == "Serve Prometheus /metrics on this address."
        assert inside == "default: (off)"
        return
    click_sentences = {
        s
        for _, o, s, _ in OPTIONS
        if _flag(o) == flag and flag not in {"--log-format", "--log-level"}
    }
    if click_sentences:
        assert click_sentences == {sentence}, (where, flag)
    assert sentence.rstrip().endswith("."), (where, flag, sentence)
    assert not re.search(r"\bdefault\b|\(env\b|\$[A-Z_]{3,}", sentence), (where, flag)
    if flag not in {"--no-health", "--cleanup", "--evict-on"}:  # flags, and a repeatable
        assert "default: " in inside, (where, flag)
    for env, canonical in FLAG_OF_ENV.items():
        if f"env var: {env}" in inside:
            assert canonical == flag, (where, flag)
            assert inside.startswith("env var: ")

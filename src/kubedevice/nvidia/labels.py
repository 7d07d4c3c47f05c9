"""Node labels for the GPUs, written as node-feature-discovery's local feature file.

NFD's nfd-worker reads every regular, non-hidden file in
``/etc/kubernetes/node-feature-discovery/features.d/``: one ``name=value`` per line
(``name`` alone means ``true``), ``#`` starts a comment, at most 64 KiB. Names with a
domain prefix (``nvidia.com/gpu.product``) become node labels as they are. So the plugin
labels its node without a second daemon: :func:`write_feature_file` writes a hidden
temporary file next to the target and renames it over the target (NFD never reads a
half-written file), and only when the content changes.

The label names are those GPU feature discovery users know (``nvidia.com/gpu.product``,
``nvidia.com/gpu.count``, ``nvidia.com/mig.strategy`` ...).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

from kubedevice.errors import ConfigError
from kubedevice.nvidia.backend import DriverInfo, GpuInfo, MigDeviceInfo
from kubedevice.nvidia.config import GPU_RESOURCE, Config
from kubedevice.plugin.files import replace_if_changed

__all__ = [
    "FEATURES_DIR",
    "MAX_FEATURE_FILE_BYTES",
    "compute_labels",
    "label_value",
    "node_labels",
    "remove_feature_file",
    "render_feature_file",
    "write_feature_file",
]

FEATURES_DIR = Path("/etc/kubernetes/node-feature-discovery/features.d")
MAX_FEATURE_FILE_BYTES = 65536  # nfd-worker skips bigger files
_MIB = 1024 * 1024
_PREFIX = "nvidia.com/"
_VALUE_BAD = re.compile(r"[^A-Za-z0-9_.-]+")
_NAME = re.compile(
    r"^(?:[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
_VALUE = re.compile(r"^(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
MIG_STRATEGIES = ("none", "single", "mixed")
SHARING_STRATEGIES = ("none", "time-slicing", "mps")


def label_value(text: str) -> str:
    """``text`` as a valid label value: runs of other characters become ``-``, max 63."""
    value = _VALUE_BAD.sub("-", text.strip())[:63]
    return value.strip("-_.")


def _version_parts(version: str) -> list[str]:
    return [p for p in re.split(r"[.-]", version) if p]


def compute_labels(
    driver: DriverInfo,
    gpus: Sequence[GpuInfo],
    mig: Mapping[str, Sequence[MigDeviceInfo]],
    *,
    mig_strategy: str,
    sharing_strategy: str,
    replicas: int,
) -> dict[str, str]:
    """The labels describing this node's GPUs and how the plugin shares them.

    Args:
        driver: From ``backend.init()``.
        gpus: Every GPU (the first describes the product: nodes are expected to hold one
            kind of GPU; ``gpu.count`` counts them all).
        mig: MIG devices by parent GPU UUID (GPUs with MIG off may be absent).
        mig_strategy: ``none``, ``single`` or ``mixed``.
        sharing_strategy: ``none``, ``time-slicing`` or ``mps``.
        replicas: Time-slicing replicas per GPU (1 without sharing).

    Raises:
        ConfigError: an unknown strategy or a replica count below 1.
    """
    if mig_strategy not in MIG_STRATEGIES:
        raise ConfigError(f"mig_strategy: {mig_strategy!r} is not one of {MIG_STRATEGIES}")
    if sharing_strategy not in SHARING_STRATEGIES:
        raise ConfigError(
            f"sharing_strategy: {sharing_strategy!r} is not one of {SHARING_STRATEGIES}"
        )
    if replicas < 1:
        raise ConfigError(f"replicas: {replicas} is below 1")
    labels: dict[str, str] = {}
    parts = _version_parts(driver.driver_version)
    if parts:
        labels[f"{_PREFIX}cuda.driver-version.full"] = label_value(driver.driver_version)
        for key, old, part in zip(
            ("major", "minor", "revision"), ("major", "minor", "rev"), parts, strict=False
        ):
            labels[f"{_PREFIX}cuda.driver-version.{key}"] = label_value(part)
            labels[f"{_PREFIX}cuda.driver.{old}"] = label_value(part)
    cuda = _version_parts(driver.cuda_version)
    if cuda:
        labels[f"{_PREFIX}cuda.runtime-version.full"] = label_value(driver.cuda_version)
        for key, part in zip(("major", "minor"), cuda, strict=False):
            labels[f"{_PREFIX}cuda.runtime-version.{key}"] = label_value(part)
            labels[f"{_PREFIX}cuda.runtime.{key}"] = label_value(part)

    labels[f"{_PREFIX}gpu.present"] = "true" if gpus else "false"
    labels[f"{_PREFIX}gpu.count"] = str(len(gpus))
    labels[f"{_PREFIX}mig.capable"] = "true" if any(g.mig_capable for g in gpus) else "false"
    labels[f"{_PREFIX}mig.strategy"] = mig_strategy
    labels[f"{_PREFIX}gpu.sharing-strategy"] = sharing_strategy
    labels[f"{_PREFIX}gpu.replicas"] = str(replicas if sharing_strategy != "none" else 1)
    if not gpus:
        return labels

    first = min(gpus, key=lambda g: g.index)
    product = first.name
    labels[f"{_PREFIX}gpu.memory"] = str(first.memory_total // _MIB)
    labels[f"{_PREFIX}gpu.family"] = label_value(first.architecture)
    labels[f"{_PREFIX}gpu.compute.major"] = str(first.compute_capability[0])
    labels[f"{_PREFIX}gpu.compute.minor"] = str(first.compute_capability[1])

    mig_devices = [m for g in gpus if g.mig_enabled for m in mig.get(g.uuid, ())]
    if mig_strategy == "single" and mig_devices:
        profiles = Counter(m.profile for m in mig_devices)
        profile = profiles.most_common(1)[0][0]
        product = f"{product}-MIG-{profile}"
        labels[f"{_PREFIX}gpu.count"] = str(len(mig_devices))
        labels[f"{_PREFIX}gpu.memory"] = str(
            min(m.memory_total for m in mig_devices if m.profile == profile) // _MIB
        )
        gi, ci = _slices(profile)
        labels[f"{_PREFIX}gpu.slices.gi"] = str(gi)
        labels[f"{_PREFIX}gpu.slices.ci"] = str(ci)
    elif mig_strategy == "mixed":
        for profile, count in sorted(Counter(m.profile for m in mig_devices).items()):
            base = f"{_PREFIX}mig-{profile}"
            gi, ci = _slices(profile)
            labels[f"{base}.count"] = str(count)
            labels[f"{base}.memory"] = str(
                min(m.memory_total for m in mig_devices if m.profile == profile) // _MIB
            )
            labels[f"{base}.slices.gi"] = str(gi)
            labels[f"{base}.slices.ci"] = str(ci)
    if sharing_strategy != "none" and replicas > 1:
        product = f"{product}-SHARED"
    labels[f"{_PREFIX}gpu.product"] = label_value(product)
    return labels


def node_labels(
    config: Config,
    driver: DriverInfo,
    gpus: Sequence[GpuInfo],
    mig: Mapping[str, Sequence[MigDeviceInfo]],
) -> dict[str, str]:
    """The labels ``config`` gives this node: :func:`compute_labels` with its sharing.

    ``gpu.replicas``, ``gpu.sharing-strategy`` and ``-SHARED`` in ``gpu.product``
    describe ``nvidia.com/gpu`` itself: time-slicing only a MIG profile (or a profile
    this node does not have) leaves them alone; with ``migStrategy: mixed`` each
    profile's own ``nvidia.com/mig-<profile>.replicas`` and ``.sharing-strategy`` say
    how it is shared. ``nvidia info`` and ``nvidia run`` both label through this.
    """
    slicing = config.sharing.active
    replicas = slicing.replicas_of(GPU_RESOURCE)
    labels = compute_labels(
        driver,
        gpus,
        mig,
        mig_strategy=config.flags.mig_strategy,
        sharing_strategy=config.sharing.strategy if replicas > 1 else "none",
        replicas=replicas,
    )
    if config.flags.mig_strategy == "mixed":
        for name in [k for k in labels if k.endswith(".slices.gi")]:
            base = name.removesuffix(".slices.gi")  # nvidia.com/mig-<profile>
            n = slicing.replicas_of(base)
            labels[f"{base}.replicas"] = str(n)
            labels[f"{base}.sharing-strategy"] = "time-slicing" if n > 1 else "none"
    return labels


def _slices(profile: str) -> tuple[int, int]:
    """``"3g.71gb"`` -> (3, 3); ``"1c.3g.71gb"`` -> (3, 1)."""
    m = re.match(r"^(?:(\d+)c\.)?(\d+)g\.", profile)
    if not m:
        return 0, 0
    gi = int(m.group(2))
    return gi, int(m.group(1)) if m.group(1) else gi


def render_feature_file(labels: Mapping[str, str]) -> str:
    """The feature file text: a comment line, then ``name=value`` lines sorted by name.

    Raises:
        ConfigError: a name or value NFD (or the API server) would refuse.
    """
    lines = ["# Node labels of the kubedevice NVIDIA GPU plugin; rewritten when they change."]
    for name in sorted(labels):
        value = labels[name]
        if not _NAME.match(name) or len(name.partition("/")[0]) > 253:
            raise ConfigError(f"label name {name!r} is not a valid Kubernetes label name")
        if not _VALUE.match(value):
            raise ConfigError(f"label {name}: value {value!r} is not a valid label value")
        lines.append(f"{name}={value}")
    text = "\n".join(lines) + "\n"
    if len(text.encode()) > MAX_FEATURE_FILE_BYTES:
        raise ConfigError(f"feature file would be {len(text)} bytes, over NFD's 64 KiB limit")
    return text


def _check_name(name: str) -> None:
    if not name or name.startswith(".") or "/" in name or name in ("..",):
        raise ConfigError(f"feature file name {name!r}: must be a plain, non-hidden file name")


def write_feature_file(
    directory: Path, labels: Mapping[str, str], name: str = "kubedevice-nvidia"
) -> bool:
    """Write the labels to ``directory/name`` atomically; ``False`` when already current.

    The directory is created if missing. A symlink at the target is replaced, never
    followed.

    Raises:
        ConfigError: a bad name or label, or the directory cannot be written.
    """
    _check_name(name)
    text = render_feature_file(labels)
    try:
        return replace_if_changed(directory, name, text)
    except OSError as e:
        raise ConfigError(f"features dir {directory}: cannot write {name}: {e.strerror}") from e


def remove_feature_file(directory: Path, name: str = "kubedevice-nvidia") -> bool:
    """Remove the feature file (NFD then drops the labels); ``False`` if it was absent."""
    _check_name(name)
    try:
        (directory / name).unlink()
    except FileNotFoundError:
        return False
    except OSError as e:
        raise ConfigError(f"features dir {directory}: cannot remove {name}: {e.strerror}") from e
    return True

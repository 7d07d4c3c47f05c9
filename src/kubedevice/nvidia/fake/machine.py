"""A fake machine: its GPUs as NVML reports them, and finding and reading machine files.

Shared by the three file formats (:mod:`.load`, :mod:`.synthetic`, :mod:`.replay`) and the
backend (:class:`~kubedevice.nvidia.fake.FakeNvml`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubedevice.errors import ConfigError
from kubedevice.nvidia.backend import DriverInfo, GpuInfo, GpuSample, Link, MigDeviceInfo

__all__ = [
    "MACHINES_DIR",
    "SYNTHETIC_FORMAT",
    "FakeGpu",
    "FakeMachine",
    "ScriptStep",
    "machine_names",
    "resolve_machine_path",
]

MACHINES_DIR = Path(__file__).resolve().parent.parent / "machines"
SYNTHETIC_FORMAT = "kubedevice-fake-nvml/v1"
_MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class FakeGpu:
    """One GPU of a fake machine: NVML's static facts plus what the fake needs to play it."""

    info: GpuInfo
    numa_node: int | None = None  # what sysfs says (None = -1)
    pcie_switch: str | None = None
    host_bridge: str | None = None
    events_supported: bool = True  # XID/ECC events can be registered
    sample: GpuSample = dataclasses.field(default_factory=GpuSample)  # when no timeline plays
    timeline: tuple[GpuSample, ...] = ()  # load recording, played in a loop from init()
    timeline_period_s: float = 0.5
    mig: tuple[MigDeviceInfo, ...] = ()


@dataclass(frozen=True, slots=True)
class ScriptStep:
    """A control message the fake applies by itself ``at_ms`` after the first watch()."""

    at_ms: int
    message: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class FakeMachine:
    """A parsed machine file."""

    name: str
    source: str  # the file(s) it came from
    driver: DriverInfo
    gpus: tuple[FakeGpu, ...]
    links: Mapping[frozenset[str], Link]  # every pair NVML can tell about
    dev_nodes: tuple[str, ...]  # absolute paths, e.g. "/dev/nvidia0"
    script: tuple[ScriptStep, ...] = ()
    control_socket: str | None = None
    init_error: str | None = None  # NVML error name init() raises ("DriverNotLoaded" ...)
    description: str = ""

    def gpu(self, uuid: str) -> FakeGpu:
        """The GPU with this UUID (ConfigError if none)."""
        for g in self.gpus:
            if g.info.uuid == uuid:
                return g
        raise ConfigError(f"fake machine {self.name!r} has no GPU {uuid!r}")


def machine_names() -> list[str]:
    """The machines packaged with kubedevice, by bare name (``dgx-8gpu`` ...)."""
    return sorted(p.stem for p in MACHINES_DIR.glob("*.json"))


def resolve_machine_path(name: str | Path) -> Path:
    """A machine file from a path, or a packaged machine's bare name (``dgx-8gpu``).

    ``machines/NAME.json`` and ``NAME.json`` also name packaged machines when no such
    file exists relative to the working directory.

    Raises:
        ConfigError: nothing of that name exists.
    """
    path = Path(name)
    if path.is_file():
        return path
    text = str(name)
    if path.exists():
        what = "a directory" if path.is_dir() else "not a regular file"
        raise ConfigError(f"fake NVML machine {text!r}: {what}; expected a machine file (JSON)")
    bare = text.removeprefix("machines/").removesuffix(".json")
    if "/" not in bare and bare:
        packaged = MACHINES_DIR / f"{bare}.json"
        if packaged.is_file():
            return packaged
    raise ConfigError(
        f"fake NVML machine {text!r}: no such file, and not a packaged machine "
        f"(packaged: {', '.join(machine_names())})"
    )


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror or e}") from e
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: not JSON: line {e.lineno}: {e.msg}") from e
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text: invalid byte at offset {e.start}") from None
    except ValueError as e:  # e.g. an integer of thousands of digits
        raise ConfigError(f"{path}: not usable JSON: {str(e).splitlines()[0][:200]}") from None
    except RecursionError:
        raise ConfigError(f"{path}: not usable JSON: nested too deeply") from None


def _is_load_recording(raw: Any) -> bool:
    return isinstance(raw, dict) and isinstance(raw.get("under_load"), list)


def _sysfs_bus_id(bus_id: str) -> str:
    """NVML's "00000000:00:06.0" -> sysfs "0000:00:06.0" (domain of 4 hex digits)."""
    bus_id = bus_id.lower()
    domain, sep, rest = bus_id.partition(":")
    if sep and len(domain) > 4:
        domain = domain[-4:]
    return f"{domain}{sep}{rest}"


def _default_dev_nodes(gpus: Iterable[FakeGpu]) -> tuple[str, ...]:
    nodes = ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
    for g in gpus:
        nodes.append(f"/dev/nvidia{g.info.minor}")
        nodes.extend(f"/dev/nvidia-caps/nvidia-cap{m}" for mig in g.mig for m in mig.cap_minors)
    return tuple(dict.fromkeys(nodes))


def _check_unique(path: Path, what: str, values: list[Any], field: str = "gpus") -> None:
    seen: set[Any] = set()
    for v in values:
        if v in seen:
            raise ConfigError(f"{path}: {field}: duplicate {what} {v!r}")
        seen.add(v)


def _strict_int(value: Any) -> int:
    """An integer of a recording (a bool or a string is refused, not converted)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an integer (got {str(value)[:40]!r})")
    return value

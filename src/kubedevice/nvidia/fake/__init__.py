"""The fake NVML backend, in one package: GPUs read from a JSON file, health events injected.

``nvml`` the backend (:class:`FakeNvml`), ``machine`` the machine model and finding/reading
machine files, ``load`` the three file kinds (NVML recordings parsed here), ``synthetic`` the
synthetic format, ``replay`` load recordings played as a timeline, ``control`` the control
messages and their socket. This package's names are the fake's public face.
"""

from kubedevice.nvidia.fake.nvml import (
    CONTROL_ENV,
    MACHINES_DIR,
    SYNTHETIC_FORMAT,
    FakeGpu,
    FakeMachine,
    FakeNvml,
    ScriptStep,
    load_machine,
    machine_names,
    resolve_machine_path,
    send_control,
    write_fake_dev,
    write_fake_sysfs,
)

__all__ = [
    "CONTROL_ENV",
    "MACHINES_DIR",
    "SYNTHETIC_FORMAT",
    "FakeGpu",
    "FakeMachine",
    "FakeNvml",
    "ScriptStep",
    "load_machine",
    "machine_names",
    "resolve_machine_path",
    "send_control",
    "write_fake_dev",
    "write_fake_sysfs",
]

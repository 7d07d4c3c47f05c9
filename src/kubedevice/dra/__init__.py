"""kubedevice.dra: write a Kubernetes DRA driver (kubelet plugin) in Python.

STATUS (for the drivers built on this kit; the public API below is stable): everything
is ready and tested: the device model, the driver interface, the entry points, and behind
them registration, the DRA v1/v1beta1 and health services, claims read from the API
server, CDI specs, the checkpoint and ResourceSlice publishing (tests/dra/ on a real API
server; tests/e2e/test_dra_kit.py on the real scheduler and kubelet). docs/dra.md.

A driver author subclasses :class:`Driver`: :meth:`Driver.devices` yields the node's
devices (a full list on every change), :meth:`Driver.prepare` says what a claim's
containers get (the default: each device's own ``edits``, plus any ``data`` the driver
keeps with the claim), :meth:`Driver.unprepare` undoes it and :meth:`Driver.restore`
rebuilds the driver's state from the checkpoint at start. The kit registers with the
kubelet, serves ``v1.DRAPlugin`` and ``v1beta1.DRAPlugin`` (and
``v1alpha1.DRAResourceHealth``), reads each claim from the API server, writes one CDI spec
per claim, keeps a checkpoint of prepared claims, and publishes the devices as
ResourceSlices of the node's pool.

Plugin side: never imports the kubelet emulator or the conformance kit.
"""

from __future__ import annotations

from kubedevice.dra.driver import Driver
from kubedevice.dra.model.types import (
    AllocatedDevice,
    AttributeValue,
    Claim,
    ClaimRef,
    ContainerEdits,
    CounterConsumption,
    CounterSet,
    Device,
    DeviceNode,
    Fault,
    Health,
    Mount,
    OpaqueConfig,
    PreparedClaim,
    PreparedDevice,
    Quantity,
    RequestPolicy,
    Version,
)
from kubedevice.dra.runner import (
    DEFAULT_CDI_DIR,
    DEFAULT_KUBELET_DIR,
    ENV_NODE_NAME,
    ENV_POD_UID,
    ENV_STOP_GRACE,
    DriverOptions,
    argument_parser,
    cleanup,
    main,
    options_from_args,
    run,
    serve,
)
from kubedevice.errors import ClaimError, KubeApiError

__all__ = [
    "DEFAULT_CDI_DIR",
    "DEFAULT_KUBELET_DIR",
    "ENV_NODE_NAME",
    "ENV_POD_UID",
    "ENV_STOP_GRACE",
    "AllocatedDevice",
    "AttributeValue",
    "Claim",
    "ClaimError",
    "ClaimRef",
    "ContainerEdits",
    "CounterConsumption",
    "CounterSet",
    "Device",
    "DeviceNode",
    "Driver",
    "DriverOptions",
    "Fault",
    "Health",
    "KubeApiError",
    "Mount",
    "OpaqueConfig",
    "PreparedClaim",
    "PreparedDevice",
    "Quantity",
    "RequestPolicy",
    "Version",
    "argument_parser",
    "cleanup",
    "main",
    "options_from_args",
    "run",
    "serve",
]

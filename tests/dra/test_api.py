"""kubedevice.dra's public names, and the DRA wire as the v1.36 kubelet speaks it."""

from __future__ import annotations

import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor

import kubedevice.dra as dra
from kubedevice._api.dra.v1 import api_pb2 as v1
from kubedevice._api.dra.v1beta1 import api_pb2 as v1beta1
from kubedevice._api.drahealth.v1alpha1 import api_pb2 as health
from kubedevice._api.pluginregistration.v1 import api_pb2 as reg

_S = FieldDescriptor.TYPE_STRING
_M = FieldDescriptor.TYPE_MESSAGE
_B = FieldDescriptor.TYPE_BOOL
_I = FieldDescriptor.TYPE_INT64
_E = FieldDescriptor.TYPE_ENUM


def test_all_is_complete() -> None:  # its order: ruff's RUF022
    # what importing the package binds besides its API: its rooms and modules
    rooms = {"annotations", "api", "driver", "model", "node", "runner", "state"}
    public = {n for n in vars(dra) if not n.startswith("_")} - rooms
    assert public == set(dra.__all__)


# (package, service, methods) as the kubelet dials them
SERVICES = [
    (
        v1,
        "k8s.io.kubelet.pkg.apis.dra.v1",
        "DRAPlugin",
        ["NodePrepareResources", "NodeUnprepareResources"],
    ),
    (
        v1beta1,
        "k8s.io.kubelet.pkg.apis.dra.v1beta1",
        "DRAPlugin",
        ["NodePrepareResources", "NodeUnprepareResources"],
    ),
    (reg, "pluginregistration", "Registration", ["GetInfo", "NotifyRegistrationStatus"]),
    (health, "v1alpha1", "DRAResourceHealth", ["NodeWatchResources"]),
]


@pytest.mark.parametrize(("module", "package", "service", "methods"), SERVICES)
def test_packages_services_and_methods(
    module, package: str, service: str, methods: list[str]
) -> None:  # type: ignore[no-untyped-def]
    assert module.DESCRIPTOR.package == package
    found = module.DESCRIPTOR.services_by_name[service]
    assert [m.name for m in found.methods] == methods


# message -> [(number, name, type, repeated)], from the upstream .proto files of v1.36
DRA = {
    "Claim": [(1, "namespace", _S, False), (2, "uid", _S, False), (3, "name", _S, False)],
    "NodePrepareResourcesRequest": [(1, "claims", _M, True)],
    "NodePrepareResourcesResponse": [(1, "claims", _M, True)],
    "NodePrepareResourceResponse": [(1, "devices", _M, True), (2, "error", _S, False)],
    "Device": [
        (1, "request_names", _S, True),
        (2, "pool_name", _S, False),
        (3, "device_name", _S, False),
        (4, "cdi_device_ids", _S, True),
    ],
    "NodeUnprepareResourcesRequest": [(1, "claims", _M, True)],
    "NodeUnprepareResourcesResponse": [(1, "claims", _M, True)],
    "NodeUnprepareResourceResponse": [(1, "error", _S, False)],
}
REGISTRATION = {
    "PluginInfo": [
        (1, "type", _S, False),
        (2, "name", _S, False),
        (3, "endpoint", _S, False),
        (4, "supported_versions", _S, True),
    ],
    "RegistrationStatus": [(1, "plugin_registered", _B, False), (2, "error", _S, False)],
    "RegistrationStatusResponse": [],
    "InfoRequest": [],
}
HEALTH = {
    "NodeWatchResourcesRequest": [],
    "DeviceIdentifier": [(1, "pool_name", _S, False), (2, "device_name", _S, False)],
    "DeviceHealth": [
        (1, "device", _M, False),
        (2, "health", _E, False),
        (3, "last_updated_time", _I, False),
        (4, "health_check_timeout_seconds", _I, False),
        (5, "message", _S, False),
    ],
    "NodeWatchResourcesResponse": [(1, "devices", _M, True)],
}


def _fields(message: Descriptor) -> list[tuple[int, str, int, bool]]:
    return [(f.number, f.name, f.type, f.is_repeated) for f in message.fields]


@pytest.mark.parametrize(
    ("module", "table"),
    [(v1, DRA), (v1beta1, DRA), (reg, REGISTRATION), (health, HEALTH)],
    ids=["dra-v1", "dra-v1beta1", "registration", "health"],
)
def test_messages_field_by_field(module, table: dict) -> None:  # type: ignore[no-untyped-def]
    messages = module.DESCRIPTOR.message_types_by_name
    assert set(messages) == set(table)
    for name, fields in table.items():
        got = _fields(messages[name])
        if module is v1 and name == "Device":
            assert got[-1] == (5, "share_id", _S, False)  # v1 only: optional share_id
            got = got[:-1]
        assert got == fields, name


def test_health_status_values() -> None:
    assert dict(health.HealthStatus.items()) == {"UNKNOWN": 0, "HEALTHY": 1, "UNHEALTHY": 2}

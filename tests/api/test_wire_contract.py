"""The generated API matches the wire tables of docs/contract.md field by field.

The expected tables are transcribed below, and the tables of docs/contract.md
(``#services``, ``#device-plugin-messages``, ``#podresources-messages``) are parsed and
must agree with the transcription, so a typo in the code, the test or the document fails.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor, FileDescriptor

from kubedevice._api import dp, pr

_STRING = FieldDescriptor.TYPE_STRING
_BOOL = FieldDescriptor.TYPE_BOOL
_INT64 = FieldDescriptor.TYPE_INT64
_INT32 = FieldDescriptor.TYPE_INT32
_UINT64 = FieldDescriptor.TYPE_UINT64
_MSG = FieldDescriptor.TYPE_MESSAGE

# message -> [(number, name, type, repeated, message type name or "")]
DEVICEPLUGIN: dict[str, list[tuple[int, str, int, bool, str]]] = {
    "Empty": [],
    "DevicePluginOptions": [
        (1, "pre_start_required", _BOOL, False, ""),
        (2, "get_preferred_allocation_available", _BOOL, False, ""),
    ],
    "RegisterRequest": [
        (1, "version", _STRING, False, ""),
        (2, "endpoint", _STRING, False, ""),
        (3, "resource_name", _STRING, False, ""),
        (4, "options", _MSG, False, "DevicePluginOptions"),
    ],
    "ListAndWatchResponse": [(1, "devices", _MSG, True, "Device")],
    "TopologyInfo": [(1, "nodes", _MSG, True, "NUMANode")],
    "NUMANode": [(1, "ID", _INT64, False, "")],
    "Device": [
        (1, "ID", _STRING, False, ""),
        (2, "health", _STRING, False, ""),
        (3, "topology", _MSG, False, "TopologyInfo"),
    ],
    "PreStartContainerRequest": [(1, "devices_ids", _STRING, True, "")],
    "PreStartContainerResponse": [],
    "PreferredAllocationRequest": [
        (1, "container_requests", _MSG, True, "ContainerPreferredAllocationRequest")
    ],
    "ContainerPreferredAllocationRequest": [
        (1, "available_deviceIDs", _STRING, True, ""),
        (2, "must_include_deviceIDs", _STRING, True, ""),
        (3, "allocation_size", _INT32, False, ""),
    ],
    "PreferredAllocationResponse": [
        (1, "container_responses", _MSG, True, "ContainerPreferredAllocationResponse")
    ],
    "ContainerPreferredAllocationResponse": [(1, "deviceIDs", _STRING, True, "")],
    "AllocateRequest": [(1, "container_requests", _MSG, True, "ContainerAllocateRequest")],
    "ContainerAllocateRequest": [(1, "devices_ids", _STRING, True, "")],
    "CDIDevice": [(1, "name", _STRING, False, "")],
    "AllocateResponse": [(1, "container_responses", _MSG, True, "ContainerAllocateResponse")],
    "ContainerAllocateResponse": [
        (1, "envs", _MSG, True, "EnvsEntry"),
        (2, "mounts", _MSG, True, "Mount"),
        (3, "devices", _MSG, True, "DeviceSpec"),
        (4, "annotations", _MSG, True, "AnnotationsEntry"),
        (5, "cdi_devices", _MSG, True, "CDIDevice"),
    ],
    "Mount": [
        (1, "container_path", _STRING, False, ""),
        (2, "host_path", _STRING, False, ""),
        (3, "read_only", _BOOL, False, ""),
    ],
    "DeviceSpec": [
        (1, "container_path", _STRING, False, ""),
        (2, "host_path", _STRING, False, ""),
        (3, "permissions", _STRING, False, ""),
    ],
}

PODRESOURCES: dict[str, list[tuple[int, str, int, bool, str]]] = {
    "AllocatableResourcesRequest": [],
    "AllocatableResourcesResponse": [
        (1, "devices", _MSG, True, "ContainerDevices"),
        (2, "cpu_ids", _INT64, True, ""),
        (3, "memory", _MSG, True, "ContainerMemory"),
    ],
    "ListPodResourcesRequest": [],
    "ListPodResourcesResponse": [(1, "pod_resources", _MSG, True, "PodResources")],
    "PodResources": [
        (1, "name", _STRING, False, ""),
        (2, "namespace", _STRING, False, ""),
        (3, "containers", _MSG, True, "ContainerResources"),
        (4, "cpu_ids", _INT64, True, ""),
        (5, "memory", _MSG, True, "ContainerMemory"),
    ],
    "ContainerResources": [
        (1, "name", _STRING, False, ""),
        (2, "devices", _MSG, True, "ContainerDevices"),
        (3, "cpu_ids", _INT64, True, ""),
        (4, "memory", _MSG, True, "ContainerMemory"),
        (5, "dynamic_resources", _MSG, True, "DynamicResource"),
    ],
    "ContainerMemory": [
        (1, "memory_type", _STRING, False, ""),
        (2, "size", _UINT64, False, ""),
        (3, "topology", _MSG, False, "TopologyInfo"),
    ],
    "ContainerDevices": [
        (1, "resource_name", _STRING, False, ""),
        (2, "device_ids", _STRING, True, ""),
        (3, "topology", _MSG, False, "TopologyInfo"),
    ],
    "TopologyInfo": [(1, "nodes", _MSG, True, "NUMANode")],
    "NUMANode": [(1, "ID", _INT64, False, "")],
    "DynamicResource": [
        (2, "claim_name", _STRING, False, ""),
        (3, "claim_namespace", _STRING, False, ""),
        (4, "claim_resources", _MSG, True, "ClaimResource"),
    ],
    "ClaimResource": [
        (1, "cdi_devices", _MSG, True, "CDIDevice"),
        (2, "driver_name", _STRING, False, ""),
        (3, "pool_name", _STRING, False, ""),
        (4, "device_name", _STRING, False, ""),
        (5, "share_id", _STRING, False, ""),
    ],
    "CDIDevice": [(1, "name", _STRING, False, "")],
    "GetPodResourcesRequest": [
        (1, "pod_name", _STRING, False, ""),
        (2, "pod_namespace", _STRING, False, ""),
    ],
    "GetPodResourcesResponse": [(1, "pod_resources", _MSG, False, "PodResources")],
}

# service full name -> {method: (input, output, server_streaming)}
SERVICES: dict[str, dict[str, tuple[str, str, bool]]] = {
    "v1beta1.Registration": {"Register": ("RegisterRequest", "Empty", False)},
    "v1beta1.DevicePlugin": {
        "GetDevicePluginOptions": ("Empty", "DevicePluginOptions", False),
        "ListAndWatch": ("Empty", "ListAndWatchResponse", True),
        "GetPreferredAllocation": (
            "PreferredAllocationRequest",
            "PreferredAllocationResponse",
            False,
        ),
        "Allocate": ("AllocateRequest", "AllocateResponse", False),
        "PreStartContainer": ("PreStartContainerRequest", "PreStartContainerResponse", False),
    },
    "v1.PodResourcesLister": {
        "List": ("ListPodResourcesRequest", "ListPodResourcesResponse", False),
        "GetAllocatableResources": (
            "AllocatableResourcesRequest",
            "AllocatableResourcesResponse",
            False,
        ),
        "Get": ("GetPodResourcesRequest", "GetPodResourcesResponse", False),
    },
}


def _fields(desc: Descriptor) -> list[tuple[int, str, int, bool, str]]:
    out = []
    for f in sorted(desc.fields, key=lambda f: f.number):
        kind = f.message_type.name if f.message_type else ""
        out.append((f.number, f.name, f.type, f.is_repeated, kind))
    return out


@pytest.mark.parametrize(
    ("file", "package", "table"),
    [(dp.DESCRIPTOR, "v1beta1", DEVICEPLUGIN), (pr.DESCRIPTOR, "v1", PODRESOURCES)],
    ids=["deviceplugin-v1beta1", "podresources-v1"],
)
def test_every_message_and_field_matches(
    file: FileDescriptor, package: str, table: dict[str, list[tuple[int, str, int, bool, str]]]
) -> None:
    assert file.package == package
    assert set(file.message_types_by_name) == set(table)
    for name, expected in table.items():
        assert _fields(file.message_types_by_name[name]) == expected, name


def test_map_entries_are_string_to_string() -> None:
    resp = dp.DESCRIPTOR.message_types_by_name["ContainerAllocateResponse"]
    for field in ("envs", "annotations"):
        entry = resp.fields_by_name[field].message_type
        assert entry.GetOptions().map_entry
        assert [(f.number, f.name, f.type) for f in entry.fields] == [
            (1, "key", _STRING),
            (2, "value", _STRING),
        ]


def test_reserved_and_optional_fields_of_podresources() -> None:
    dyn = pr.DESCRIPTOR.message_types_by_name["DynamicResource"]
    assert 1 not in dyn.fields_by_number  # was class_name, removed in 1.31
    share_id = pr.DESCRIPTOR.message_types_by_name["ClaimResource"].fields_by_name["share_id"]
    assert share_id.has_presence  # proto3 `optional`


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_services_and_method_paths(service: str) -> None:
    package, _, name = service.partition(".")
    file = dp.DESCRIPTOR if package == "v1beta1" else pr.DESCRIPTOR
    desc = file.services_by_name[name]
    assert desc.full_name == service
    got = {
        m.name: (m.input_type.name, m.output_type.name, m.server_streaming) for m in desc.methods
    }
    assert got == SERVICES[service]
    assert not any(m.client_streaming for m in desc.methods)


def test_method_paths_in_generated_stubs() -> None:
    source = (Path(dp.__file__).with_name("api_pb2_grpc.py")).read_text()
    for method in SERVICES["v1beta1.DevicePlugin"]:
        assert f"'/v1beta1.DevicePlugin/{method}'" in source
    assert "'/v1beta1.Registration/Register'" in source


# --- cross-check against docs/contract.md ----------------------------------------------------

_DOC = Path(__file__).resolve().parents[2] / "docs/contract.md"


def _section(start: str, end: str) -> str:
    text = _DOC.read_text(encoding="utf-8")
    return text[text.index(start) : text.index(end, text.index(start))]


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _doc_fields(start: str, end: str) -> dict[str, set[tuple[int, str]]]:
    out: dict[str, set[tuple[int, str]]] = {}
    current = ""
    for line in _section(start, end).splitlines():
        cells = _cells(line)
        if not line.startswith("|") or len(cells) < 3 or cells[1] in {"#", "---"}:
            continue
        head = cells[0].strip("*").strip()
        if head:
            assert re.fullmatch(r"[A-Z]\w+", head), line
            current = head
            out.setdefault(current, set())
        number = cells[1]
        name = cells[2].strip("`")
        if number.isdigit():
            out[current].add((int(number), name))
    return out


@pytest.mark.parametrize(
    ("table", "start", "end"),
    [
        (DEVICEPLUGIN, "### Device-plugin messages", "### PodResources messages"),
        (PODRESOURCES, "### PodResources messages", "## Kubelet start-up"),
    ],
    ids=["deviceplugin", "podresources"],
)
def test_transcription_agrees_with_the_contract_document(
    table: dict[str, list[tuple[int, str, int, bool, str]]], start: str, end: str
) -> None:
    doc = _doc_fields(start, end)
    assert set(doc) == set(table)
    for message, fields in doc.items():
        assert {(n, name) for n, name, *_ in table[message]} == fields, message


def test_services_agree_with_the_contract_document() -> None:
    doc: dict[str, dict[str, tuple[str, str, bool]]] = {}
    service = ""
    for line in _section("### Services", "### Device-plugin messages").splitlines():
        cells = _cells(line)
        if not line.startswith("|") or len(cells) != 5 or not cells[2].startswith("`"):
            continue
        service = cells[0].strip("`") or service
        request, _, response = cells[3].partition("→")
        doc.setdefault(service, {})[cells[2].strip("`")] = (
            request.strip().strip("`"),
            response.strip().removeprefix("stream of ").strip("`"),
            cells[4] == "server streaming",
        )
    assert doc == SERVICES

"""inspect's own checkpoint decoder agrees with the emulator's writer, byte for byte."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from kubedevice.errors import CheckpointError
from kubedevice.inspect import read_checkpoint
from kubedevice.kubelet.checkpoint import CheckpointData, CheckpointEntry, dumps

_ID = st.text(alphabet="abcXYZ019-_.:/<>&é", min_size=1, max_size=8)
_IDS = st.one_of(st.none(), st.lists(_ID, max_size=4))
_ENTRY = st.builds(
    CheckpointEntry,
    pod_uid=st.uuids().map(str),
    container=st.text(alphabet="abc-", min_size=1, max_size=5),
    resource=st.sampled_from(["example.com/foo", "nvidia.com/gpu", "b.io/x"]),
    device_ids=st.one_of(st.none(), st.dictionaries(st.integers(-1, 3), _IDS, max_size=3)),
    alloc_resp=st.one_of(st.none(), st.binary(max_size=12)),
)
_DATA = st.builds(
    CheckpointData,
    entries=st.one_of(st.none(), st.lists(_ENTRY, max_size=4).map(tuple)),
    registered=st.one_of(
        st.none(), st.dictionaries(st.sampled_from(["a/b", "B/a", "a.b/c"]), _IDS)
    ),
)


@settings(max_examples=150, deadline=None)
@given(_DATA)
def test_writer_and_reader_agree(data: CheckpointData) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "kubelet_internal_checkpoint"
        path.write_bytes(dumps(data))
        cp = read_checkpoint(path)
    assert cp.checksum_ok, (cp.checksum_file, cp.checksum_computed)
    assert (cp.entries is None) == (data.entries is None)
    for got, want in zip(cp.entries or (), data.entries or (), strict=True):
        assert (got.pod_uid, got.container, got.resource) == (
            want.pod_uid,
            want.container,
            want.resource,
        )
        assert got.devices_per_numa == want.device_ids
    assert cp.registered == data.registered


def test_tampered_content_is_a_mismatch_not_an_error(tmp_path: Path) -> None:
    data = CheckpointData((CheckpointEntry("u", "c", "a/b", {-1: ["x"]}, None),), {"a/b": ["x"]})
    doc = json.loads(dumps(data))
    doc["Data"]["PodDeviceEntries"][0]["DeviceIDs"]["-1"] = ["y"]
    path = tmp_path / "cp"
    path.write_text(json.dumps(doc))
    cp = read_checkpoint(path)
    assert not cp.checksum_ok
    assert cp.entries is not None
    assert cp.entries[0].device_ids == ["y"]


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("{", "not valid JSON"),
        ("[]", "not a JSON object"),
        ('{"Data": 1}', "Data is not an object"),
        ('{"Data": {}, "Checksum": "7"}', "Checksum is not an unsigned integer"),
        ('{"Data": {}, "Checksum": 1' + "0" * 4000 + "}", "Checksum is not an unsigned integer"),
        ('{"Data": {"PodDeviceEntries": [{"DeviceIDs": {"x": []}}]}}', "not a NUMA node number"),
        ('{"Data": {"PodDeviceEntries": [{"AllocResp": "%%"}]}}', "not valid base64"),
        ('{"Data": {"RegisteredDevices": {"a/b": [1]}}}', "not a list of strings"),
    ],
)
def test_corrupt_files_name_the_problem(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "cp"
    path.write_text(text)
    with pytest.raises(CheckpointError, match=needle):
        read_checkpoint(path)

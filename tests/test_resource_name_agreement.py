"""The plugin side and the kubelet side judge resource names identically.

The rule (docs/contract.md#resource-names) is implemented twice on purpose (the SDK refuses
a name before any network call; the emulator answers Register like the kubelet), so a
misreading cannot hide on both sides. This test makes the two independent implementations
agree on generated names.
"""

from __future__ import annotations

from hypothesis import given, settings, strategies as st

import kubedevice
from kubedevice.kubelet.registration import is_extended_resource_name

_LABEL = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,8}[a-z0-9])?", fullmatch=True)
_DOMAIN = st.lists(_LABEL, min_size=1, max_size=4).map(".".join)
_NAME = st.from_regex(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,10}[A-Za-z0-9])?", fullmatch=True)
_NOISE = st.text(alphabet="aZ09-._/ k", max_size=24)


def _sdk_accepts(name: str) -> bool:
    try:
        kubedevice.validate_resource_name(name)
    except kubedevice.InvalidResourceNameError:
        return False
    return True


@settings(max_examples=400, deadline=None)
@given(
    st.one_of(
        st.builds(lambda d, n: f"{d}/{n}", _DOMAIN, _NAME),
        st.builds(lambda d, n: f"requests.{d}/{n}", _DOMAIN, _NAME),
        st.builds(lambda d, n: f"{d}.kubernetes.io/{n}", _DOMAIN, _NAME),
        st.builds(lambda d, n: f"{d.upper()}/{n}", _DOMAIN, _NAME),
        st.builds(lambda d: f"{d}/{'x' * 64}", _DOMAIN),
        st.builds(lambda d: f"{'a' * 250}.{d}/x", _DOMAIN),
        _NOISE,
    )
)
def test_both_sides_agree(name: str) -> None:
    assert _sdk_accepts(name) == is_extended_resource_name(name), name


def test_contract_examples() -> None:
    accepted = ["example.com/gpu", "nvidia.com/GPU"]
    rejected = ["Example.com/gpu", "gpu", "a/b/c", "kubernetes.io/foo", "example.com/-x"]
    for name in accepted:
        assert _sdk_accepts(name)
        assert is_extended_resource_name(name)
    for name in rejected:
        assert not _sdk_accepts(name)
        assert not is_extended_resource_name(name)

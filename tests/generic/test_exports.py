"""The public surface of ``kubedevice.generic`` is complete, sorted and importable."""

from __future__ import annotations

import kubedevice.generic as generic


def test_all_is_sorted_and_resolves() -> None:
    assert generic.__all__ == sorted(generic.__all__)
    for name in generic.__all__:
        assert getattr(generic, name) is not None


def test_entry_points_for_the_demo_and_embedders() -> None:
    assert {"FakeHost", "GenericPlugins", "run_generic", "load_config", "Config"} <= set(
        generic.__all__
    )

"""Evaluate the CEL selectors the drivers' DeviceClasses use, for unit tests.

Only their shape: ``device.driver == "D" && device.attributes["D"].name == "value" && ...``
(anything else fails the test). The real scheduler evaluates the same expressions with CEL in
tests/e2e/test_dra_extended.py.
"""

from __future__ import annotations

import re

from kubedevice.dra import Device

_TERM = re.compile(r'device\.attributes\["([^"]+)"\]\.(\w+) == "([^"]*)"')


def matches(expression: str, driver: str, device: Device) -> bool:
    """Whether ``expression`` selects ``device`` of ``driver``."""
    first, *terms = expression.split(" && ")
    assert first == f'device.driver == "{driver}"', expression
    for term in terms:
        m = _TERM.fullmatch(term)
        assert m is not None, term
        domain, name, value = m.groups()
        assert domain == driver, term
        if str(device.attributes.get(name)) != value:
            return False
    return True

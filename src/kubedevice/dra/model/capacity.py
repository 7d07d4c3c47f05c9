"""Consumable capacity: how much of a shared device's capacity one allocation may take.

A device that allows multiple allocations (``Device.allow_multiple_allocations``) is given
by the scheduler to several claims at once, each allocation a *share* with its own share ID;
the scheduler adds up what the shares consume of each capacity and never lets the sum pass
the capacity's value. A :class:`RequestPolicy` on a capacity says what one share may
consume: a ``default`` (taken when the claim's request names no amount), and either a range
(``min``, optional ``max`` and ``step``; a request is rounded up to ``min`` and then to the
next step) or a list of ``valid_values`` (a request is rounded up to the next one).

:meth:`RequestPolicy.check` applies the API server's own rules for request policies
(``resource.k8s.io/v1``, Kubernetes 1.34+), so a bad policy is a
:class:`~kubedevice.errors.ConfigError` naming device and field here, before anything is
written, rather than a refused ResourceSlice later. Quantities are compared exactly
(:func:`quantity_value`); the step rule uses whole units, as the API server does.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Final

from kubedevice.dra.model.quantity import canonical_quantity, quantity_value
from kubedevice.errors import ConfigError

__all__ = ["MAX_VALID_VALUES", "RequestPolicy", "quantity_value"]

#: resource.k8s.io/v1: at most this many ``validValues`` in one request policy.
MAX_VALID_VALUES: Final = 10


def _whole(value: Fraction) -> int:
    """The quantity in whole units, rounded up (``Quantity.Value()``)."""
    return -(-value.numerator // value.denominator)


@dataclass(frozen=True, slots=True)
class RequestPolicy:
    """What one allocation (share) of a shared device may consume of one capacity.

    Either a range (``min``, with optional ``max`` and ``step``) or ``valid_values``, never
    both; with either, ``default`` is required. ``RequestPolicy(default="1")`` alone is a
    default with no constraint. Values are Kubernetes quantities (``"1Gi"``, ``4``).

    Args:
        default: What a share consumes when the claim's request names no amount.
        min: The least a share consumes (a smaller request is rounded up to it).
        max: The most a share may consume (a larger request cannot have this device).
        step: A request is rounded up to ``min + n * step``.
        valid_values: The amounts a share may consume, ascending, at most 10; a request
            is rounded up to the next one.
    """

    default: str | int | None = None
    min: str | int | None = None
    max: str | int | None = None
    step: str | int | None = None
    valid_values: Sequence[str | int] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "valid_values", tuple(self.valid_values))
        for name in ("default", "min", "max", "step"):
            value = getattr(self, name)
            if value is not None:
                quantity_value(value)  # a clear error for text that is no quantity
        for value in self.valid_values:
            quantity_value(value)

    @property
    def is_range(self) -> bool:
        """Whether this is a range policy (``min``/``max``/``step`` given)."""
        return self.min is not None or self.max is not None or self.step is not None

    def check(self, device: str, capacity: str, value: str | int) -> None:
        """Apply the API server's rules for this policy on capacity ``capacity`` of
        ``device`` (whose value is ``value``).

        Raises:
            ConfigError: A rule is broken; the message names device and field.
        """
        where = f"device {device}: capacity {capacity}: requestPolicy"
        total = quantity_value(value)
        if self.valid_values and self.is_range:
            raise ConfigError(
                f"{where}: validValues and validRange (min/max/step) exclude each other"
            )
        if not self.valid_values and not self.is_range:
            return
        if self.default is None:
            which = "validValues" if self.valid_values else "validRange"
            raise ConfigError(f"{where}.default: required when {which} is given")
        default = quantity_value(self.default)
        if self.valid_values:
            self._check_values(where, default, total)
        else:
            self._check_range(where, default, total)

    def _check_values(self, where: str, default: Fraction, total: Fraction) -> None:
        if len(self.valid_values) > MAX_VALID_VALUES:
            raise ConfigError(
                f"{where}.validValues: {len(self.valid_values)} values; at most {MAX_VALID_VALUES}"
            )
        values = [quantity_value(v) for v in self.valid_values]
        for i, (low, high) in enumerate(itertools.pairwise(values)):
            if low > high:
                raise ConfigError(
                    f"{where}.validValues[{i + 1}]: {self.valid_values[i + 1]} is out of "
                    "order (ascending)"
                )
        seen: set[int] = set()
        for i, value in enumerate(values):
            if _whole(value) in seen:
                raise ConfigError(f"{where}.validValues[{i}]: {self.valid_values[i]} twice")
            seen.add(_whole(value))
            if value > total:
                raise ConfigError(
                    f"{where}.validValues[{i}]: {self.valid_values[i]} is more than the "
                    "capacity's value"
                )
        if default not in values:
            raise ConfigError(f"{where}.default: {self.default} is not one of validValues")

    def _check_range(self, where: str, default: Fraction, total: Fraction) -> None:
        if self.min is None:
            raise ConfigError(f"{where}.validRange.min: required when validRange is given")
        low = quantity_value(self.min)
        if low < 0:
            raise ConfigError(f"{where}.validRange.min: {self.min} is negative")
        if low > total:
            raise ConfigError(f"{where}.validRange.min: {self.min} is more than the capacity")
        if default < low:
            raise ConfigError(f"{where}.default: {self.default} is less than min {self.min}")
        if self.max is not None:
            high = quantity_value(self.max)
            if low > high:
                raise ConfigError(f"{where}.validRange.max: {self.max} is less than min")
            if high > total:
                raise ConfigError(f"{where}.validRange.max: {self.max} is more than the capacity")
            if default > high:
                raise ConfigError(f"{where}.default: {self.default} is more than max {self.max}")
        if self.step is not None:
            step = quantity_value(self.step)
            if _whole(step) <= 0:
                raise ConfigError(f"{where}.validRange.step: {self.step} is not positive")
            if low + step > total:
                raise ConfigError(
                    f"{where}.validRange.step: min + step is more than the capacity's value"
                )
            for name, value in (("default", self.default), ("validRange.max", self.max)):
                if value is None:
                    continue
                if (_whole(quantity_value(value)) - _whole(low)) % _whole(step):
                    raise ConfigError(
                        f"{where}.{name}: {value} is not min ({self.min}) plus a multiple "
                        f"of step ({self.step})"
                    )

    def to_json(self) -> dict[str, Any]:
        """The policy as a ResourceSlice's ``capacity.<name>.requestPolicy`` (JSON), its
        quantities in the API server's canonical form (what it writes back)."""
        out: dict[str, Any] = {}
        if self.default is not None:
            out["default"] = canonical_quantity(str(self.default))
        if self.valid_values:
            out["validValues"] = [canonical_quantity(str(v)) for v in self.valid_values]
        if self.is_range:
            span: dict[str, str] = {}
            for name in ("min", "max", "step"):
                value = getattr(self, name)
                if value is not None:
                    span[name] = canonical_quantity(str(value))
            out["validRange"] = span
        return out

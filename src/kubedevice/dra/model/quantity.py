"""Kubernetes quantities in the API server's canonical form (``1024Mi`` is stored as ``1Gi``).

The API server keeps a quantity's value and its kind of suffix (binary ``Ki``..``Ei``,
decimal ``n``..``E``, or an exponent ``e3``) and writes it back in one canonical way: the
value rounded up to nano units, a binary value below 1024 or not whole shown as decimal,
the largest suffix that keeps the number whole. The publisher sends capacities in that
form, so what it reads back compares equal to what it sent.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Final

from kubedevice.errors import ConfigError

__all__ = ["canonical_quantity", "quantity_value"]

_PATTERN: Final = re.compile(
    r"^(?P<sign>[+-]?)(?P<int>\d*)(?:\.(?P<frac>\d*))?"
    r"(?:(?P<bin>[KMGTPE]i)|(?P<dec>[numkMGTPE])|[eE](?P<exp>[+-]?\d+))?$"
)
#: Digits and exponent a quantity may have: far past what the API server keeps (2^63 - 1
#: nano units) and short of what would take this process seconds and memory to compute
#: exactly ("1e999999999" is a number of a billion digits).
_MAX_DIGITS: Final = 64
_MAX_EXPONENT: Final = 64
_BINARY: Final = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL: Final = {
    "n": -9,
    "u": -6,
    "m": -3,
    "": 0,
    "k": 3,
    "M": 6,
    "G": 9,
    "T": 12,
    "P": 15,
    "E": 18,
}
_DECIMAL_SUFFIX: Final = {exponent: suffix for suffix, exponent in _DECIMAL.items()}
_BINARY_SUFFIX: Final = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"]


def _parse(text: str) -> tuple[Fraction, str, bool]:
    """``text``'s exact value, its kind of suffix (binary, decimal, exponent) and its sign."""
    match = _PATTERN.match(text.strip())
    if match is None or not (match["int"] or match["frac"]):
        raise ConfigError(f"{text[:40]!r} is not a Kubernetes quantity (like 80Gi)")
    digits = (match["int"] or "") + (match["frac"] or "")
    exp_digits = (match["exp"] or "").lstrip("+-").lstrip("0")
    if (
        len(digits) > _MAX_DIGITS
        or len(exp_digits) > 2
        or (exp_digits and int(exp_digits) > _MAX_EXPONENT)
    ):
        raise ConfigError(f"{text[:40]!r} is out of range for a Kubernetes quantity")
    value = Fraction(int(digits or "0"), 10 ** len(match["frac"] or ""))
    if match["bin"]:
        value *= 2 ** _BINARY[match["bin"]]
        kind = "binary"
    elif match["exp"] is not None:
        exponent = int(exp_digits or "0")
        value *= Fraction(10) ** (-exponent if match["exp"].startswith("-") else exponent)
        kind = "exponent"
    else:
        value *= Fraction(10) ** _DECIMAL[match["dec"] or ""]
        kind = "decimal"
    return value, kind, match["sign"] == "-"


def quantity_value(text: str | int) -> Fraction:
    """The exact value of a Kubernetes quantity (``"80Gi"``, ``"1.5k"``, ``"2e3"``, ``8``).

    Raises:
        ConfigError: ``text`` is not a quantity.
    """
    if isinstance(text, int) and not isinstance(text, bool):
        return Fraction(text)
    value, _, negative = _parse(str(text))
    return -value if negative else value


def canonical_quantity(text: str) -> str:
    """``text`` (a quantity) as the API server writes it back.

    Raises:
        ConfigError: ``text`` is not a quantity.
    """
    value, kind, negative = _parse(text)
    # nano precision at most, rounded away from zero
    nanos = value * 10**9
    whole_nanos = -(-nanos.numerator // nanos.denominator)
    if whole_nanos == 0:
        return "0"
    sign = "-" if negative else ""
    if kind == "binary":
        units = Fraction(whole_nanos, 10**9)
        if units < 1024 or units.denominator != 1:
            kind = "decimal"
        else:
            number, power = int(units), 0
            while power < len(_BINARY_SUFFIX) - 1 and number % 1024 == 0:
                number //= 1024
                power += 1
            return f"{sign}{number}{_BINARY_SUFFIX[power]}"
    mantissa, exponent = whole_nanos, -9
    while mantissa % 1000 == 0 and (kind == "exponent" or exponent < 18):
        mantissa //= 1000
        exponent += 3
    if kind == "exponent":
        return f"{sign}{mantissa}" + (f"e{exponent}" if exponent else "")
    return f"{sign}{mantissa}{_DECIMAL_SUFFIX[exponent]}"

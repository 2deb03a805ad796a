"""Quantities written the way people write them: '312 TFLOP/s', '2039 GB/s', '200 Gb/s', '80 GiB', '5 us'.

A small table-driven parser instead of a units library: we need five kinds of quantity, exact bits/bytes
and decimal/binary prefixes, and a one-line error that says what kind of unit was expected. A general
units package (pint) would add ~0.3 s to every cold start for none of that.
"""

from __future__ import annotations

import math
import re

from dlperf.errors import UnitError

DECIMAL = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}
BINARY = {"Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50}
TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9, "min": 60.0, "h": 3600.0}

# kind -> (base unit words, example shown in errors)
KINDS = {
    "flops": ("FLOP", "'2 GFLOP'"),
    "flop_rate": ("FLOP/s", "'312 TFLOP/s'"),
    "bytes": ("B", "'80 GiB'"),
    "bandwidth": ("B/s or b/s", "'300 GB/s' or '200 Gb/s'"),
    "time": ("s", "'5 us'"),
}

# ASCII digits only: `\d` would read '٥ TFLOP/s' (an Arabic-Indic five) as 5.
_NUMBER = r"([-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?)"
_QUANTITY = re.compile(rf"^[ \t]*{_NUMBER}[ \t]*([A-Za-zµ/]*)[ \t]*$")
# Every quantity, in base units, lies in this range: no device, link or model is within 10^20 of either end,
# and inside it no product or quotient the model forms can overflow a float (issue #15: '1e400 TFLOP/s' was
# read as infinity and printed "step time nan ns").
SMALLEST, LARGEST = 1e-30, 1e30


def _prefix_factor(prefix: str) -> float | None:
    if prefix in BINARY:
        return BINARY[prefix]
    return DECIMAL.get(prefix)


def _unit_factor(unit: str, kind: str) -> float | None:
    """Scale from `unit` to the base unit of `kind`, or None when the unit is not of that kind."""
    if kind == "time":
        return TIME_UNITS.get(unit)
    if kind in ("flops", "flop_rate"):
        suffixes = ["FLOP/s", "FLOPS", "flop/s"] if kind == "flop_rate" else ["FLOP", "FLOPs", "flop"]
        for suffix in suffixes:
            if unit.endswith(suffix):
                return _prefix_factor(unit[: -len(suffix)])
        return None
    if kind == "bytes":
        return _prefix_factor(unit[:-1]) if unit.endswith("B") else None
    if kind == "bandwidth":
        for suffix, scale in (("B/s", 1.0), ("b/s", 0.125), ("bps", 0.125)):
            if unit.endswith(suffix):
                factor = _prefix_factor(unit[: -len(suffix)])
                return None if factor is None else factor * scale
        return None
    raise ValueError(f"unknown quantity kind {kind!r}")


def parse_quantity(value: object, kind: str) -> float:
    """Parse a quantity string into base units (FLOP, FLOP/s, bytes, bytes/s, seconds).

    Raises UnitError (without location; callers add file/line/field) when the text is not a positive
    number followed by a unit of the requested kind.
    """
    expected = f"a positive {kind.replace('_', ' ')} such as {KINDS[kind][1]}"
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise UnitError(expected=expected, found=value)
    if isinstance(value, (int, float)):
        if kind == "bytes" and value > 0:
            return _in_range(value, value, expected)
        raise UnitError(expected=expected + " (with its unit)", found=value)
    match = _QUANTITY.match(value)
    if not match:
        raise UnitError(expected=expected, found=value)
    number, unit = float(match.group(1)), match.group(2)
    factor = _unit_factor(unit, kind) if unit else (1.0 if kind == "bytes" else None)
    if factor is None:
        raise UnitError(expected=expected, found=value)
    if not number > 0:
        raise UnitError(expected=expected, found=value)
    return _in_range(number * factor, value, expected)


def _in_range(number: float, found: object, expected: str) -> float:
    try:
        number = float(number)
    except OverflowError:  # an integer of 400 digits
        number = math.inf
    if not SMALLEST <= number <= LARGEST:  # also false for NaN and infinity
        raise UnitError(expected=f"{expected}, between 1e-30 and 1e30 in base units (units.LARGEST)",
                        found=found)
    return number


def format_quantity(value: float, kind: str, digits: int = 4) -> str:
    """Inverse of parse_quantity, with decimal prefixes (binary for bytes): 3e14 -> '300 TFLOP/s'."""
    unit = {"flops": "FLOP", "flop_rate": "FLOP/s", "bytes": "B", "bandwidth": "B/s", "time": "s"}[kind]
    if kind == "time":
        for name, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9)):
            if abs(value) >= scale or name == "ns":
                return f"{value / scale:.{digits}g} {name}"
    if kind == "bytes":
        for name in ("Pi", "Ti", "Gi", "Mi", "Ki"):
            if abs(value) >= BINARY[name]:
                return f"{value / BINARY[name]:.{digits}g} {name}{unit}"
        return f"{value:.{digits}g} {unit}"
    for name in ("E", "P", "T", "G", "M", "k"):
        if abs(value) >= DECIMAL[name]:
            return f"{value / DECIMAL[name]:.{digits}g} {name}{unit}"
    return f"{value:.{digits}g} {unit}"

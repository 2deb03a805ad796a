"""Arithmetic helpers that work on floats, numpy arrays and sympy expressions alike.

Cost formulas are written once with these, so the same function gives a closed form (sympy), a number
(float) or a whole grid of plans at once (numpy), which is what search and sweep rely on.
"""

from __future__ import annotations

import math
import sys
from typing import Any


def _is_array(x: Any) -> bool:
    """numpy arrays without importing numpy: if one exists here, numpy is already loaded."""
    return type(x).__module__ == "numpy" and type(x).__name__ == "ndarray"


def _np() -> Any:
    return sys.modules["numpy"]


def _is_sympy(*values: Any) -> bool:
    return any(type(v).__module__.startswith("sympy") for v in values)


def log2(x: Any) -> Any:
    if _is_sympy(x):
        import sympy

        return sympy.log(x, 2)
    if _is_array(x):
        return _np().log2(x)
    return math.log2(x)


def ceil(x: Any) -> Any:
    if _is_sympy(x):
        import sympy

        return sympy.ceiling(x)
    if _is_array(x):
        return _np().ceil(x)
    return math.ceil(x)


def _fold(xs: tuple[Any, ...], symbolic: str, elementwise: str, scalar: Any) -> Any:
    """Max or min of several values in whichever world they live in (sympy, numpy or plain numbers)."""
    if _is_sympy(*xs):
        import sympy

        return getattr(sympy, symbolic)(*xs)
    if any(_is_array(x) for x in xs):
        out = xs[0]
        for x in xs[1:]:
            out = getattr(_np(), elementwise)(out, x)
        return out
    return scalar(xs)


_PLAIN = (int, float)


def maximum(*xs: Any) -> Any:
    if all(type(x) in _PLAIN for x in xs):  # the common case in search: plain numbers, no type dispatch
        return max(xs)
    return _fold(xs, "Max", "maximum", max)


def minimum(*xs: Any) -> Any:
    if all(type(x) in _PLAIN for x in xs):
        return min(xs)
    return _fold(xs, "Min", "minimum", min)


def is_zero(value: Any) -> bool:
    """A plain number equal to zero (arrays and expressions are never 'zero' here: they carry work)."""
    return isinstance(value, (int, float)) and value == 0


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def where(cond: Any, a: Any, b: Any) -> Any:
    """cond ? a : b elementwise for arrays, a Piecewise for sympy, plain branch for scalars."""
    if _is_array(cond) or _is_array(a) or _is_array(b):
        return _np().where(cond, a, b)
    if _is_sympy(cond, a, b):
        import sympy

        return sympy.Piecewise((a, cond), (b, True))
    return a if cond else b

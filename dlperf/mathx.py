"""Arithmetic helpers that work on floats, numpy arrays and sympy expressions alike.

Cost formulas are written once with these, so the same function gives a closed form (sympy), a number
(float) or a whole grid of plans at once (numpy), which is what search and sweep rely on.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def _is_sympy(*values: Any) -> bool:
    return any(type(v).__module__.startswith("sympy") for v in values)


def log2(x: Any) -> Any:
    if _is_sympy(x):
        import sympy

        return sympy.log(x, 2)
    if isinstance(x, np.ndarray):
        return np.log2(x)
    return math.log2(x)


def ceil(x: Any) -> Any:
    if _is_sympy(x):
        import sympy

        return sympy.ceiling(x)
    if isinstance(x, np.ndarray):
        return np.ceil(x)
    return math.ceil(x)


def maximum(*xs: Any) -> Any:
    if _is_sympy(*xs):
        import sympy

        return sympy.Max(*xs)
    if any(isinstance(x, np.ndarray) for x in xs):
        out = xs[0]
        for x in xs[1:]:
            out = np.maximum(out, x)
        return out
    return max(xs)


def minimum(*xs: Any) -> Any:
    if _is_sympy(*xs):
        import sympy

        return sympy.Min(*xs)
    if any(isinstance(x, np.ndarray) for x in xs):
        out = xs[0]
        for x in xs[1:]:
            out = np.minimum(out, x)
        return out
    return min(xs)


def where(cond: Any, a: Any, b: Any) -> Any:
    """cond ? a : b elementwise for arrays, plain branch for scalars."""
    if isinstance(cond, np.ndarray) or isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.where(cond, a, b)
    return a if cond else b

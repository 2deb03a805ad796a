"""Safe arithmetic expressions for spec fields ('4*hidden', 'hidden // heads'), parsed with `ast`, never eval.

Values are ints where everything is known, sympy expressions where a name is left symbolic (`null` params).
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable, Mapping
from typing import Any

from dlperf.errors import SpecError

# Every whole number an expression meets is at most MAX_INT in size, checked before the operation that would
# make it (issue #15: '((2**64)**64)**64' or repeated squaring must not build a million-digit integer). 2**53 is
# also the largest range in which a float holds every integer, and no layer dimension comes near it.
MAX_INT = 2**53


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _bounded(value: Any, text: str) -> Any:
    if _is_int(value) and abs(value) > MAX_INT:
        raise SpecError(expected=f"whole numbers of at most 2**53 (expr.MAX_INT) in {_clip(text)}",
                        found="a larger intermediate value")
    return value


def _clip(text: str) -> str:
    return repr(text if len(text) <= 60 else text[:57] + "...")


def _guard_pow(base: Any, exponent: Any, text: str) -> None:
    """Refuse a power before computing it when its exponent is not a small natural number, or when the result
    would exceed MAX_INT (the bit length of base**n is about n times that of the base)."""
    if not _is_int(exponent) or not 0 <= exponent <= 64:
        raise SpecError(expected="a whole exponent from 0 to 64 (a negative one would give a fraction)",
                        found=text)
    if _is_int(base) and abs(base) > 1 and (abs(base).bit_length() - 1) * exponent > MAX_INT.bit_length():
        raise SpecError(expected=f"whole numbers of at most 2**53 (expr.MAX_INT) in {_clip(text)}",
                        found="a power beyond it")


def _guard_mul(a: Any, b: Any, text: str) -> None:
    if _is_int(a) and _is_int(b) and abs(a).bit_length() + abs(b).bit_length() > MAX_INT.bit_length() + 1:
        raise SpecError(expected=f"whole numbers of at most 2**53 (expr.MAX_INT) in {_clip(text)}",
                        found="a product beyond it")


def _div(a: Any, b: Any) -> Any:
    if _is_int(a) and _is_int(b):
        if b == 0 or a % b:
            raise SpecError(f"{a} / {b} is not a whole number", expected="an exact division (or use //)")
        return a // b
    return a / b


def _floordiv(a: Any, b: Any) -> Any:
    if _is_int(a) and _is_int(b):
        if b == 0:
            raise SpecError("division by zero")
        return a // b
    import sympy

    return sympy.floor(a / b)


def _one(fn: Callable) -> Callable:
    def apply(*args: Any) -> Any:
        if len(args) != 1:
            raise SpecError(f"{fn.__name__.strip('_')}() takes one argument", found=len(args))
        return fn(args[0])

    apply.__name__ = fn.__name__
    return apply


def _ceil(x: Any) -> Any:
    if _is_int(x):
        return x
    import sympy

    return sympy.ceiling(x)


def _floor(x: Any) -> Any:
    if _is_int(x):
        return x
    import sympy

    return sympy.floor(x)


def _minmax(fn: Callable, symbolic: str) -> Callable:
    def apply(*args: Any) -> Any:
        if all(_is_int(a) for a in args):
            return fn(args)
        import sympy

        return getattr(sympy, symbolic)(*args)

    return apply


_BINARY = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: _div,
    ast.FloorDiv: _floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
}
_FUNCTIONS = {"min": _minmax(min, "Min"), "max": _minmax(max, "Max"), "ceil": _one(_ceil), "floor": _one(_floor)}
MAX_EXPRESSION_LENGTH = 200


def evaluate(text: str, names: Mapping[str, Any]) -> Any:
    """Evaluate an arithmetic expression over `names`; raise SpecError naming what is wrong."""
    if len(text) > MAX_EXPRESSION_LENGTH:
        raise SpecError(expected=f"an expression of at most {MAX_EXPRESSION_LENGTH} characters", found=text)
    if not text.isascii():  # Python folds identifiers by NFKC: a full-width 'ｈ' would silently mean 'h'
        raise SpecError(expected="an ASCII arithmetic expression", found=text)
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise SpecError(expected="an arithmetic expression", found=text) from None
    try:
        return _eval(tree.body, names, text)
    except (ArithmeticError, TypeError, ValueError, RecursionError) as err:  # e.g. sympy on a symbolic operand
        raise SpecError(f"cannot evaluate ({type(err).__name__})", expected="an arithmetic expression",
                        found=text) from None


def _eval(node: ast.AST, names: Mapping[str, Any], text: str) -> Any:
    if isinstance(node, ast.Constant) and _is_int(node.value):
        return _bounded(node.value, text)
    if isinstance(node, ast.Name):
        if node.id not in names:
            raise SpecError(f"undefined name {node.id!r} in {text!r}", expected="a defined param or block arg")
        return names[node.id]
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left, names, text), _eval(node.right, names, text)
        if isinstance(node.op, ast.Pow):
            _guard_pow(left, right, text)
        if isinstance(node.op, ast.Mult):
            _guard_mul(left, right, text)
        if isinstance(node.op, (ast.Mod, ast.FloorDiv, ast.Div)) and _is_int(right) and right == 0:
            raise SpecError("division by zero", found=text)
        return _bounded(_BINARY[type(node.op)](left, right), text)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _eval(node.operand, names, text)
        return -value if isinstance(node.op, ast.USub) else value
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS
            and not node.keywords and node.args and not any(isinstance(a, ast.Starred) for a in node.args)):
        return _bounded(_FUNCTIONS[node.func.id](*(_eval(a, names, text) for a in node.args)), text)
    raise SpecError(expected="numbers, names, + - * / // % **, min, max, ceil, floor", found=text)

"""Safe arithmetic expressions for spec fields ('4*hidden', 'hidden // heads'), parsed with `ast`, never eval.

Values are ints where everything is known, sympy expressions where a name is left symbolic (`null` params).
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable, Mapping
from typing import Any

from dlperf.errors import SpecError


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


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
_FUNCTIONS = {"min": _minmax(min, "Min"), "max": _minmax(max, "Max"), "ceil": _ceil, "floor": _floor}
MAX_EXPRESSION_LENGTH = 200


def evaluate(text: str, names: Mapping[str, Any]) -> Any:
    """Evaluate an arithmetic expression over `names`; raise SpecError naming what is wrong."""
    if len(text) > MAX_EXPRESSION_LENGTH:
        raise SpecError(expected=f"an expression of at most {MAX_EXPRESSION_LENGTH} characters", found=text)
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError:
        raise SpecError(expected="an arithmetic expression", found=text) from None
    return _eval(tree.body, names, text)


def _eval(node: ast.AST, names: Mapping[str, Any], text: str) -> Any:
    if isinstance(node, ast.Constant) and _is_int(node.value):
        return node.value
    if isinstance(node, ast.Name):
        if node.id not in names:
            raise SpecError(f"undefined name {node.id!r} in {text!r}", expected="a defined param or block arg")
        return names[node.id]
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left, names, text), _eval(node.right, names, text)
        if isinstance(node.op, ast.Pow) and (not _is_int(right) or abs(right) > 64):
            raise SpecError(expected="a small integer exponent", found=text)
        if isinstance(node.op, ast.Mod) and _is_int(right) and right == 0:
            raise SpecError("modulo by zero", found=text)
        return _BINARY[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _eval(node.operand, names, text)
        return -value if isinstance(node.op, ast.USub) else value
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS
            and not node.keywords and node.args):
        return _FUNCTIONS[node.func.id](*(_eval(a, names, text) for a in node.args))
    raise SpecError(expected="numbers, names, + - * / // % **, min, max, ceil, floor", found=text)

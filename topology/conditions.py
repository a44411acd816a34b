"""Edge conditions (``when``) of workflow graphs: a tiny expression language, never ``eval``-ed.

Conditions are a tiny expression language over state keys, parsed with :mod:`ast` and never
``eval``-ed: names (a missing key is ``None``), constants, ``not``/``and``/``or``,
comparisons (``==``, ``!=``, ``<``, ``<=``, ``>``, ``>=``, ``in``, ``not in``) and
``len(x)``; e.g. ``"error"``, ``"not rows"``, ``"votes < 2 and not error"``. Odd values:
``None`` (a missing key) is empty: ``len(None)`` is 0, ``x in None`` is False and
``x not in None`` True (as ``not (x in None)``); a comparison that cannot be made (``None < 3``,
``1 in 5``, ``len(5) > 0``: a number has no length) is False; ``len()`` of a value without a
length is false on its own (``len(5)`` does not hold, ``not len(5)`` does). Any other failure
(e.g. a value whose truth is ambiguous) raises, and the runtime names the edge.
"""

from __future__ import annotations

import ast
import operator as _op
from collections.abc import Mapping
from typing import Any

_CMP = {
    ast.Eq: _op.eq,
    ast.NotEq: _op.ne,
    ast.Lt: _op.lt,
    ast.LtE: _op.le,
    ast.Gt: _op.gt,
    ast.GtE: _op.ge,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
}


class _Undefined:
    """``len()`` of a value without a length: false, and no comparison with it holds."""

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "<no length>"


_UNDEFINED = _Undefined()


def compile_condition(text: str) -> ast.Expression:
    """Parse a ``when`` expression; raise ValueError naming what is not allowed."""
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as e:
        raise ValueError(f"condition {text!r} is not an expression: {e.msg}") from None
    for node in ast.walk(tree):
        ok = isinstance(
            node,
            (
                ast.Expression,
                ast.Name,
                ast.Constant,
                ast.BoolOp,
                ast.And,
                ast.Or,
                ast.UnaryOp,
                ast.Not,
                ast.Compare,
                ast.Load,
                ast.Tuple,
                ast.List,
                *tuple(_CMP),
            ),
        )
        if isinstance(node, ast.Call):
            ok = isinstance(node.func, ast.Name) and node.func.id == "len" and len(node.args) == 1 and not node.keywords
        if not ok:
            raise ValueError(
                f"condition {text!r}: {type(node).__name__} is not allowed; use state keys, constants, "
                "not/and/or, comparisons and len()"
            )
    return tree


def condition_holds(text: str | None, state: Mapping[str, Any]) -> bool:
    """Evaluate a ``when`` expression on ``state`` (missing keys are None); None holds."""
    if text is None:
        return True
    return bool(_eval(compile_condition(text).body, state))


def _eval(node: ast.AST, state: Mapping[str, Any]) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return {"True": True, "False": False, "None": None}.get(node.id, state.get(node.id))
    if isinstance(node, (ast.Tuple, ast.List)):
        return tuple(_eval(x, state) for x in node.elts)
    if isinstance(node, ast.UnaryOp):
        return not _eval(node.operand, state)
    if isinstance(node, ast.BoolOp):
        vals = (_eval(v, state) for v in node.values)
        return all(vals) if isinstance(node.op, ast.And) else any(vals)
    if isinstance(node, ast.Call):
        v = _eval(node.args[0], state)
        if v is None:
            return 0
        try:
            return len(v)
        except TypeError:  # a number has no length
            return _UNDEFINED
    if isinstance(node, ast.Compare):
        left = _eval(node.left, state)
        for op, comp in zip(node.ops, node.comparators):
            right = _eval(comp, state)
            if left is _UNDEFINED or right is _UNDEFINED:
                return False
            if right is None and isinstance(op, (ast.In, ast.NotIn)):  # a missing container holds nothing
                ok = isinstance(op, ast.NotIn)
            else:
                try:
                    ok = _CMP[type(op)](left, right)
                except TypeError:  # None < 3 and the like: the comparison does not hold
                    return False
            if not ok:
                return False
            left = right
        return True
    raise ValueError(f"cannot evaluate {type(node).__name__}")


__all__ = ["compile_condition", "condition_holds"]

"""A calculator tool that evaluates arithmetic without `eval`.

The expression is parsed with `ast` and walked over a whitelist of node types, so attribute
access, calls to anything but a few `math` functions, names, comprehensions and the like are
rejected before anything runs. Size limits bound the work: the source length, the number of AST
nodes, exponents and the magnitude of every intermediate result (so `9**9**9` is refused
instantly instead of blocking the event loop).

It runs on the event loop, so every operation's cost is bounded before it runs: operands never
exceed `max_magnitude`, `**` is refused when its result would, and the arguments that make a
function's work grow with their value (not their size) are capped: `factorial`, `comb`, `perm`,
and `round`'s digits (`round(1, -10**7)` computes 10^(10^7)).
"""

from __future__ import annotations

import ast
import math
import operator
from dataclasses import dataclass
from typing import Any, Callable


class CalculatorError(ValueError):
    """The expression is not allowed or cannot be evaluated; the message says why."""


@dataclass(frozen=True)
class CalculatorLimits:
    """Bounds on the work one expression may cause."""

    # Longest accepted expression, in characters.
    max_chars: int = 200
    # Most AST nodes in the parsed expression.
    max_nodes: int = 64
    # Largest absolute exponent allowed in `a ** b`.
    max_exponent: int = 128
    # Largest absolute value of any intermediate or final result.
    max_magnitude: float = 1e100


_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type, Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_FUNCTIONS: dict[str, Callable[..., Any]] = {
    name: getattr(math, name)
    for name in (
        "sqrt", "exp", "log", "log10", "log2", "sin", "cos", "tan", "asin", "acos", "atan",
        "floor", "ceil", "fabs", "factorial", "gcd", "lcm", "comb", "perm",
    )
}
_FUNCTIONS.update({"abs": abs, "round": round, "min": min, "max": max})
_CONSTANTS: dict[str, float] = {"pi": math.pi, "e": math.e, "tau": math.tau}
# Arguments above which these functions do unbounded work: (cap, which arguments; None: all).
_ARGUMENT_CAPS: dict[str, tuple[int, slice]] = {
    "factorial": (170, slice(None)), "comb": (10_000, slice(None)), "perm": (10_000, slice(None)),
    # round(x, n) with n < 0 computes 10**-n; past 400 digits every number up to 1e100 rounds to 0.
    "round": (400, slice(1, None)),
}


def evaluate(expression: str, limits: CalculatorLimits = CalculatorLimits()) -> int | float:
    """Evaluate an arithmetic expression; raise `CalculatorError` with the reason if refused.

    Accepts numbers, `+ - * / // % **`, parentheses, `pi`/`e`/`tau` (bare or as `math.pi`) and a
    few `math` functions (`sqrt(2)` or `math.sqrt(2)`). Integral float results are returned as int.
    """
    if not isinstance(expression, str):
        raise CalculatorError("expression must be a string")
    if len(expression) > limits.max_chars:
        raise CalculatorError(f"expression longer than {limits.max_chars} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError) as err:
        raise CalculatorError(f"not an arithmetic expression: {err.msg if isinstance(err, SyntaxError) else err}") from None
    if sum(1 for _ in ast.walk(tree)) > limits.max_nodes:
        raise CalculatorError(f"expression has more than {limits.max_nodes} parts")
    try:
        value = _Evaluator(limits).visit(tree.body)
    except CalculatorError:
        raise
    except (ArithmeticError, ValueError, TypeError, OverflowError) as err:
        raise CalculatorError(f"{type(err).__name__}: {err}") from None
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    return value


class _Evaluator:
    def __init__(self, limits: CalculatorLimits) -> None:
        self.limits = limits

    def visit(self, node: ast.AST) -> int | float:
        value = self._visit(node)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise CalculatorError("result is not a number")
        if isinstance(value, float) and not math.isfinite(value):
            raise CalculatorError("result is not finite")
        if abs(value) > self.limits.max_magnitude:
            raise CalculatorError(f"result magnitude above {self.limits.max_magnitude:g}")
        return value

    def _visit(self, node: ast.AST) -> int | float:
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left, right = self.visit(node.left), self.visit(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > self.limits.max_exponent:
                raise CalculatorError(f"exponent above {self.limits.max_exponent}")
            if isinstance(node.op, ast.Pow) and isinstance(left, int) and isinstance(right, int):
                # Bound the result's size before computing it: |a| ** b has ~b*log10|a| digits.
                if left not in (0, 1, -1) and right > 0 and right * math.log10(abs(left)) > math.log10(self.limits.max_magnitude):
                    raise CalculatorError(f"result magnitude above {self.limits.max_magnitude:g}")
            return _BINARY[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            return _UNARY[type(node.op)](self.visit(node.operand))
        name = _dotted_name(node)
        if name is not None and name in _CONSTANTS:
            return _CONSTANTS[name]
        if isinstance(node, ast.Call) and not node.keywords:
            func = _dotted_name(node.func)
            if func in _FUNCTIONS:
                args = [self.visit(arg) for arg in node.args]
                cap, which = _ARGUMENT_CAPS.get(func, (None, slice(0)))
                if cap is not None and any(abs(a) > cap for a in args[which]):
                    raise CalculatorError(f"{func} argument above {cap}" if which == slice(None) else f"{func}'s digits above {cap}")
                return _FUNCTIONS[func](*args)
            raise CalculatorError(f"function not allowed: {func or ast.dump(node.func)[:40]}")
        raise CalculatorError(f"not allowed in an arithmetic expression: {type(node).__name__}")


def _dotted_name(node: ast.AST) -> str | None:
    """`sqrt` or `math.sqrt` -> `sqrt`; anything else -> None."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "math":
        return node.attr
    return None
